"""Event sources (Kafka topics, JSON-lines files; Debezium and simple CDC events) into their
replicas, as the runner sees them: the query, its lifecycle and its status. Where the changes go is
the source's event sink (:mod:`lakemirror.sinks.event_contract`; the guarded sink of Delta replicas
and their twins is :mod:`lakemirror.sinks.events.guarded_sink`).

- :mod:`.stream_runner`: one streaming query per event source, its batches handed to the event sink;
- :mod:`.stream_spec`: what one event source's query is;
- :mod:`.dead_letters`: the dead letters a source holds, counted for status and metrics;
- :mod:`.status_record`: what an event source keeps about itself across restarts.
"""
