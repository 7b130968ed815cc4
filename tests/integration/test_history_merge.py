"""History (SCD type 2) on the real local Spark + Delta: events applied batch by batch, out of order,
redelivered and replayed, leave one row per key version equal to the SCD2 fold of the distinct events
ordered by position; and an event source configured with ``history: scd2`` keeps such replicas."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.guard_plan import POSITION_COLUMN, row_order
from lakemirror.sinks.events.history_merge import HistoryDeltaSink, HistoryReplicaMismatch
from lakemirror.sinks.events.history_plan import (
    END_POSITION_COLUMN, IS_CURRENT, VALID_FROM, VALID_TO, HistoryMemoryReplica, history_fold, plan_history,
    plan_history_batch,
)
from lakemirror.sinks.events.guard_merge import GuardedDeltaSink
from lakemirror.sinks.events.guard_plan import plan_batch
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.change_event import DELETE, SNAPSHOT, STREAM, TRUNCATE, UPSERT, ChangeEvent, Position
from lakemirror.sources.debezium import decode_line
from lakemirror.supervisor.events.stream_runner import EventStreamSpec
from lakemirror.tables import TableLocation
from tests.integration.test_event_stream import Harness, pg

pytestmark = pytest.mark.integration
KEYS = ("tenant", "id")
TS0 = 1_764_000_000_000


def ev(op: str, key: tuple[Any, ...], lsn: int, phase: int = STREAM, **cols: Any) -> ChangeEvent:
    keys = tuple(zip(KEYS, key)) if op != TRUNCATE else ()
    return ChangeEvent("items", op, keys, Position(phase, lsn, 1, 0), {**dict(keys), **cols} if op == UPSERT else {},
                       ts_ms=TS0 + lsn * 1000 + phase)


Chain = dict[tuple[Any, ...], list[tuple[Any, ...]]]


def versions(spark: Any, loc: TableLocation, column: str = "v", keys: tuple[str, ...] = KEYS) -> Chain:
    """Per key: (start order, end order, is_current, valid_from ms, valid_to ms, column) oldest first."""
    out: Chain = {}
    frame = tables.read(spark, loc).selectExpr("*", f"unix_millis({VALID_FROM}) AS f", f"unix_millis({VALID_TO}) AS t")
    for r in frame.collect():
        start, end = row_order(r[POSITION_COLUMN].asDict()), r[END_POSITION_COLUMN]
        end = row_order(end.asDict()) if end is not None else None
        out.setdefault(tuple(r[k] for k in keys), []).append(
            (start, end, r[IS_CURRENT], r["f"], r["t"], r[column]))
    return {k: sorted(v, key=lambda x: x[0]) for k, v in out.items()}


def folded(events: list[ChangeEvent], column: str = "v") -> Chain:
    return {k: [(v.start, v.end, v.is_current, v.start_ts_ms, v.end_ts_ms, v.columns.get(column)) for v in vs]
            for k, vs in history_fold(events).items()}


def run(spark: Any, sink: HistoryDeltaSink, batches: list[list[ChangeEvent]], first: int = 0) -> list[Any]:
    outcomes = []
    for n, batch in enumerate(batches, start=first):
        plans, refused = plan_history_batch(batch)
        assert not refused
        for plan in plans.values():
            outcomes.append(sink.apply(spark, plan, TxnId("test/items", n)))
    return outcomes


@pytest.fixture
def sink(tmp_path: Path) -> HistoryDeltaSink:
    return HistoryDeltaSink(TableLocation(TableName("dst", "s", "items"), str(tmp_path / "items")))


def test_inserts_updates_deletes_a_reinsert_and_late_events(spark: Any, sink: HistoryDeltaSink) -> None:
    a, b, c = ("a", 1), ("a", 2), (None, 3)
    events = [
        ev(UPSERT, a, 1000, SNAPSHOT, v=0),   # a snapshot read: older than every streamed change
        ev(UPSERT, a, 10, v=1), ev(UPSERT, a, 20, v=2), ev(DELETE, a, 30), ev(UPSERT, a, 40, v=4),   # re-insert
        ev(UPSERT, b, 10, v=1), ev(UPSERT, b, 30, v=3),
        ev(UPSERT, c, 15, v=1), ev(DELETE, c, 25),
    ]
    late_b = ev(UPSERT, b, 20, v=2)             # arrives after its successor: goes between 10 and 30
    late_c = ev(DELETE, c, 18)                  # an older delete: c's version ends at 18, the delete at 25 is kept
    later_c = ev(UPSERT, c, 22, v=2)            # ... so this one, arriving last, ends at 25
    batches = [[events[1], events[2], events[5], events[6], events[7]],
               [events[3], events[4], events[4], events[8]],              # a duplicate inside a batch
               [late_b, events[0], events[2]],                            # a redelivery across batches
               [late_c], [later_c]]
    outcomes = run(spark, sink, batches)
    assert outcomes[0].counts.inserted == 5
    want = folded([*events, late_b, late_c, later_c])
    got = versions(spark, sink.replica)
    assert got == want
    assert [(s[1], e[1] if e else None, cur, v) for s, e, cur, _, _, v in got[a]] == [
        (1000, 10, False, 0), (10, 20, False, 1), (20, 30, False, 2), (40, None, True, 4)]
    assert [(s[1], e[1] if e else None) for s, e, *_ in got[b]] == [(10, 20), (20, 30), (30, None)]
    assert [(s[1], e[1] if e else None) for s, e, *_ in got[c]] == [(15, 18), (22, 25)]
    assert got[a][1][3:5] == (TS0 + 10_000 + 1, TS0 + 20_000 + 1)  # valid_from / valid_to: the source commit times


def test_a_replayed_batch_is_skipped_by_its_transaction_id(spark: Any, sink: HistoryDeltaSink) -> None:
    batch = [ev(UPSERT, ("a", 1), 10, v=1), ev(DELETE, ("a", 2), 11)]
    first = run(spark, sink, [batch])
    assert not first[0].replayed and first[0].counts.inserted == 1 and first[0].tombstones == 1
    again = run(spark, sink, [batch])
    assert again[0].applied == 0 and again[0].stale == 2          # already in the history: nothing to write
    replayed = run(spark, sink, [[ev(UPSERT, ("a", 1), 12, v=2)]])  # batch 0 again, other content: Delta skips it
    assert replayed[0].replayed
    assert [x[5] for x in versions(spark, sink.replica)[("a", 1)]] == [1]
    merges = [h["operation"] for h in tables.delta_table(spark, sink.replica).history().collect()]
    assert merges.count("MERGE") == 1


def test_random_histories_match_the_fold_and_the_twin(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(11)
    keys = [(t, i) for t in ("a", None) for i in range(3)]
    events, lsn = [], 10
    for _ in range(45):
        lsn += 1
        roll = rng.random()
        if roll < 0.05:
            events.append(ev(TRUNCATE, (), lsn))
        elif roll < 0.35:
            events.append(ev(DELETE, rng.choice(keys), lsn))
        else:
            events.append(ev(UPSERT, rng.choice(keys), lsn, v=rng.choice([None, rng.randint(0, 99)])))
    stream = events + rng.sample(events, 12)
    rng.shuffle(stream)
    batches = [stream[i:i + 8] for i in range(0, len(stream), 8)]
    sink = HistoryDeltaSink(TableLocation(TableName("dst", "s", "items"), str(tmp_path / "r")))
    run(spark, sink, batches)
    twin = HistoryMemoryReplica()
    for n, batch in enumerate(batches):
        for plan in plan_history_batch(batch)[0].values():
            twin.apply(plan_history(plan, twin.read(plan)), now=float(n))
    want = folded(events)
    assert {k: [(v.start, v.end, v.is_current, v.start_ts_ms, v.end_ts_ms, v.columns.get("v")) for v in vs]
            for k, vs in twin.rows().items()} == want
    assert versions(spark, sink.replica) == want


def test_a_late_truncate_closes_the_versions_it_spans(spark: Any, sink: HistoryDeltaSink) -> None:
    a, b = ("a", 1), ("a", 2)
    events = [ev(UPSERT, a, 10, v=1), ev(DELETE, a, 50), ev(UPSERT, b, 10, v=1), ev(UPSERT, b, 60, v=6)]
    run(spark, sink, [events, [ev(TRUNCATE, (), 30)], [ev(UPSERT, a, 40, v=4)]])
    assert versions(spark, sink.replica) == folded([*events, ev(TRUNCATE, (), 30), ev(UPSERT, a, 40, v=4)])
    assert [(s[1], e[1] if e else None) for s, e, *_ in versions(spark, sink.replica)[a]] == [(10, 30), (40, 50)]


def test_misfits_are_rejected_and_a_current_rows_replica_is_refused(spark: Any, tmp_path: Path) -> None:
    sink = HistoryDeltaSink(TableLocation(TableName("dst", "s", "items"), str(tmp_path / "h")))
    run(spark, sink, [[ev(UPSERT, ("a", 1), 10, v=1)]])
    out = run(spark, sink, [[ev(UPSERT, ("a", 1), 11, v="not a number"), ev(UPSERT, ("a", 1), 12, v=3)]], first=1)
    assert [r[0].position.major for r in out[0].rejected] == [11] and "bigint" in out[0].rejected[0][1]
    assert [(x[0][1], x[5]) for x in versions(spark, sink.replica)[("a", 1)]] == [(10, 1), (12, 3)]
    plain = TableLocation(TableName("dst", "s", "plain"), str(tmp_path / "plain"))
    GuardedDeltaSink(plain).apply(spark, plan_batch([ev(UPSERT, ("a", 1), 10, v=1)])[0]["items"], TxnId("p", 0))
    with pytest.raises(HistoryReplicaMismatch, match="history scd2 needs a replica of its own"):
        run(spark, HistoryDeltaSink(plain), [[ev(UPSERT, ("a", 1), 11, v=2)]])


def test_an_event_source_with_history_scd2_keeps_every_version(spark: Any, tmp_path: Path) -> None:
    h = Harness(spark, tmp_path, EventStreamSpec("shop", "files", "debezium", path=str(tmp_path / "inbox"),
                                                 trigger_interval_seconds=0.5, history="scd2"))
    second = [pg("u", 110, {"id": 1}, {"balance": 11}), pg("d", 120, {"id": 2}), pg("tombstone", 120, {"id": 2}),
              pg("c", 100, {"id": 1}, {"balance": 10})]                      # a redelivery of the first insert
    h.start()
    try:
        h.write(pg("c", 100, {"id": 1}, {"balance": 10}), pg("c", 101, {"id": 2}, {"balance": 20}))
        h.write(*second)
        h.write(pg("u", 105, {"id": 1}, {"balance": 99}),                    # late: between 100 and 110
                pg("c", 130, {"id": 2}, {"balance": 0}),                     # a re-insert after the delete
                pg("u", 115, {"id": 2}, {"balance": 21}))                    # late: before the delete at 120
        h.write(*second)                                                     # a whole batch delivered again
    finally:
        h.runner.halt()
    events = [e for e in (decode_line(line, "debezium") for line in h.lines) if isinstance(e, ChangeEvent)]
    got = versions(spark, h.locate("accounts"), "balance", ("id",))
    assert got == folded(events, "balance")
    assert [(s[1], e[1] if e else None, cur, b) for s, e, cur, _, _, b in got[(1,)]] == [
        (100, 105, False, 10), (105, 110, False, 99), (110, None, True, 11)]
    assert [(s[1], e[1] if e else None, cur, b) for s, e, cur, _, _, b in got[(2,)]] == [
        (101, 115, False, 20), (115, 120, False, 21), (130, None, True, 0)]
    status = h.runner.replicas["accounts"]
    assert status.inserted == 6 and status.stale == 4    # the redelivered insert, then the second file's three changes again
