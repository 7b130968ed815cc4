"""An event source end to end on the real local Spark: JSON-lines files through Spark's file
streaming source, one query for many tables, one guarded MERGE per replica per batch.

Each file is one micro-batch (the test waits for it); the replicas must equal the ordered fold of
every event written, row for row, whatever the order and duplication the files deliver them in.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.guard_plan import POSITION_COLUMN, ordered_fold
from lakemirror.sources.change_event import ChangeEvent
from lakemirror.sources.debezium import decode_line
from lakemirror.supervisor.change_feed.table_runner import BatchReport
from lakemirror.supervisor.control import table_state as sm
from lakemirror.sources.event_source import event_source_for
from lakemirror.sinks.events.delta_sink import delta_event_sink
from lakemirror.supervisor.events.stream_runner import EventStreamRunner, EventStreamSpec
from lakemirror.tables import TableLocation

pytestmark = pytest.mark.integration


class Harness:
    def __init__(self, spark: Any, root: Path, spec: EventStreamSpec) -> None:
        self.spark, self.root, self.spec = spark, root, spec
        self.inbox = root / "inbox"
        self.inbox.mkdir(parents=True)
        self.lines: list[str] = []
        sink = delta_event_sink(spec, event_source_for(spec).decoder, "test", spark, self.locate,
                                self.locate("_dead_letters"))
        self.runner = EventStreamRunner(spec, spark, root / "events" / spec.name, sink)
        self.reports: list[BatchReport] = []
        self.files = 0

    def locate(self, table: str) -> TableLocation:
        return TableLocation(TableName("dst", "s", table), str(self.root / "lake" / table))

    def start(self) -> None:
        self.runner.launch()
        self._wait(lambda: self.runner._query is not None, "the query to start")  # noqa: SLF001

    def _wait(self, done: Any, what: str, timeout: float = 300.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for item in self.runner.poll():
                if isinstance(item, BatchReport):
                    self.reports.append(item)
                elif isinstance(item, sm.Failed):
                    raise AssertionError(f"the stream failed: {item.error}")
            if done():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def write(self, *lines: str) -> None:
        """One file, moved into the inbox complete; waits for the batch that reads it."""
        self.files += 1
        self.lines += lines
        tmp = self.root / f"f{self.files}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.inbox / f"f{self.files:03}.json")
        read = sum(r.outcome.stats.rows_read for r in self.reports)
        self._wait(lambda: sum(r.outcome.stats.rows_read for r in self.reports) >= read + len(lines), "the batch")

    def replica(self, table: str, keys: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
        out = {}
        for r in tables.read(self.spark, self.locate(table)).drop(POSITION_COLUMN).collect():
            row = r.asDict()
            out[tuple(row[k] for k in keys)] = row
        return out

    def folded(self, table: str, columns: list[str], **decode: Any) -> dict[tuple[Any, ...], dict[str, Any]]:
        events = [e for e in (decode_line(line, self.spec.format, **decode) for line in self.lines)
                  if isinstance(e, ChangeEvent) and e.table == table]
        return {k: {c: v.get(c) for c in columns} for k, v in ordered_fold(events).items()}

    def dead_letters(self) -> list[Any]:
        return tables.read(self.spark, self.locate("_dead_letters")).collect()


def simple(table: str, op: str, ts: int, pk: dict[str, Any], after: dict[str, Any] | None = None) -> str:
    return json.dumps({"table_name": table, "operation": op, "before": None,
                       "after": None if after is None else json.dumps({**pk, **after}),
                       "timestamp": f"2024-01-01T10:00:{ts:02}Z", "transaction_id": f"TXN_{ts}",
                       "primary_key": json.dumps(pk)})


def test_simple_events_into_two_replicas_exact_under_disorder(spark: Any, tmp_path: Path) -> None:
    h = Harness(spark, tmp_path, EventStreamSpec("orders_feed", "files", "simple", path=str(tmp_path / "inbox"),
                                                 trigger_interval_seconds=0.5))
    c = lambda i: {"customer_id": f"C{i}"}  # noqa: E731
    o = lambda n, line: {"order_id": n, "line": line}  # noqa: E731  (composite key, line may be NULL)
    h.start()
    try:
        h.write(simple("customers", "INSERT", 1, c(1), {"name": "Ada", "tier": 1}),
                simple("customers", "INSERT", 2, c(2), {"name": "Bob", "tier": None}),
                simple("orders", "INSERT", 3, o(10, 1), {"qty": 2}),
                simple("orders", "INSERT", 4, o(10, None), {"qty": 5}))
        h.write(simple("customers", "UPDATE", 20, c(1), {"name": "Ada L.", "tier": 2}),
                simple("customers", "DELETE", 21, c(2)),
                simple("customers", "INSERT", 2, c(2), {"name": "Bob", "tier": None}),   # a redelivery
                simple("orders", "UPDATE", 22, o(10, None), {"qty": 6}),
                "{this is not json",                                                    # poison
                simple("customers", "UPDATE", 9, c(3), {"name": "Cy", "tier": 3}))      # c3 out of order...
        h.write(simple("customers", "INSERT", 5, c(3), {"name": "Cy (old)", "tier": 0}),  # ...its older insert
                simple("customers", "INSERT", 15, c(2), {"name": "Bob (late)", "tier": 9}),  # older than its delete
                simple("customers", "UPDATE", 20, c(1), {"name": "Ada L.", "tier": 2}),  # a duplicate
                simple("orders", "DELETE", 30, o(10, 1)))
        h.write(simple("orders", "INSERT", 31, o(10, 1), {"qty": 7}),                   # re-insert after delete
                simple("customers", "INSERT", 40, c(4), {"name": None, "tier": None}))
    finally:
        h.runner.halt()
    customers = h.replica("customers", ("customer_id",))
    assert customers == h.folded("customers", ["customer_id", "name", "tier"])
    assert set(customers) == {("C1",), ("C3",), ("C4",)} and customers[("C3",)]["name"] == "Cy"
    orders = h.replica("orders", ("order_id", "line"))
    assert orders == h.folded("orders", ["order_id", "line", "qty"])
    assert orders == {(10, 1): {"order_id": 10, "line": 1, "qty": 7}, (10, None): {"order_id": 10, "line": None, "qty": 6}}
    (letter,) = h.dead_letters()
    assert letter["value"] == "{this is not json" and letter["offset"] == 5 and letter["origin"].endswith("f002.json")
    assert "not JSON" in letter["reason"]
    # stale: C3@5 older than its row, C2@15 older than its tombstone, C1@20 as old as its row (a duplicate)
    assert h.runner.dead_letter_count == 1 and h.runner.replicas["customers"].stale == 3


def pg(op: str, lsn: int, key: dict[str, Any], after: dict[str, Any] | None = None, table: str = "accounts",
       snapshot: bool = False) -> str:
    """A Kafka record dump of a Debezium 3.7 Postgres event (key + value with embedded schema)."""
    source = {"version": "3.7.0.Final", "connector": "postgresql", "name": "shop", "ts_ms": 1764063000000 + lsn,
              "snapshot": "last" if snapshot else "false", "db": "shop", "sequence": json.dumps([None, str(lsn)]),
              "schema": "public", "table": table, "txId": 500 + lsn, "lsn": lsn, "xmin": None}
    value = None if op == "tombstone" else {
        "schema": {"type": "struct", "name": f"shop.public.{table}.Envelope", "optional": False, "fields": []},
        "payload": {"before": key if op == "d" else None, "after": None if after is None else {**key, **after},
                    "source": source, "transaction": None, "op": op, "ts_ms": source["ts_ms"] + 3}}
    return json.dumps({"topic": f"shop.public.{table}", "partition": 0, "offset": lsn,
                       "key": {"schema": {"type": "struct", "fields": []}, "payload": key}, "value": value})


def test_debezium_envelopes_with_snapshot_pk_update_tombstones_and_truncate(spark: Any, tmp_path: Path) -> None:
    h = Harness(spark, tmp_path, EventStreamSpec("shop", "files", "debezium", path=str(tmp_path / "inbox"),
                                                 trigger_interval_seconds=0.5))
    h.start()
    try:
        h.write(pg("r", 9000, {"id": 1}, {"balance": 10}, snapshot=True),
                pg("r", 9000, {"id": 2}, {"balance": 20}, snapshot=True),
                pg("r", 9000, {"id": 1}, {"kind": "gold"}, table="tiers", snapshot=True))
        h.write(pg("u", 100, {"id": 1}, {"balance": 11}),
                pg("d", 110, {"id": 2}), pg("tombstone", 110, {"id": 2}),
                pg("d", 120, {"id": 1}), pg("tombstone", 120, {"id": 1}),    # a primary-key update 1 -> 3:
                pg("c", 120, {"id": 3}, {"balance": 11}),                    # d old key, c new key, one lsn
                pg("c", 130, {"id": 2}, {"balance": 0}))                    # a re-insert of key 2
        h.write(pg("r", 9000, {"id": 1}, {"balance": 10}, snapshot=True),  # a snapshot row redelivered late
                pg("u", 105, {"id": 1}, {"balance": 99}),                    # older than the key's delete
                pg("t", 140, {}, table="tiers"))                             # truncate tiers
        h.write(pg("c", 135, {"id": 5}, {"kind": "late"}, table="tiers"),    # older than the truncate
                pg("c", 150, {"id": 6}, {"kind": "new"}, table="tiers"))
    finally:
        h.runner.halt()
    accounts = h.replica("accounts", ("id",))
    assert accounts == h.folded("accounts", ["id", "balance"])
    assert {k: v["balance"] for k, v in accounts.items()} == {(2,): 0, (3,): 11}
    tiers = h.replica("tiers", ("id",))
    assert tiers == h.folded("tiers", ["id", "kind"]) == {(6,): {"id": 6, "kind": "new"}}
    assert not tables.exists(spark, h.locate("_dead_letters"))  # tombstones are skipped, not dead letters


def test_a_stream_stopped_while_writing_its_first_offset_starts_again(spark: Any, tmp_path: Path) -> None:
    """A query stopped or killed while writing batch 0's offset leaves Spark's temporary file (and
    its checksum) in ``offsets``; Spark refuses to start batch 0 on a non-empty folder, so the
    runner clears such partial writes first, and the epoch is renewed (no batch was recorded)."""
    spec = EventStreamSpec("feed", "files", "simple", path=str(tmp_path / "inbox"), trigger_interval_seconds=0.5)
    h = Harness(spark, tmp_path, spec)
    folder = tmp_path / "events" / spec.name
    offsets = folder / "checkpoint" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.6d1f0c9e-4a1b-4f7e-9c55-0b1d2e3f4a5b.tmp").write_text("v1\n")
    (offsets / "..0.6d1f0c9e-4a1b-4f7e-9c55-0b1d2e3f4a5b.tmp.crc").write_bytes(b"crc")
    (folder / "epoch").write_text("stale-epoch")
    h.start()
    try:
        h.write(simple("customers", "INSERT", 1, {"customer_id": "C1"}, {"name": "Ada"}))
    finally:
        h.runner.halt()
    assert h.replica("customers", ("customer_id",)) == {("C1",): {"customer_id": "C1", "name": "Ada"}}
    assert (folder / "epoch").read_text() != "stale-epoch"
    assert not [p.name for p in offsets.iterdir() if p.name.endswith((".tmp", ".tmp.crc"))]


def test_a_change_the_replica_refuses_is_dead_lettered_and_replayed_once_it_fits(spark: Any, tmp_path: Path) -> None:
    """A CHECK constraint on the replica refuses one change: that change alone becomes a dead letter
    (table, key, position, reason), the others apply (and the replica stays on the driver's executor).
    The batch replayed applies and records nothing twice; the operator's replay, once the constraint
    is gone, applies it through the sequence guard."""
    from lakemirror.sinks.event_contract import EventBatchResult, EventTxn
    from lakemirror.sinks.events.dead_letters import PENDING, REPLAYED, DeadLetterTable
    from lakemirror.sources.event_stream import EventDecoder, RawEvent, decode_batch
    from lakemirror.sinks.events.delta_sink import delta_replicas
    from lakemirror.sinks.events.guarded_sink import EventBatchApplier
    from lakemirror.sinks.events.letter_resolution import resolve_letters

    spec = EventStreamSpec("shop", "files", format="simple", table_workers=1)
    h = Harness(spark, tmp_path, spec)
    applier = EventBatchApplier(spec, EventDecoder("files", "simple"), "test", delta_replicas(h.locate, spec),
                                DeadLetterTable(h.locate("_dead_letters")), lambda name: spark)

    def apply(events: list[RawEvent], batch_id: int) -> EventBatchResult:
        return applier.apply(decode_batch(events, applier.decoder, spec.tables), EventTxn("e", batch_id))

    def raws(*rows: tuple[int, int]) -> list[RawEvent]:
        lines = [json.dumps({"table_name": "orders", "operation": "INSERT", "timestamp": 10 + key,
                             "transaction_id": f"t{key}", "primary_key": {"id": key},
                             "after": {"id": key, "amount": amount}}) for key, amount in rows]
        return [RawEvent(line, None, "/in/f.json", None, n) for n, line in enumerate(lines, start=1)]

    apply(raws((1, 5)), 0)
    spark.sql(f"ALTER TABLE delta.`{h.locate('orders').path}` ADD CONSTRAINT positive CHECK (amount > 0)")
    batch = raws((3, -1), (2, 7), (4, 9))
    result = apply(batch, 1)
    assert set(h.replica("orders", ("id",))) == {(1,), (2,), (4,)} and result.dead_letters == 1
    [letter] = applier.dead_letters.letters(spark)
    assert (letter.table, letter.change_key, letter.raw.offset, letter.status) == ("orders", '{"id": 3}', 1, PENDING)
    assert letter.position and "timestamp_us=" in letter.position
    again = apply(batch, 1)   # the batch replayed after a crash
    assert again.counts.inserted == 0 and [d.raw.offset for d in again.letters] == [1]
    assert len(applier.dead_letters.letters(spark)) == 1
    spark.sql(f"ALTER TABLE delta.`{h.locate('orders').path}` DROP CONSTRAINT positive")
    report = resolve_letters(applier, "replay", [letter.id])
    assert [r.status for r in report.resolutions] == [REPLAYED]
    assert h.replica("orders", ("id",))[(3,)]["amount"] == -1
    assert applier.dead_letters.letters(spark)[0].status == REPLAYED
