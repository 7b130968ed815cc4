"""The Postgres sink's pure parts: batch plan and sequence guard (on the in-memory twin), type
mapping, and the SQL it composes. No server, no Spark."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest

from lakemirror.errors import SchemaIncompatible
from lakemirror.schema import Column
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.postgres import statements as q
from lakemirror.sinks.postgres.plan import (ReplicaTable, derived_name, diff_replica, plan_batch, position,
                                            snapshot_position, snapshot_rows)
from lakemirror.sinks.postgres.protocol import MemoryReplicaSink
from lakemirror.sinks.postgres.types import UnsupportedType, json_text, postgres_type

TABLE = ReplicaTable("s", "t", ("id",), (Column("id", "bigint"), Column("v", "string")))


def changes(*rows: tuple) -> pa.Table:
    """(id, v, change type, version) rows as a change-feed batch."""
    return pa.table({
        "id": pa.array([r[0] for r in rows], pa.int64()), "v": pa.array([r[1] for r in rows], pa.string()),
        "_change_type": [r[2] for r in rows], "_commit_version": pa.array([r[3] for r in rows], pa.int64()),
        "_commit_timestamp": pa.array([dt.datetime(2024, 1, 1)] * len(rows), pa.timestamp("us"))})


def test_position_orders_versions_first_and_a_delete_before_an_upsert():
    assert position(5, "delete") < position(5, "insert") == position(5, "update_postimage") < position(6, "delete")
    assert snapshot_position(5) == position(5, "insert")


def test_one_winner_per_key_with_the_planner_rule():
    plan = plan_batch(changes((1, "a", "insert", 3), (1, "b", "update_postimage", 4), (1, "x", "update_preimage", 4),
                              (2, "c", "insert", 4), (2, None, "delete", 5), (3, "d", "delete", 6),
                              (3, "e", "insert", 6)), TABLE, preimages_dropped=False)
    winners = {r.values[0]: (r.op, r.values[1], r.position) for r in plan.rows}
    assert winners == {1: ("upsert", "b", 9), 2: ("delete", None, 10), 3: ("upsert", "e", 13)}
    assert (plan.first_version, plan.last_version, plan.upserts, plan.deletes) == (3, 6, 2, 1)


def test_a_null_key_is_a_dead_letter_not_a_row():
    plan = plan_batch(changes((None, "a", "insert", 3), (1, "b", "insert", 3)), TABLE)
    assert [r.values for r in plan.rows] == [(1, "b")]
    assert len(plan.dead) == 1 and "NULL in key column(s) id" in plan.dead[0].reason
    assert plan.dead[0].row_json == '{"id":null,"v":"a"}'


def twin() -> MemoryReplicaSink:
    sink = MemoryReplicaSink(TABLE)
    sink.bootstrap(pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}), version=2, epoch=1)
    return sink


def test_a_replayed_batch_id_changes_nothing_and_reports_the_first_counts():
    sink = twin()
    first = sink.apply(changes((1, "a2", "update_postimage", 3), (3, "c", "insert", 3)), 1, 0)
    again = sink.apply(changes((1, "zzz", "update_postimage", 3)), 1, 0)
    assert first.counts == again.counts == ApplyCounts(1, 1, 0) and again.replayed and not first.replayed
    assert sink.snapshot() == {(1,): {"id": 1, "v": "a2"}, (2,): {"id": 2, "v": "b"}, (3,): {"id": 3, "v": "c"}}
    assert sink.last_applied(1) == 3


def test_a_late_older_change_does_not_move_a_row_backwards_nor_resurrect_a_deleted_key():
    sink = twin()
    sink.apply(changes((1, "new", "update_postimage", 7), (2, None, "delete", 7)), 1, 0)
    late = sink.apply(changes((1, "old", "update_postimage", 5), (2, "zombie", "insert", 6)), 1, 1)
    assert late.counts == ApplyCounts() and sink.snapshot() == {(1,): {"id": 1, "v": "new"}}
    assert sink.tombstones[(2,)][0] == position(7, "delete")
    # A re-insert in the delete's own version ranks after the delete: it lands, and clears the tombstone.
    again = sink.apply(changes((2, "again", "insert", 7)), 1, 2)
    assert again.counts == ApplyCounts(1, 0, 0) and sink.snapshot()[(2,)] == {"id": 2, "v": "again"}
    assert (2,) not in sink.tombstones
    older = sink.apply(changes((1, "older", "update_postimage", 4), (2, None, "delete", 3)), 1, 3)
    assert older.counts == ApplyCounts() and sink.snapshot()[(2,)] == {"id": 2, "v": "again"}


def test_a_tombstone_past_the_horizon_is_purged():
    now = [0.0]
    sink = MemoryReplicaSink(TABLE, tombstone_horizon_seconds=10, now=lambda: now[0])
    sink.bootstrap(pa.table({"id": pa.array([1], pa.int64()), "v": ["a"]}), version=1, epoch=1)
    sink.apply(changes((1, None, "delete", 5)), 1, 0)
    assert (1,) in sink.tombstones
    now[0] = 11.0
    sink.apply(changes((9, "x", "insert", 6)), 1, 1)
    assert (1,) not in sink.tombstones


def test_a_refused_row_goes_to_the_dead_letters_and_the_rest_applies():
    sink = MemoryReplicaSink(TABLE, reject=lambda row: "too long" if len(row["v"] or "") > 3 else None)
    sink.bootstrap(pa.table({"id": pa.array([], pa.int64()), "v": pa.array([], pa.string())}), version=1, epoch=1)
    result = sink.apply(changes((1, "ok", "insert", 2), (2, "toolong", "insert", 2)), 1, 0)
    assert result.dead == 1 and sink.snapshot() == {(1,): {"id": 1, "v": "ok"}}
    assert sink.dead_letters[0][2].reason == "too long"


def test_schema_evolution_adds_columns_and_refuses_the_rest():
    sink = twin()
    wider = ReplicaTable("s", "t", ("id",), (*TABLE.columns, Column("n", "decimal(8,2)")))
    diff = diff_replica(wider, [("id", "bigint"), ("v", "text"), ("_lakemirror_position", "bigint")])
    assert [c.name for c in diff.added] == ["n"] and diff.is_additive
    retyped = diff_replica(TABLE, [("id", "integer"), ("v", "text")])
    assert retyped.retyped == (("id", "integer", "bigint"),) and not retyped.is_additive
    sink.table = wider
    sink.prepare(allow_evolution=True)
    assert ("n", "numeric(8,2)") in sink.replica_columns
    sink.table = ReplicaTable("s", "t", ("id",), (Column("id", "bigint"),))
    with pytest.raises(SchemaIncompatible, match="dropped v"):
        sink.prepare(allow_evolution=True)


@pytest.mark.parametrize("spark, pg", [
    ("tinyint", "smallint"), ("smallint", "smallint"), ("int", "integer"), ("bigint", "bigint"), ("float", "real"),
    ("double", "double precision"), ("decimal(38,18)", "numeric(38,18)"), ("string", "text"), ("varchar(5)", "text"),
    ("boolean", "boolean"), ("date", "date"), ("timestamp", "timestamp with time zone"),
    ("timestamp_ntz", "timestamp without time zone"), ("binary", "bytea"), ("array<int>", "jsonb"),
    ("map<string,int>", "jsonb"), ("struct<a:int,b:array<string>>", "jsonb")])
def test_spark_types_map_to_postgres(spark, pg):
    assert postgres_type(spark) == pg


def test_an_unmapped_type_says_what_to_do():
    with pytest.raises(UnsupportedType, match="exclude_columns"):
        postgres_type("interval day to second")


def test_a_column_of_an_unmapped_type_stops_the_table_naming_the_column():
    """A variant (or interval) column cannot reach PostgreSQL, however often it is retried: the
    table fails at once (a configuration error), with the column and the setting that excludes it."""
    from lakemirror.supervisor.control.failure_policy import failed_event

    with pytest.raises(UnsupportedType) as caught:
        ReplicaTable("s", "events", ("id",), (Column("id", "bigint"), Column("payload", "variant"),
                                              Column("span", "interval day to second"), Column("n", "int")))
    message = str(caught.value)
    assert "'payload' (variant)" in message and "'span' (interval day to second)" in message and "'n'" not in message
    assert "table_overrides: {events: {exclude_columns: [payload, span]}}" in message
    event = failed_event(caught.value, table="events", allow_schema_evolution=True, change_window_policy="resync",
                         rand=0.0)
    assert event.fatal and event.code == "unsupported_type" and "not retried" in event.error


def test_lakemirrors_own_values_become_json():
    assert json_text({"k": decimal.Decimal("1.50"), "z": None, "l": (1, "a")}) == '{"k":"1.50","z":null,"l":[1,"a"]}'
    assert json_text([decimal.Decimal("1E-20"), decimal.Decimal("1.23E+29")]) == \
        '["0.00000000000000000001","123000000000000000000000000000"]'  # a decimal(38,20) from Arrow
    assert json_text({"a": b"\x00\x01", "d": dt.date(2024, 1, 2), "s": "a\x00b"}) == \
        '{"a":"AAE=","d":"2024-01-02","s":"a\ufffdb"}'


#: Nested Spark types as Spark gives them to Arrow, and values of each: empty, NULL, nested in turn.
NESTED = pa.schema([
    ("id", pa.int64()),
    ("m", pa.map_(pa.string(), pa.int32())),                                     # map<string,int>
    ("mi", pa.map_(pa.int32(), pa.string())),                                    # map<int,string>
    ("a", pa.list_(pa.int32())),                                                 # array<int>
    ("am", pa.list_(pa.map_(pa.string(), pa.int32()))),                          # array<map<string,int>>
    ("ma", pa.map_(pa.string(), pa.list_(pa.int32()))),                          # map<string,array<int>>
    ("st", pa.struct([("n", pa.int32()), ("m", pa.map_(pa.string(), pa.string())),
                      ("p", pa.list_(pa.struct([("k", pa.string()), ("v", pa.int32())])))])),
    ("mm", pa.map_(pa.string(), pa.map_(pa.string(), pa.decimal128(5, 2)))),     # map<string,map<string,decimal>>
    ("ms", pa.map_(pa.struct([("x", pa.int32())]), pa.string())),                # map<struct<x:int>,string>
])
NESTED_ROWS = [
    {"id": 1, "m": [], "mi": [], "a": [], "am": [[], [("k", 1)]], "ma": [("e", []), ("n", None)],
     "st": {"n": None, "m": [], "p": []}, "mm": [("o", [])], "ms": []},
    {"id": 2, "m": None, "mi": None, "a": None, "am": None, "ma": None, "st": None, "mm": None, "ms": None},
    {"id": 3, "m": [("a", 1), ("b", None)], "mi": [(1, "x")], "a": [1, None], "am": [None],
     "ma": [("p", [1, 2])], "st": {"n": 7, "m": [("k", "v")], "p": [{"k": "a", "v": 1}, {"k": "b", "v": 2}]},
     "mm": [("o", [("d", decimal.Decimal("1.50"))])], "ms": [({"x": 1}, "one")]},
    # A map whose only entries are 2-element values must still be read by its type: an array of
    # two-element arrays stays an array.
    {"id": 4, "m": [("", 0)], "mi": [(0, "")], "a": [0], "am": [[("", 0)]], "ma": [("", [0])],
     "st": {"n": 0, "m": [("", "")], "p": [None]}, "mm": [("", [("", None)])], "ms": [({"x": None}, None)]},
]
NESTED_JSON = {
    1: {"m": {}, "mi": [], "a": [], "am": [{}, {"k": 1}], "ma": {"e": [], "n": None},
        "st": {"n": None, "m": {}, "p": []}, "mm": {"o": {}}, "ms": []},
    2: {c: None for c in ("m", "mi", "a", "am", "ma", "st", "mm", "ms")},
    3: {"m": {"a": 1, "b": None}, "mi": [[1, "x"]], "a": [1, None], "am": [None], "ma": {"p": [1, 2]},
        "st": {"n": 7, "m": {"k": "v"}, "p": [{"k": "a", "v": 1}, {"k": "b", "v": 2}]},
        "mm": {"o": {"d": "1.50"}}, "ms": [[{"x": 1}, "one"]]},
    4: {"m": {"": 0}, "mi": [[0, ""]], "a": [0], "am": [{"": 0}], "ma": {"": [0]},
        "st": {"n": 0, "m": {"": ""}, "p": [None]}, "mm": {"": {"": None}}, "ms": [[{"x": None}, None]]},
}
NESTED_TABLE = ReplicaTable("s", "nested", ("id",), (
    Column("id", "bigint", False), Column("m", "map<string,int>"), Column("mi", "map<int,string>"),
    Column("a", "array<int>"), Column("am", "array<map<string,int>>"), Column("ma", "map<string,array<int>>"),
    Column("st", "struct<n:int,m:map<string,string>,p:array<struct<k:string,v:int>>>"),
    Column("mm", "map<string,map<string,decimal(5,2)>>"), Column("ms", "map<struct<x:int>,string>")))


def as_changes(rows: pa.Table, version: int = 5) -> pa.Table:
    """``rows`` inserted at ``version``, as a change-feed batch."""
    n = rows.num_rows
    return (rows.append_column("_change_type", pa.array(["insert"] * n))
            .append_column("_commit_version", pa.array([version] * n, pa.int64()))
            .append_column("_commit_timestamp", pa.array([dt.datetime(2024, 1, 1)] * n, pa.timestamp("us"))))


def _json_by_id(rows) -> dict:
    names = NESTED_TABLE.column_names
    return {r[0]: {n: None if v is None else json.loads(v) for n, v in zip(names[1:], r[1:len(names)])}
            for r in rows}


def test_nested_json_takes_its_shape_from_the_column_type_on_every_path():
    """An empty map<string,…> is ``{}`` (Arrow gives every map as pairs, so an empty map and an
    empty array look alike as values): the bootstrap snapshot, a stream's batch and a cycle's
    batch (both plan_batch) all shape nested values by the column's type, at every depth."""
    snapshot = pa.Table.from_pylist(NESTED_ROWS, schema=NESTED)
    rows, dead = snapshot_rows(snapshot, NESTED_TABLE, 3)
    assert not dead and _json_by_id(rows) == NESTED_JSON
    plan = plan_batch(as_changes(snapshot), NESTED_TABLE)
    assert _json_by_id(r.values for r in plan.rows) == NESTED_JSON
    sink = MemoryReplicaSink(NESTED_TABLE)
    sink.bootstrap(snapshot, version=3, epoch=1)
    assert json.loads(sink.snapshot()[(1,)]["m"]) == {}


def test_a_dead_letter_keeps_nested_values_shaped_by_their_type():
    snapshot = pa.Table.from_pylist([{**NESTED_ROWS[0], "id": None}], schema=NESTED)
    rows, dead = snapshot_rows(snapshot, NESTED_TABLE, 3)
    assert rows == [] and json.loads(dead[0].row_json) == {"id": None, **NESTED_JSON[1]}
    assert json.loads(plan_batch(as_changes(snapshot), NESTED_TABLE).dead[0].row_json) == {"id": None, **NESTED_JSON[1]}


def test_identifiers_are_quoted_and_values_are_literals():
    hostile = ReplicaTable('we"ird', "t%1; DROP", ("k y",), (Column("k y", "int"), Column('v"', "string")))
    upsert = q.guarded_upsert(hostile).as_string(None)
    assert '"we""ird"."t%1; DROP"' in upsert and '"k y"' in upsert and '"v"""' in upsert
    assert "WHERE t._lakemirror_position < EXCLUDED._lakemirror_position" in upsert.replace('"', "")
    claim = q.claim_batch("s", "pipe'line", "t", 1, 7, None, 9).as_string(None)
    assert "'pipe''line'" in claim and "NULL" in claim and "ON CONFLICT DO NOTHING RETURNING 1" in claim
    one = q.guarded_delete(TABLE, row_no=3).as_string(None)
    assert '"_lm_row" = 3' in one and '"_lakemirror_position" < s."_lm_position"' in one


def test_long_derived_names_fit_postgres_identifiers():
    name = derived_name("x" * 80, "__lm_tombstones")
    assert len(name.encode()) <= 63 and name.endswith("__lm_tombstones")
    assert derived_name("x" * 80, "__lm_tombstones") != derived_name("x" * 79 + "y", "__lm_tombstones")
    assert derived_name("short", "__lm_pk") == "short__lm_pk"
