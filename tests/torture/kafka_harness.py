"""Crash torture of an event source: Debezium events from Kafka into Delta, the daemon killed at the
named points of the event batch path (``supervisor/events/stream_runner.py: EVENT_FAULT_POINTS``), then the proof.

A seeded producer writes Debezium envelopes (Postgres connector, JSON converter without schemas) for
two tables into topics of several partitions, chunk by chunk: inserts, updates, deletes and
re-inserts of a few keys, each with its own log position (``lsn``), and the disorder the sequence
guard exists for:

- one key's changes spread over partitions (Kafka orders a partition, never a topic), so a batch
  and the batches after it see them out of order;
- redeliveries: events sent again, in the same chunk and in later ones;
- a delete, then a late older insert of the same key in a later chunk (the tombstone must hold it off);
- the tombstone (null value) Debezium writes after each delete, and one poison message per chunk.

Before each daemon start a new chunk is produced, then the daemon runs with
``LAKEMIRROR_TEST_KILL_AT`` set to the next point and SIGKILLs itself there; a last daemon catches
up (its query checkpoint has committed every produced offset) and drains on SIGTERM. :meth:`verify`
then checks that each replica equals the ordered fold of every distinct event sent
(:func:`lakemirror.sinks.events.guard_plan.ordered_fold`; with ``history="scd2"``, every key's versions
equal :func:`lakemirror.sinks.events.history_plan.history_fold`), that every poison message is a dead letter
exactly once, and that no Delta transaction was committed twice to a replica or its tombstones.

Used by tests/e2e/test_kafka_torture.py.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.guard_merge import tombstones_of
from lakemirror.sinks.events.guard_plan import POSITION_COLUMN, ordered_fold, row_order
from lakemirror.sinks.events.history_plan import (
    END_POSITION_COLUMN, HISTORY_CURRENT, HISTORY_SCD2, IS_CURRENT, VALID_FROM, VALID_TO, history_fold,
)
from lakemirror.sinks.txn import is_txn_tag
from lakemirror.sources.catalog import LocalCatalog
from lakemirror.sources.change_event import ChangeEvent, DeadLetter
from lakemirror.sources.event_stream import EventDecoder, RawEvent
from lakemirror.supervisor.events.stream_runner import checkpoint_end_offsets
from tests.torture.harness import DAEMON_JVM_OPTIONS, DaemonProcess, KillRecord

#: Every named point of the event path once, then a replica's MERGE reached a second time (the
#: second replica of a batch, or the next batch): a kill between two replicas of one batch.
EVENT_POINTS = ("events_before_merge", "events_after_replica_merge", "events_before_dead_letters",
                "events_after_dead_letters", "events_after_replica_merge:2")
#: The same with history (``history: scd2``), whose replicas remember a batch's closes before their
#: MERGE: a kill between the two commits as well.
HISTORY_POINTS = ("events_before_merge", "events_after_closes", "events_after_replica_merge",
                  "events_before_dead_letters", "events_after_dead_letters", "events_after_replica_merge:2")
TABLES = {"accounts": 3, "orders": 2}   # table -> partitions of its topic
COLUMNS = ("id", "balance", "note")      # each table's columns (EventProducer._change)
SOURCE = "tk"


@dataclass
class Sent:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None


@dataclass
class EventTortureReport:
    seed: int
    kills: list[KillRecord] = field(default_factory=list)
    messages: int = 0
    checks: dict[str, str] = field(default_factory=dict)


class EventProducer:
    """Seeded Debezium envelopes with disorder, redeliveries, late older inserts and poison."""

    def __init__(self, servers: str, prefix: str, seed: int) -> None:
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic

        self.prefix = prefix
        admin = KafkaAdminClient(bootstrap_servers=servers)
        admin.create_topics([NewTopic(self.topic(t), n, 1) for t, n in TABLES.items()])
        admin.close()
        self.producer = KafkaProducer(bootstrap_servers=servers)
        self.rng = random.Random(seed)
        self.lsn = 1000
        self.live: dict[tuple[str, int], bool] = {}
        self.fresh_key = 1000          # keys of the delete-then-late-insert cases, never used otherwise
        self.held: list[tuple[str, int, dict[str, Any], dict[str, Any] | None]] = []
        self.history: list[tuple[str, int, dict[str, Any], dict[str, Any] | None]] = []
        self.sent: list[Sent] = []

    def topic(self, table: str) -> str:
        return f"{self.prefix}.public.{table}"

    def _envelope(self, table: str, op: str, key: int, after: dict[str, Any] | None, lsn: int) -> dict[str, Any]:
        source = {"version": "3.7.0.Final", "connector": "postgresql", "name": self.prefix, "ts_ms": 1764063000000 + lsn,
                  "snapshot": "false", "db": "shop", "schema": "public", "table": table, "txId": 500 + lsn,
                  "lsn": lsn, "xmin": None}
        return {"before": {"id": key} if op == "d" else None, "after": after, "source": source, "op": op,
                "ts_ms": source["ts_ms"] + 2}

    def _change(self, table: str, key: int, op: str) -> tuple[str, int, dict[str, Any], dict[str, Any] | None]:
        self.lsn += self.rng.randint(1, 9)
        after = None if op == "d" else {"id": key, "balance": self.rng.randint(0, 10_000), "note": f"{op}{self.lsn}"}
        return table, key, {"id": key}, self._envelope(table, op, key, after, self.lsn)

    def chunk(self, changes: int) -> int:
        """Produce one chunk; how many messages it sent."""
        rng = self.rng
        out: list[tuple[str, int, dict[str, Any], dict[str, Any] | None]] = list(self.held)  # late, older events
        self.held = []
        for _ in range(changes):
            table = rng.choice(sorted(TABLES))
            key = rng.randint(1, 12)
            exists = self.live.get((table, key), False)
            op = "c" if not exists else rng.choice(("u", "u", "d"))
            self.live[(table, key)] = op != "d"
            out.append(self._change(table, key, op))
        # A delete whose key's older insert arrives only with the next chunk.
        table = rng.choice(sorted(TABLES))
        self.fresh_key += 1
        self.held.append(self._change(table, self.fresh_key, "c"))
        out.append(self._change(table, self.fresh_key, "d"))
        # Redeliveries: some of this chunk's events again, and some of earlier chunks'.
        out += rng.sample(out, max(1, len(out) // 8))
        if self.history:
            out += rng.sample(self.history, min(len(self.history), 4))
        self.history += out
        rng.shuffle(out)  # and any partition for any key: disorder across partitions
        before = len(self.sent)
        for table, key, k, value in out:
            partition = rng.randrange(TABLES[table])
            self._send(self.topic(table), partition, k, value)
            if value is not None and value["op"] == "d":
                self._send(self.topic(table), partition, k, None)  # Debezium's tombstone after a delete
        self._send(self.topic(rng.choice(sorted(TABLES))), 0, None, f"not an envelope {len(self.sent)}")  # poison
        self.producer.flush()
        return len(self.sent) - before

    def _send(self, topic: str, partition: int, key: dict[str, Any] | None, value: dict[str, Any] | str | None) -> None:
        k = None if key is None else json.dumps({"schema": {"type": "struct", "fields": []}, "payload": key})
        v = value if isinstance(value, str) or value is None else json.dumps(value)
        meta = self.producer.send(topic, key=None if k is None else k.encode(), value=None if v is None else v.encode(),
                                  partition=partition).get(timeout=60)
        self.sent.append(Sent(topic, partition, meta.offset, k, v))

    def end_offsets(self) -> dict[tuple[str, int], int]:
        ends: dict[tuple[str, int], int] = {}
        for s in self.sent:
            ends[(s.topic, s.partition)] = max(ends.get((s.topic, s.partition), 0), s.offset + 1)
        return ends

    def close(self) -> None:
        self.producer.close()


class EventTorture:
    """The daemon (``lakemirror run``) on an event pipeline from ``broker``, killed at the named points."""

    def __init__(self, spark: Any, workdir: Path, broker: str, seed: int = 25, max_per_trigger: int = 40,
                 history: str = HISTORY_CURRENT) -> None:
        self.spark = spark
        self.history = history
        self.workdir = workdir
        self.seed = seed
        self.prefix = f"tk{uuid.uuid4().hex[:6]}"   # topics of this run only, on a shared broker
        self.catalog = LocalCatalog(workdir / "lakehouse")
        self.producer = EventProducer(broker, self.prefix, seed)
        self.report = EventTortureReport(seed)
        config = workdir / "pipeline.yaml"
        config.write_text(yaml.safe_dump({
            "pipeline_id": "ktorture", "source_catalog": "src", "destination_catalog": "dst",
            "schema_name": "ktorture", "checkpoint_volume": str(workdir / "ck"),
            "trigger_interval_seconds": 0.5, "lag_interval_seconds": 1,
            "runtime": {"warehouse": str(workdir / "lakehouse"), "shuffle_partitions": 2,
                        "spark_conf": DAEMON_JVM_OPTIONS},
            "http": {"port": 0}, "restart": {"base_delay_seconds": 0.5, "max_delay_seconds": 4},
            "source": {"kind": "kafka", "name": SOURCE, "bootstrap_servers": broker,
                       "topic_pattern": f"{self.prefix}\\.public\\..*", "max_per_trigger": max_per_trigger,
                       "history": history}}))
        self.daemon = DaemonProcess(config, workdir / "ck" / "ktorture", workdir / "daemon.log")
        self.checkpoint = workdir / "ck" / "ktorture" / "events" / SOURCE / "checkpoint"

    def located(self, table: str) -> Any:
        return self.catalog.locate(TableName("dst", "ktorture", table))

    def run(self, points: tuple[str, ...] = EVENT_POINTS, changes_per_chunk: int = 24,
            point_timeout: float = 600.0) -> EventTortureReport:
        try:
            for point in points:
                self.producer.chunk(changes_per_chunk)
                self.report.kills.append(self.daemon.kill_at(point, point_timeout))
            self.producer.chunk(changes_per_chunk)
            self.catch_up_and_drain(point_timeout)
        finally:
            self.producer.close()
        self.report.messages = len(self.producer.sent)
        self.verify()
        return self.report

    def catch_up_and_drain(self, timeout: float) -> None:
        """A last daemon runs until its query's checkpoint has committed every produced offset."""
        want = self.producer.end_offsets()
        self.daemon.start()
        deadline = time.time() + timeout
        while True:
            assert self.daemon.proc is not None and self.daemon.proc.poll() is None, self.daemon.tail()
            done = checkpoint_end_offsets(self.checkpoint)
            if all(done.get(tp, 0) >= end for tp, end in want.items()):
                break
            assert time.time() < deadline, (f"the last daemon did not catch up in {timeout}s: committed {done}, "
                                            f"produced {want}\n{self.daemon.tail()}")
            time.sleep(1.0)
        code = self.daemon.terminate()
        assert code == 0, f"SIGTERM must drain to exit 0, got {code}:\n{self.daemon.tail()}"

    # -- the proof -------------------------------------------------------------------------------

    def decoded(self) -> tuple[list[ChangeEvent], list[Sent]]:
        decode = EventDecoder("kafka", "debezium", {})
        events, poison = [], []
        for s in self.producer.sent:
            d = decode(RawEvent(s.value, s.key, s.topic, s.partition, s.offset))
            if isinstance(d, ChangeEvent):
                events.append(d)
            elif isinstance(d, DeadLetter):
                poison.append(s)
        return events, poison

    def verify(self) -> None:
        events, poison = self.decoded()
        for table in TABLES:
            mine = [e for e in events if e.table == table]
            want, got, rows = (self._history(table, mine) if self.history == HISTORY_SCD2 else
                               self._current(table, mine))
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            stale = sorted(k for k in set(want) & set(got) if want[k] != got[k])
            assert not missing and not extra and not stale, (
                f"{table}: replica differs from the fold of the events: missing {missing[:5]}, extra {extra[:5]}, "
                f"stale {[(k, got[k], want[k]) for k in stale[:3]]}")
            distinct = len({e.digest() for e in mine})
            self.report.checks[f"{table}: replica equals the ordered fold"] = (
                f"{rows} rows of {len(got)} keys from {distinct} distinct events")
            for where in (self.located(table), tombstones_of(self.located(table))):
                history = tables.delta_table(self.spark, where).history().collect()
                tags = [h["userMetadata"] for h in history if is_txn_tag(h["userMetadata"])]
                doubled = sorted({t for t in tags if tags.count(t) > 1})
                assert not doubled, f"{where}: transactions committed twice: {doubled[:3]}"
                self.report.checks[f"{where.name.table}: each transaction id at most once"] = (
                    f"{len(tags)} batch commits, 0 doubled")
        letters = tables.read(self.spark, self.located(f"_lakemirror_dead_letters_{SOURCE}")).collect()
        got_letters = sorted((r["origin"], r["partition"], r["offset"]) for r in letters)
        want_letters = sorted((s.topic, s.partition, s.offset) for s in poison)
        assert got_letters == want_letters, f"dead letters: recorded {got_letters}, poison messages {want_letters}"
        self.report.checks["dead letters exactly once"] = f"{len(got_letters)} poison messages, each recorded once"
        self.daemon.assert_nothing_in_the_working_directory()

    def _current(self, table: str, events: list[ChangeEvent]) -> tuple[dict[Any, Any], dict[Any, Any], int]:
        """(the ordered fold per key, the replica's row per key, the replica's rows)."""
        rows = tables.read(self.spark, self.located(table)).drop(POSITION_COLUMN).collect()
        got = {(r["id"],): r.asDict() for r in rows}
        assert len(rows) == len(got), f"{table}: {len(rows) - len(got)} keys held twice"
        return ordered_fold(events), got, len(rows)

    def _history(self, table: str, events: list[ChangeEvent]) -> tuple[dict[Any, Any], dict[Any, Any], int]:
        """(the SCD2 fold per key, the replica's versions per key, the replica's rows); a version is
        (start order, end order, current, valid_from ms, valid_to ms, columns), oldest first."""
        frame = tables.read(self.spark, self.located(table)).selectExpr(
            "*", f"unix_millis({VALID_FROM}) AS _from_ms", f"unix_millis({VALID_TO}) AS _to_ms")
        got: dict[Any, list[Any]] = {}
        rows = frame.collect()
        for r in rows:
            row = r.asDict()
            end = row[END_POSITION_COLUMN]
            columns = {c: row[c] for c in COLUMNS}
            got.setdefault((row["id"],), []).append((
                row_order(row[POSITION_COLUMN].asDict()), row_order(end.asDict()) if end is not None else None,
                row[IS_CURRENT], row["_from_ms"], row["_to_ms"], columns))
        want = {k: [(v.start, v.end, v.is_current, v.start_ts_ms, v.end_ts_ms,
                     {c: v.columns.get(c) for c in COLUMNS}) for v in vs]
                for k, vs in history_fold(events).items()}
        return want, {k: sorted(vs, key=lambda v: v[0]) for k, vs in got.items()}, len(rows)
