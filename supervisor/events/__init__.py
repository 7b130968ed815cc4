"""Event sources (Kafka topics, JSON-lines files; Debezium and simple CDC events) into their
replicas.

- :mod:`.stream_runner`: one streaming query per event source, fanned out to its replicas;
- :mod:`.batch_apply`: a batch decoded, routed and applied under the sequence guard, one write per replica;
- :mod:`.dead_letters`: poison events isolated, skipped or replayed on the operator's word;
- :mod:`.status_record`: what an event source keeps about itself across restarts.
"""
