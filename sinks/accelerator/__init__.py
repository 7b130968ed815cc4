"""The local accelerator: change batches applied on the driver to replicas on a local disk (a
delta-rs MERGE, or deletion vectors written by the driver), with the log, file and key readers they
need. Chosen per replica by :mod:`lakemirror.sinks.merge.apply_choice`; never taken on object storage
or over Spark Connect."""
