"""Change events (Kafka, Debezium, event files) into Delta replicas under the sequence guard: the pure
plan of a batch, the guarded MERGE executor, the replica's column types and the dead-letter table;
and, with ``history: scd2``, the history (SCD type 2) planner and executor."""
