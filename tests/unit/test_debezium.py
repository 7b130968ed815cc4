"""Decoding Debezium envelopes and the seed's simple events into the change contract.

The envelopes are written in the shapes Debezium 3.7 emits from Postgres with the JSON converter
(RUNTIME_FACTS.md, Kafka): integer ``source.lsn``, ``txId``, ``sequence`` as a JSON string,
``snapshot`` on reads, a key that is the primary key as JSON, a null value after a delete.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from lakemirror.sources.change_event import (
    BASIS_MYSQL_BINLOG, BASIS_POSTGRES_LSN, BASIS_SIMPLE_TIMESTAMP, BASIS_TS_MS, DELETE, SNAPSHOT, STREAM, TRUNCATE,
    UPSERT, ChangeEvent, DeadLetter, Position, Skipped,
)
from lakemirror.sources.debezium import decode_debezium, decode_line, decode_simple


def pg_source(lsn: int | None, tx: int | None = 771, table: str = "customers", snapshot: str = "false",
              ts_ms: int = 1764063000123) -> dict[str, Any]:
    return {"version": "3.7.0.Final", "connector": "postgresql", "name": "shop", "ts_ms": ts_ms,
            "snapshot": snapshot, "db": "shop", "sequence": json.dumps([None if lsn is None else str(lsn - 8),
                                                                       None if lsn is None else str(lsn)]),
            "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1000000, "schema": "public", "table": table,
            "txId": tx, "lsn": lsn, "xmin": None}


def envelope(op: str, before: Any, after: Any, source: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"before": before, "after": after, "source": source, "transaction": None, "op": op,
            "ts_ms": source["ts_ms"] + 4, **extra}


def with_schema(payload: dict[str, Any]) -> str:
    """The JSON converter with schemas.enable=true: {schema, payload}."""
    row = {"type": "struct", "optional": True, "name": "shop.public.customers.Value",
           "fields": [{"type": "int32", "optional": False, "field": "id"},
                      {"type": "string", "optional": True, "field": "name"}]}
    schema = {"type": "struct", "name": "shop.public.customers.Envelope", "optional": False,
              "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                         {"type": "struct", "field": "source", "optional": False, "fields": []},
                         {"type": "string", "optional": False, "field": "op"},
                         {"type": "int64", "optional": True, "field": "ts_ms"}]}
    return json.dumps({"schema": schema, "payload": payload})


def key_with_schema(**key: Any) -> str:
    return json.dumps({"schema": {"type": "struct", "name": "shop.public.customers.Key", "optional": False,
                                  "fields": [{"type": "int32", "optional": False, "field": k} for k in key]},
                       "payload": key})


def change(decoded: Any) -> ChangeEvent:
    assert isinstance(decoded, ChangeEvent), decoded
    return decoded


def test_postgres_insert_with_embedded_schema() -> None:
    value = with_schema(envelope("c", None, {"id": 7, "name": "Ada"}, pg_source(24023128, 771)))
    got = change(decode_debezium(value, key_with_schema(id=7)))
    assert got.table == "customers"
    assert got.op == UPSERT
    assert got.keys == (("id", 7),)
    assert got.columns == {"id": 7, "name": "Ada"}
    assert got.position == Position(STREAM, 24023128, 771, 0)
    assert got.basis == BASIS_POSTGRES_LSN
    assert got.ts_ms == 1764063000123


def test_schemaless_update_and_delete_with_default_replica_identity() -> None:
    # Without REPLICA IDENTITY FULL: an update's before is null, a delete's before holds only the key.
    upd = change(decode_debezium(json.dumps(envelope("u", None, {"id": 7, "name": "Ada L."}, pg_source(24023300, 772))),
                                 json.dumps({"id": 7})))
    assert (upd.op, upd.keys, upd.columns["name"]) == (UPSERT, (("id", 7),), "Ada L.")
    dele = change(decode_debezium(json.dumps(envelope("d", {"id": 7, "name": None}, None, pg_source(24023400, 773))),
                                  json.dumps({"id": 7})))
    assert (dele.op, dele.keys, dele.columns) == (DELETE, (("id", 7),), {})
    assert upd.order() < dele.order()


def test_tombstone_after_a_delete_is_skipped() -> None:
    assert isinstance(decode_debezium(None, json.dumps({"id": 7})), Skipped)
    assert isinstance(decode_line(json.dumps({"key": {"id": 7}, "value": None, "topic": "shop.public.customers"}),
                                  "debezium"), Skipped)


def test_snapshot_read_is_older_than_any_streamed_change_of_the_key() -> None:
    # All snapshot rows share one lsn, which may even be above a streamed change's lsn.
    read = change(decode_debezium(json.dumps(envelope("r", None, {"id": 1, "name": "a"},
                                                      pg_source(99999999, 700, snapshot="last"))),
                                  json.dumps({"id": 1})))
    streamed = change(decode_debezium(json.dumps(envelope("u", None, {"id": 1, "name": "b"}, pg_source(24000000, 701))),
                                      json.dumps({"id": 1})))
    assert read.op == UPSERT and read.position.phase == SNAPSHOT
    assert read.order() < streamed.order()


def test_primary_key_update_is_a_delete_under_the_old_key_then_a_create_under_the_new() -> None:
    src = pg_source(24100000, 900)
    old = change(decode_debezium(json.dumps(envelope("d", {"id": 1, "name": None}, None, src)), json.dumps({"id": 1})))
    new = change(decode_debezium(json.dumps(envelope("c", None, {"id": 2, "name": "x"}, src)), json.dumps({"id": 2})))
    assert old.position == new.position  # one lsn, one txId
    assert (old.op, old.key) == (DELETE, (1,))
    assert (new.op, new.key) == (UPSERT, (2,))


def test_in_transaction_order_from_transaction_metadata() -> None:
    first = envelope("c", None, {"id": 1}, pg_source(500, 9), transaction={"id": "9:500", "total_order": 1,
                                                                          "data_collection_order": 1})
    second = envelope("u", None, {"id": 1}, pg_source(500, 9), transaction={"id": "9:500", "total_order": 2,
                                                                           "data_collection_order": 2})
    a = change(decode_debezium(json.dumps(first), json.dumps({"id": 1})))
    b = change(decode_debezium(json.dumps(second), json.dumps({"id": 1})))
    assert a.position.micro == 1 and b.position.micro == 2 and a.order() < b.order()


def test_transaction_boundary_records_are_skipped() -> None:
    begin = {"status": "BEGIN", "id": "571:53195832", "event_count": None, "data_collections": None, "ts_ms": 1}
    assert isinstance(decode_debezium(json.dumps(begin), json.dumps({"id": "571:53195832"})), Skipped)


def test_truncate_has_no_key_and_covers_the_table() -> None:
    got = change(decode_debezium(json.dumps(envelope("t", None, None, pg_source(24200000, 950))), None))
    assert (got.op, got.keys, got.table) == (TRUNCATE, (), "customers")


def test_mysql_binlog_position() -> None:
    src = {"version": "3.7.0.Final", "connector": "mysql", "name": "shop", "ts_ms": 1764063000000, "snapshot": "false",
           "db": "shop", "table": "orders", "server_id": 223344, "gtid": None, "file": "mysql-bin.000003",
           "pos": 154, "row": 2, "thread": 7, "query": None}
    got = change(decode_debezium(json.dumps(envelope("c", None, {"order_id": 5}, src)), json.dumps({"order_id": 5})))
    assert got.position == Position(STREAM, 3, 154, 2) and got.basis == BASIS_MYSQL_BINLOG
    later_file = {**src, "file": "mysql-bin.000004", "pos": 4, "row": 0}
    later = change(decode_debezium(json.dumps(envelope("u", None, {"order_id": 5}, later_file)),
                                   json.dumps({"order_id": 5})))
    assert got.order() < later.order()


@pytest.mark.timeout(20)
def test_a_hostile_binlog_file_or_transaction_id_is_read_in_linear_time() -> None:
    """The last run of digits is found by one scan: a backtracking search took seconds for 20,000
    digits and hours for these."""
    src = {"connector": "mysql", "ts_ms": 1, "table": "orders", "snapshot": "false",
           "file": "1" * 300_000 + "a1", "pos": 154, "row": 0}
    got = change(decode_debezium(json.dumps(envelope("c", None, {"order_id": 5}, src)), json.dumps({"order_id": 5})))
    assert got.position == Position(STREAM, 1, 154, 0)
    txn = change(decode_simple(simple("INSERT", "2024-01-01T10:00:00Z", "7" * 300_000 + "-x-42", after={"id": 1},
                                      pk={"id": 1})))
    assert txn.position == Position(STREAM, 1704103200_000000, 42)
    assert change(decode_simple(simple("INSERT", "2024-01-01T10:00:00Z", "no digits", after={"id": 1},
                                       pk={"id": 1}))).position == Position(STREAM, 1704103200_000000, 0)


def test_ts_ms_is_the_last_resort_and_says_so() -> None:
    src = {"connector": "sqlserver", "ts_ms": 1764063000999, "table": "t", "snapshot": "false"}
    got = change(decode_debezium(json.dumps(envelope("c", None, {"id": 1}, src)), json.dumps({"id": 1})))
    assert got.position == Position(STREAM, 1764063000999) and got.basis == BASIS_TS_MS
    assert "last resort" in got.basis


def test_bare_envelope_takes_its_key_from_configured_columns() -> None:
    line = json.dumps(envelope("c", None, {"tenant": "a", "id": 3, "v": None}, pg_source(10, 1, table="items")))
    got = change(decode_line(line, "debezium", key_columns={"items": ["tenant", "id"]}))
    assert got.keys == (("tenant", "a"), ("id", 3))
    missing = decode_line(line, "debezium")
    assert isinstance(missing, DeadLetter) and "no key" in missing.reason


def test_record_dump_lines_carry_key_value_and_topic() -> None:
    value = envelope("c", None, {"id": 4}, pg_source(10, 1))
    value["source"].pop("table")
    got = change(decode_line(json.dumps({"topic": "shop.public.accounts", "partition": 0, "offset": 12,
                                         "key": {"id": 4}, "value": value}), "debezium"))
    assert got.table == "accounts" and got.keys == (("id", 4),)


@pytest.mark.parametrize("value, key, reason", [
    ("{not json", None, "not JSON"),
    (json.dumps([1, 2]), None, "not a JSON object"),
    (json.dumps({"op": "x", "source": {"lsn": 1, "table": "t"}, "after": {"id": 1}}), '{"id": 1}', "unknown op"),
    (json.dumps({"op": "c", "after": {"id": 1}}), '{"id": 1}', "no source"),
    (json.dumps({"op": "c", "source": {"lsn": 1, "table": "t"}, "after": None}), '{"id": 1}', "without an 'after'"),
    (json.dumps({"op": "c", "source": {"table": "t"}, "after": {"id": 1}}), '{"id": 1}', "no position"),
    (json.dumps({"op": "c", "source": {"lsn": "abc", "table": "t"}, "after": {"id": 1}}), '{"id": 1}', "not an integer"),
    (json.dumps({"op": "c", "source": {"lsn": -5, "table": "t"}, "after": {"id": 1}}), '{"id": 1}', "outside"),
    (json.dumps({"op": "c", "source": {"lsn": 5, "table": "t"}, "after": {"id": 1}}), '[1]', "not a JSON object of key"),
    (json.dumps({"op": "d", "source": {"lsn": 5, "table": "t"}, "before": None}), None, "no key"),
])
def test_undecodable_messages_are_dead_letters_with_the_reason(value: str, key: str | None, reason: str) -> None:
    got = decode_debezium(value, key)
    assert isinstance(got, DeadLetter), got
    assert reason in got.reason
    assert got.raw == value and got.key == key


# -- the seed's simple form ------------------------------------------------------------------------

def simple(op: str, ts: str, txn: str, after: dict[str, Any] | None = None, before: dict[str, Any] | None = None,
           pk: dict[str, Any] | None = None, table: str = "customers") -> str:
    return json.dumps({"table_name": table, "operation": op, "before": None if before is None else json.dumps(before),
                       "after": None if after is None else json.dumps(after), "timestamp": ts,
                       "transaction_id": txn, "primary_key": None if pk is None else json.dumps(pk)})


def test_simple_insert_as_in_the_seed() -> None:
    got = change(decode_simple(simple("INSERT", "2024-01-01T10:00:00Z", "TXN_1001",
                                      after={"customer_id": "CUST_0001", "name": "John Doe"},
                                      pk={"customer_id": "CUST_0001"})))
    assert (got.table, got.op, got.keys) == ("customers", UPSERT, (("customer_id", "CUST_0001"),))
    assert got.position == Position(STREAM, 1704103200_000000, 1001) and got.basis == BASIS_SIMPLE_TIMESTAMP


def test_simple_delete_and_ordering_by_timestamp_then_transaction() -> None:
    ins = change(decode_simple(simple("INSERT", "2024-01-01T10:00:00Z", "TXN_1001", after={"id": 1}, pk={"id": 1})))
    upd = change(decode_simple(simple("UPDATE", "2024-01-01T10:00:00Z", "TXN_1002", after={"id": 1}, pk={"id": 1})))
    dele = change(decode_simple(simple("DELETE", "2024-01-01T10:00:00.000001+00:00", "TXN_0003", before={"id": 1},
                                       pk={"id": 1})))
    assert ins.order() < upd.order() < dele.order()
    assert dele.op == DELETE and dele.columns == {}


def test_simple_without_primary_key_uses_configured_columns() -> None:
    line = simple("DELETE", "2024-01-01T10:00:00Z", "T1", before={"a": 1, "b": None})
    assert change(decode_simple(line, key_columns={"customers": ["a", "b"]})).keys == (("a", 1), ("b", None))
    assert isinstance(decode_simple(line), DeadLetter)


@pytest.mark.parametrize("line, reason", [
    ("", "not JSON"),
    (json.dumps({"operation": "INSERT"}), "no table_name"),
    (json.dumps({"table_name": "t", "operation": "MERGE"}), "unknown operation"),
    (json.dumps({"table_name": "t", "operation": "INSERT", "timestamp": "yesterday", "after": "{}"}), "ISO 8601"),
    (json.dumps({"table_name": "t", "operation": "INSERT", "timestamp": "2024-01-01T00:00:00Z", "after": "{oops"}),
     "after is not JSON"),
    (json.dumps({"table_name": "t", "operation": "UPDATE", "timestamp": "2024-01-01T00:00:00Z", "after": None}),
     "without an 'after'"),
])
def test_simple_dead_letters(line: str, reason: str) -> None:
    got = decode_simple(line)
    assert isinstance(got, DeadLetter) and reason in got.reason, got


def test_decode_line_rejects_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown event format"):
        decode_line("{}", "avro")
