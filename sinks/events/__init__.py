"""Change events (Kafka, Debezium, event files) into Delta replicas under the sequence guard: the pure
plan of a batch, the guarded MERGE executor, the replica's column types and the dead-letter table;
and, with ``history: scd2``, the history (SCD type 2) planner and executor.

The event sink the event runner is handed for Delta replicas (:mod:`.delta_sink`) and for their
in-memory twins (:mod:`.memory_sink`) is :class:`.guarded_sink.EventBatchApplier`: a batch routed by
table, folded per key and written once per replica, poison changes isolated and the operator's skip
and replay carried out (:mod:`.letter_resolution`)."""
