"""Pause, resume and resync of an event source, through the supervisor's commands (what the HTTP API
and ``lakemirror pause|resume|resync events:<name>`` queue), against the session's real Kafka broker:

- a paused source applies nothing, still reports its backlog, and stays paused in a restarted daemon;
- resume applies what came meanwhile;
- resync replays the topic from its earliest offsets under a fresh checkpoint and a new epoch: the
  replica stays the ordered fold of the events (the guard skips what it holds, a late older insert
  stays deleted) and no poison message becomes a second dead letter;
- a resync after retention removed events the replica never took is refused: the source goes to
  ``failed`` with the reason and what to do, and its checkpoint is kept.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.guard_plan import POSITION_COLUMN, ordered_fold
from lakemirror.sources.change_event import ChangeEvent
from lakemirror.sources.debezium import decode_debezium
from lakemirror.supervisor.events.stream_runner import checkpoint_end_offsets
from tests.integration.test_kafka_source import envelope

pytestmark = pytest.mark.integration


class Topic:
    def __init__(self, servers: str, name: str, partitions: int) -> None:
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic

        self.admin = KafkaAdminClient(bootstrap_servers=servers)
        self.admin.create_topics([NewTopic(name, partitions, 1)])
        self.name = name
        self.producer = KafkaProducer(bootstrap_servers=servers)
        self.sent: list[tuple[str | None, str | None]] = []
        self.ends: dict[tuple[str, int], int] = {}

    def send(self, partition: int, key: dict[str, Any] | None, value: dict[str, Any] | str | None) -> None:
        k = None if key is None else json.dumps(key)
        v = value if isinstance(value, str) or value is None else json.dumps(value)
        meta = self.producer.send(self.name, key=None if k is None else k.encode(),
                                  value=None if v is None else v.encode(), partition=partition).get(timeout=30)
        self.sent.append((k, v))
        self.ends[(self.name, partition)] = meta.offset + 1

    def change(self, partition: int, op: str, lsn: int, i: int, balance: int | None = None) -> None:
        self.send(partition, {"id": i}, envelope(op, lsn, {"id": i}, None if balance is None else {"balance": balance},
                                                 "items"))
        if op == "d":
            self.send(partition, {"id": i}, None)

    def expected(self) -> dict[Any, Any]:
        events = [e for e in (decode_debezium(v, k) for k, v in self.sent) if isinstance(e, ChangeEvent)]
        return {key[0]: row["balance"] for key, row in ordered_fold(events).items()}

    def forget_all(self) -> None:
        """Retention, at once: every partition's log now starts at its end."""
        from kafka import TopicPartition

        self.admin.delete_records({TopicPartition(t, p): end for (t, p), end in self.ends.items()})


def test_an_event_source_pauses_resumes_and_resyncs(make_pipeline: Any, broker: str) -> None:
    topic = Topic(broker, f"pr{uuid.uuid4().hex[:6]}.public.items", 2)
    topic.change(0, "c", 10, 1, 100)
    topic.change(1, "c", 11, 2, 200)
    topic.send(0, None, "not an envelope")                 # poison: one dead letter
    topic.change(0, "d", 20, 2)
    topic.change(1, "c", 15, 2, 150)                       # older than the delete, later in the topic
    topic.change(1, "u", 30, 1, 101)
    name = "events:pr"
    p = make_pipeline(source={"kind": "kafka", "name": "pr", "bootstrap_servers": broker, "topics": [topic.name],
                              "max_per_trigger": 3})
    replica = p.app.catalog.locate(TableName("dst", "sales", "items"))
    letters = p.app.catalog.locate(TableName("dst", "sales", "_lakemirror_dead_letters_pr"))

    def rows() -> dict[Any, Any]:
        if not tables.exists(p.spark, replica):
            return {}
        return {r["id"]: r["balance"] for r in tables.read(p.spark, replica).drop(POSITION_COLUMN).collect()}

    def dead_letters() -> list[tuple[str, int, int]]:
        if not tables.exists(p.spark, letters):
            return []
        return sorted((r["origin"], r["partition"], r["offset"]) for r in tables.read(p.spark, letters).collect())

    def state() -> str | None:
        view = p.views().get(name)
        return view.state if view is not None else None

    def committed() -> dict[tuple[str, int], int]:
        return checkpoint_end_offsets(p.runner(name).folder / "checkpoint")

    p.start()
    p.tick_until(lambda: committed() == topic.ends, timeout=300, what="the first events")
    assert rows() == topic.expected() == {1: 101}
    assert dead_letters() == [(topic.name, 0, 1)]

    # pause: nothing applied, the backlog still measured; kept across a restart
    assert p.app.supervisor.command("pause", name)
    p.tick_until(lambda: state() == "paused", what="paused")
    topic.change(1, "c", 40, 3, 300)
    p.tick_until(lambda: (p.views()[name].versions_behind or 0) >= 1, what="the backlog seen while paused")
    p.restart()
    p.tick_until(lambda: state() == "paused", what="paused after a restart")
    p.tick_until(lambda: (p.views()[name].versions_behind or 0) >= 1, what="the backlog after the restart")
    assert rows() == {1: 101} and committed() != topic.ends

    # resume: what came meanwhile is applied
    assert p.app.supervisor.command("resume", name)
    p.tick_until(lambda: committed() == topic.ends and state() == "running", timeout=300, what="resumed")
    assert rows() == topic.expected() == {1: 101, 3: 300}

    # resync: a fresh checkpoint and epoch replay the topic from offset 0; the guard keeps the replica
    folder = p.runner(name).folder
    epoch = (folder / "epoch").read_text()
    assert p.app.supervisor.command("resync", name)
    p.tick_until(lambda: (folder / "epoch").read_text() != epoch and committed() == topic.ends,
                 timeout=300, what="the replay of the whole topic")
    replayed = len([f for f in (folder / "checkpoint" / "commits").iterdir() if f.name.isdigit()])
    assert replayed * 3 >= sum(topic.ends.values()), f"{replayed} batches of 3 cannot have replayed the topic"
    assert rows() == topic.expected() == {1: 101, 3: 300}
    assert dead_letters() == [(topic.name, 0, 1)]  # the replayed poison message is not recorded twice
    assert state() == "running"

    # retention removed events the replica never took: the resync is refused, the checkpoint kept
    assert p.app.supervisor.command("pause", name)
    p.tick_until(lambda: state() == "paused", what="paused again")
    topic.change(0, "c", 50, 4, 400)
    topic.forget_all()
    kept = committed()
    assert p.app.supervisor.command("resync", name)
    p.tick_until(lambda: state() == "failed", what="the refused resync")
    error = p.views()[name].last_error or ""
    assert "resync refused" in error and f"{topic.name}-0 starts at offset" in error, error
    assert str(folder / "checkpoint") in error and committed() == kept
    assert rows() == {1: 101, 3: 300}

