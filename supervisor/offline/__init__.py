"""What a pipeline and its replicas recorded, read without Spark.

- :mod:`.recorded_tables`: every table as the pipeline recorded it, for a starting daemon and `lakemirror status`;
- :mod:`.replica_transactions`: the batches a replica's own log records as applied, and the versions they brought.
"""
