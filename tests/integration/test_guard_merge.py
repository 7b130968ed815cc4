"""The guarded Delta executor on a real local Spark: events applied batch by batch, out of order and
redelivered, leave the replica equal to the ordered fold of the events, row for row."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.guard_merge import GuardedDeltaSink
from lakemirror.sinks.events.guard_plan import POSITION_COLUMN, GuardedMemoryReplica, ordered_fold, plan_batch
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.change_event import DELETE, SNAPSHOT, STREAM, TRUNCATE, UPSERT, ChangeEvent, Position
from lakemirror.tables import TableLocation

pytestmark = pytest.mark.integration
KEYS = ("tenant", "id")


def ev(op: str, key: tuple[Any, ...], lsn: int, phase: int = STREAM, **cols: Any) -> ChangeEvent:
    keys = tuple(zip(KEYS, key)) if op != TRUNCATE else ()
    return ChangeEvent("items", op, keys, Position(phase, lsn, 1, 0), {**dict(keys), **cols} if op == UPSERT else {})


def replica_rows(spark: Any, loc: TableLocation) -> dict[tuple[Any, ...], dict[str, Any]]:
    out = {}
    for r in tables.read(spark, loc).drop(POSITION_COLUMN).collect():
        row = r.asDict()
        out[tuple(row[k] for k in KEYS)] = row
    return out


def expected(events: list[ChangeEvent], columns: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {k: {c: v.get(c) for c in columns} for k, v in ordered_fold(events).items()}


#: Every test runs against both executors: Spark's MERGE and the driver's delta-rs MERGE.
PATHS = pytest.mark.parametrize("on_driver", [False, True], ids=["spark", "driver"])


@pytest.fixture(params=[False, True], ids=["spark", "driver"])
def sink(tmp_path: Path, request: Any) -> GuardedDeltaSink:
    return GuardedDeltaSink(TableLocation(TableName("dst", "s", "items"), str(tmp_path / "items")),
                            driver_apply=request.param)


def run(spark: Any, sink: GuardedDeltaSink, batches: list[list[ChangeEvent]], first: int = 0) -> list[Any]:
    outcomes = []
    for n, batch in enumerate(batches, start=first):
        plans, refused = plan_batch(batch)
        assert not refused
        for plan in plans.values():
            outcomes.append(sink.apply(spark, plan, TxnId("test/items", n)))
            if tables.exists(spark, sink.replica):  # the path under test, not a fallback
                assert sink.applies_on_driver == sink.driver_apply
    return outcomes


def test_disorder_duplicates_deletes_and_a_late_older_insert(spark: Any, sink: GuardedDeltaSink) -> None:
    events = [
        ev(UPSERT, ("a", 1), 1000, SNAPSHOT, name="snap", score=1),
        ev(UPSERT, ("a", 2), 1000, SNAPSHOT, name="snap2", score=None),
        ev(UPSERT, (None, 3), 20, name="null tenant", score=3),
        ev(UPSERT, ("a", 1), 30, name="upd", score=2),
        ev(DELETE, ("a", 2), 40),
        ev(UPSERT, ("a", 4), 50, name="x", score=4),
        ev(DELETE, ("a", 4), 60),
        ev(UPSERT, ("a", 4), 70, name="re-inserted", score=5),
        ev(DELETE, ("a", 1), 80),
        ev(UPSERT, ("a", 5), 50, name="streamed", score=5),
        ev(UPSERT, ("a", 5), 1000, SNAPSHOT, name="snapshot, older", score=0),  # arrives last: never wins
        ev(UPSERT, ("a", 5), 45, name="older", score=0),
    ]
    batches = [[events[5], events[3], events[3]], [events[8], events[0]], [events[6], events[2], events[1]],
               [events[4], events[7], events[7], events[9]], [events[10]], [events[11], events[10]]]
    run(spark, sink, batches)
    late = ev(UPSERT, ("a", 1), 35, name="late and older", score=9)  # after the delete at 80: stays deleted
    run(spark, sink, [[late]], first=len(batches))
    assert replica_rows(spark, sink.replica) == expected(events, [*KEYS, "name", "score"])
    assert ("a", 1) not in replica_rows(spark, sink.replica)


def test_a_replayed_batch_is_skipped_by_its_transaction_id(spark: Any, sink: GuardedDeltaSink) -> None:
    first = run(spark, sink, [[ev(UPSERT, ("a", 1), 10, v=1), ev(DELETE, ("a", 2), 11)]])
    assert not first[0].replayed and first[0].counts.inserted == 1 and first[0].tombstones == 1
    again = run(spark, sink, [[ev(UPSERT, ("a", 1), 10, v=1), ev(DELETE, ("a", 2), 11)]])
    assert again[0].replayed
    history = tables.delta_table(spark, sink.tombstones).history().collect()
    assert [h["operation"] for h in history].count("WRITE") == 1  # the tombstones' append, once
    assert [h["userMetadata"] for h in history if h["operation"] == "WRITE"] == [TxnId("test/items/tombstones", 0).tag()]
    assert tables.read(spark, sink.tombstones).count() == 1


@PATHS
def test_random_histories_match_the_in_memory_twin(spark: Any, tmp_path: Path, on_driver: bool) -> None:
    rng = random.Random(7)
    keys = [(t, i) for t in ("a", None) for i in range(3)]
    events, lsn = [], 10
    for _ in range(40):
        lsn += 1
        roll = rng.random()
        if roll < 0.04:
            events.append(ev(TRUNCATE, (), lsn))
        elif roll < 0.35:
            events.append(ev(DELETE, rng.choice(keys), lsn))
        else:
            events.append(ev(UPSERT, rng.choice(keys), lsn, v=rng.choice([None, rng.randint(0, 99)])))
    stream = events + rng.sample(events, 10)
    rng.shuffle(stream)
    batches = [stream[i:i + 10] for i in range(0, len(stream), 10)]
    sink = GuardedDeltaSink(TableLocation(TableName("dst", "s", "items"), str(tmp_path / "r")), driver_apply=on_driver)
    run(spark, sink, batches)
    twin = GuardedMemoryReplica()
    for n, batch in enumerate(batches):
        twin.apply(plan_batch(batch)[0]["items"], now=float(n))
    want = {k: {c: v.get(c) for c in (*KEYS, "v")} for k, v in twin.live().items()}
    assert want == expected(events, [*KEYS, "v"])
    assert replica_rows(spark, sink.replica) == want


def test_values_that_do_not_fit_are_rejected_and_new_columns_are_added(spark: Any, sink: GuardedDeltaSink) -> None:
    run(spark, sink, [[ev(UPSERT, ("a", 1), 10, score=1)]])
    out = run(spark, sink, [[ev(UPSERT, ("a", 2), 11, score="not a number"), ev(UPSERT, ("a", 3), 12, score=3, note="new")]],
              first=1)
    assert [r[0].key for r in out[0].rejected] == [("a", 2)] and "bigint" in out[0].rejected[0][1]
    assert out[0].added_columns == ("note",)
    rows = replica_rows(spark, sink.replica)
    assert set(rows) == {("a", 1), ("a", 3)} and rows[("a", 3)]["note"] == "new" and rows[("a", 1)]["note"] is None
    # a key that does not fit its column is rejected alone; the batch's other keys are applied
    out = run(spark, sink, [[ev(UPSERT, ("a", "x"), 13, score=5), ev(DELETE, ("a", 1), 14)]], first=2)
    assert [r[0].key for r in out[0].rejected] == [("a", "x")] and out[0].counts.deleted == 1
    assert set(replica_rows(spark, sink.replica)) == {("a", 3)}


@PATHS
def test_tombstones_are_purged_past_the_horizon(spark: Any, tmp_path: Path, on_driver: bool) -> None:
    now = [1_000_000.0]
    sink = GuardedDeltaSink(TableLocation(TableName("dst", "s", "items"), str(tmp_path / "p")), clock=lambda: now[0],
                            driver_apply=on_driver)
    run(spark, sink, [[ev(UPSERT, ("a", 1), 10, v=1)], [ev(DELETE, ("a", 1), 20)]])
    now[0] += 100
    assert sink.purge(spark, horizon_seconds=3600) == 0
    run(spark, sink, [[ev(UPSERT, ("a", 1), 15, v=2)]], first=2)
    assert replica_rows(spark, sink.replica) == {}
    now[0] += 3600
    assert sink.purge(spark, horizon_seconds=3600) == 1
    assert tables.read(spark, sink.tombstones).count() == 0


@pytest.mark.parametrize("first_driver", [True, False], ids=["driver-then-spark", "spark-then-driver"])
def test_either_executor_recognises_the_others_commits(spark: Any, tmp_path: Path, first_driver: bool) -> None:
    """A batch one executor committed (the replica's MERGE and its tombstones) is a replay for the
    other, and the guard holds across them: the driver reads tombstones Spark wrote and vice versa."""
    loc = TableLocation(TableName("dst", "s", "items"), str(tmp_path / "x"))
    one = GuardedDeltaSink(loc, driver_apply=first_driver)
    run(spark, one, [[ev(UPSERT, ("a", 1), 10, v=1), ev(UPSERT, ("a", 2), 11, v=2)], [ev(DELETE, ("a", 2), 20)]])
    other = GuardedDeltaSink(loc, driver_apply=not first_driver)
    again = run(spark, other, [[ev(DELETE, ("a", 2), 20)]], first=1)
    assert again[0].replayed and tables.read(spark, other.tombstones).count() == 1
    later = run(spark, other, [[ev(UPSERT, ("a", 2), 15, v=9), ev(UPSERT, ("a", 1), 9, v=0),
                                ev(UPSERT, ("a", 3), 30, v=3)]], first=2)
    assert later[0].stale == 2 and later[0].counts.inserted == 1  # older than the tombstone, older than the row
    assert replica_rows(spark, loc) == {("a", 1): {"tenant": "a", "id": 1, "v": 1},
                                        ("a", 3): {"tenant": "a", "id": 3, "v": 3}}


@PATHS
def test_typed_values_and_positions_that_differ_past_the_first_field(spark: Any, tmp_path: Path,
                                                                      on_driver: bool) -> None:
    """Timestamps, dates, decimals, doubles, booleans and NULLs reach the replica as Spark types them,
    and the guard compares positions field by field (same LSN, later transaction; snapshot before
    stream)."""
    from datetime import datetime, timezone
    from decimal import Decimal

    loc = TableLocation(TableName("dst", "s", "items"), str(tmp_path / "t"))
    sink = GuardedDeltaSink(loc, driver_apply=on_driver)
    spark.sql(f"CREATE TABLE delta.`{loc.path}` (tenant STRING, id BIGINT, at TIMESTAMP, day DATE, "
              f"amount DECIMAL(10,2), ratio DOUBLE, ok BOOLEAN, "
              f"{POSITION_COLUMN} STRUCT<phase: BIGINT, major: BIGINT, minor: BIGINT, micro: BIGINT, rank: BIGINT>) "
              f"USING DELTA")
    at = datetime(2026, 11, 26, 18, 30, 1, 250000, tzinfo=timezone.utc)

    def typed(lsn: int, minor: int, phase: int = STREAM, **cols: Any) -> ChangeEvent:
        keys = (("tenant", "a"), ("id", 1))
        return ChangeEvent("items", UPSERT, keys, Position(phase, lsn, minor, 0), {**dict(keys), **cols})

    run(spark, sink, [[typed(100, 1, SNAPSHOT, at="2026-11-26T18:30:01.25Z", day="2026-11-26", amount="12.50",
                             ratio=0.5, ok=True)]])
    run(spark, sink, [[typed(100, 3, at=at.isoformat(), day=None, amount=7, ratio=None, ok=False)],
                      [typed(100, 2, amount=1)]], first=1)  # same LSN, an earlier transaction: stale
    row = tables.read(spark, loc).drop(POSITION_COLUMN).collect()[0].asDict()
    assert row == {"tenant": "a", "id": 1, "at": at.replace(tzinfo=None), "day": None, "amount": Decimal("7.00"),
                   "ratio": None, "ok": False}


def test_decimals_of_38_digits_arrive_exactly_and_one_too_wide_is_refused_alone(spark: Any,
                                                                                sink: GuardedDeltaSink) -> None:
    """A value decimal(38,6) cannot hold fails Spark's whole MERGE (NUMERIC_VALUE_OUT_OF_RANGE) and
    stalls every table of the source: it is refused before the write, naming the column."""
    from decimal import Decimal

    types = {"tenant": "string", "id": "bigint", "amount": "decimal(38,6)"}

    def dec(i: int, lsn: int, amount: Decimal) -> ChangeEvent:
        keys = (("tenant", "a"), ("id", i))
        return ChangeEvent("items", UPSERT, keys, Position(STREAM, lsn, 1, 0), {**dict(keys), "amount": amount},
                           types=types)

    wanted = {1: Decimal("99999999999999999999999999999999.999999"),
              2: Decimal("12345678901234567890123456789012.123456"), 4: Decimal("-0.000001")}
    out = run(spark, sink, [[dec(1, 10, wanted[1]), dec(2, 11, wanted[2]),
                             dec(3, 12, Decimal("100000000000000000000000000000000")), dec(4, 13, wanted[4])]])
    assert [r[0].key for r in out[0].rejected] == [("a", 3)]
    assert "column 'amount' (decimal(38,6))" in out[0].rejected[0][1] and out[0].counts.inserted == 3
    rows = replica_rows(spark, sink.replica)
    assert {k[1]: r["amount"] for k, r in rows.items()} == wanted
    assert str(rows[("a", 1)]["amount"]) == "99999999999999999999999999999999.999999"


@PATHS
def test_every_captured_postgres_edge_value_lands_in_delta_as_postgres_holds_it(spark: Any, tmp_path: Path,
                                                                                 on_driver: bool) -> None:
    """The messages of a real PostgreSQL → Debezium run (tests/unit/data/debezium_postgres_edges.jsonl)
    in one batch: each replica value read back from Delta equals PostgreSQL's own text of it; the rows
    whose values Spark cannot hold are dead letters naming those columns, and the REPLICA IDENTITY FULL
    deletes of rows holding 'infinity' and BC dates delete."""
    from lakemirror.sinks.event_contract import EventTxn
    from lakemirror.sinks.events.dead_letters import InMemoryDeadLetters
    from lakemirror.sources.event_stream import EventDecoder, RawEvent, decode_batch
    from lakemirror.sinks.events.delta_sink import delta_replicas
    from lakemirror.sinks.events.guarded_sink import EventBatchApplier
    from lakemirror.supervisor.events.stream_spec import EventStreamSpec
    from tests.unit.test_debezium_edges import NOT_CARRIED, REFUSED, expected, messages, same

    spec = EventStreamSpec("pg", "kafka", table_workers=1, driver_apply=on_driver)
    applier = EventBatchApplier(spec, EventDecoder("kafka"), "test",
                                delta_replicas(lambda t: TableLocation(TableName("dst", "s", t), str(tmp_path / t)), spec),
                                InMemoryDeadLetters(), lambda name: spark)
    def landed(column: str, value: Any) -> Any:
        """A value as Spark reads it back, in the decoder's terms: binary as bytes, a timestamp's
        microseconds as an aware UTC datetime."""
        from datetime import datetime, timedelta, timezone

        if isinstance(value, bytearray):
            return bytes(value)
        if column == "tstz" and value is not None:
            return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=value)
        return value

    captured = messages()
    raws = [RawEvent(m["value"], m["key"], m["topic"], m["partition"], m["offset"]) for m in captured]
    result = applier.apply(decode_batch(raws, applier.decoder, spec.tables), EventTxn("e", 0))
    sink = applier.sinks["edges"]
    assert isinstance(sink, GuardedDeltaSink) and sink.applies_on_driver == on_driver
    # tstz read as microseconds: PySpark turns a TIMESTAMP into the process's local time, which for
    # 0001-01-01T00:00Z west of Greenwich is year 0 (a ValueError), though Delta holds it right.
    frame = tables.read(spark, sink.replica).selectExpr("*", "unix_micros(tstz) AS tstz_us")
    live = {r["id"]: {**r.asDict(), "tstz": r["tstz_us"]} for r in frame.drop("tstz").collect()}
    last: dict[int, dict[str, Any]] = {}
    for m in captured:  # the newest change per key: what the replica holds (or, refused, why not)
        if m["value"] is not None:
            op = json.loads(m["value"])["payload"]["op"]
            last[json.loads(m["key"])["payload"]["id"]] = {"op": op, "pg": m["pg"]}
    refused = {d.change.key[0] if d.change else json.loads(d.raw.key or "{}")["payload"]["id"] for d in result.letters}
    for key, change in sorted(last.items()):
        wants = {c: expected(c, pg, change["op"]) for c, pg in change["pg"].items()}
        if change["op"] == "d":
            assert key not in live, key                       # a delete needs only its key
        elif any(w is REFUSED for w in wants.values()):
            assert key not in live and key in refused, key    # never written with a value bent to fit
        else:
            for column, want in wants.items():
                if want is not NOT_CARRIED and want is not None:
                    got = landed(column, live[key][column])
                    assert same(column, got, want), (key, column, got, want)
                elif want is None:
                    assert live[key][column] is None, (key, column)
    assert {1, 2, 7, 8, 101, 102, 107, 108} <= set(live)
