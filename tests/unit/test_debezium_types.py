"""Debezium's Connect-typed values decode to the source's values and types.

tests/unit/data/debezium_postgres_acct.jsonl holds messages captured from a real PostgreSQL 15 →
Debezium 3.7 (pgoutput, JSON converter with schemas) → Kafka run of scripts/debezium.sh, for

    CREATE TABLE acct(id int PRIMARY KEY, name text, amount numeric(12,3), born date, seen timestamp,
                      at timestamptz, score real, n smallint, big bigint, flag boolean, data bytea,
                      u uuid, j jsonb, t time);
    INSERT INTO acct VALUES (1, 'a', 123.456, '2020-02-29', '2024-01-02 03:04:05.123456',
                             '2024-01-02 03:04:05.5+02', 1.5, 7, 9000000000, true, '\\xdeadbeef',
                             'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"x":1}', '12:34:56.789');  -- snapshot
    UPDATE acct SET amount = -0.5, name = NULL WHERE id = 1;
    UPDATE acct SET id = 2 WHERE id = 1;      -- a primary-key update: d(1), tombstone, c(2)
    DELETE FROM acct WHERE id = 2;            -- d(2), tombstone
"""

from __future__ import annotations

import base64
import json
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from lakemirror.sinks.events.event_rows import convert
from lakemirror.sources.change_event import DELETE, SNAPSHOT, STREAM, UPSERT, ChangeEvent, DeadLetter, Skipped
from lakemirror.sources.connect_types import codec_of
from lakemirror.sources.debezium import decode_debezium

DATA = Path(__file__).parent / "data" / "debezium_postgres_acct.jsonl"


def captured() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines()]


def decoded() -> list:
    return [decode_debezium(m["value"], m["key"], topic=m["topic"]) for m in captured()]


def test_the_snapshot_row_decodes_to_the_postgres_values_and_types() -> None:
    first = decoded()[0]
    assert isinstance(first, ChangeEvent) and first.op == UPSERT and first.position.phase == SNAPSHOT
    assert first.columns == {
        "id": 1, "name": "a", "amount": Decimal("123.456"), "born": date(2020, 2, 29),
        "seen": datetime(2024, 1, 2, 3, 4, 5, 123456), "at": datetime(2024, 1, 2, 1, 4, 5, 500000, tzinfo=timezone.utc),
        "score": 1.5, "n": 7, "big": 9000000000, "flag": True, "data": bytes.fromhex("deadbeef"),
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "j": '{"x": 1}', "t": "12:34:56.789000"}
    assert first.types == {
        "id": "int", "name": "string", "amount": "decimal(12,3)", "born": "date", "seen": "timestamp_ntz",
        "at": "timestamp", "score": "float", "n": "smallint", "big": "bigint", "flag": "boolean", "data": "binary",
        "u": "string", "j": "string", "t": "string"}
    assert str(first.columns["amount"]) == "123.456"  # the scale is kept


def test_a_negative_decimal_and_a_null_after_an_update() -> None:
    update = decoded()[1]
    assert isinstance(update, ChangeEvent) and update.position.phase == STREAM
    assert update.columns["amount"] == Decimal("-0.500") and update.columns["name"] is None


def test_a_primary_key_update_is_a_delete_of_the_old_key_then_an_insert_of_the_new() -> None:
    events = decoded()
    assert isinstance(events[3], Skipped)  # the tombstone
    old, new = events[2], events[4]
    assert (old.op, old.keys, new.op, new.keys) == (DELETE, (("id", 1),), UPSERT, (("id", 2),))
    assert old.position.major == new.position.major and old.order() < new.order()  # one lsn, then total_order
    assert new.columns["amount"] == Decimal("-0.500") and new.types["id"] == "int"


def test_decoded_values_convert_to_their_declared_spark_types() -> None:
    first = decoded()[0]
    for column, value in first.columns.items():
        assert convert(value, first.types[column]) == value or first.types[column] == "timestamp"


@pytest.mark.parametrize("unscaled, scale, want", [(0, 2, "0.00"), (-1, 0, "-1"), (2**70, 3, str(Decimal(2**70).scaleb(-3))),
                                                   (-(2**15), 1, "-3276.8")])
def test_decimal_bytes_are_big_endian_twos_complement(unscaled: int, scale: int, want: str) -> None:
    raw = unscaled.to_bytes((unscaled.bit_length() + 8) // 8 or 1, "big", signed=True)
    codec = codec_of({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                      "parameters": {"scale": str(scale), "connect.decimal.precision": "30"}})
    assert codec.sql_type == "decimal(30,%d)" % scale
    assert str(codec.decode(base64.b64encode(raw).decode())) == want


def test_timestamps_before_the_epoch_and_other_units() -> None:
    micro = codec_of({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    assert micro.decode(-1) == datetime(1969, 12, 31, 23, 59, 59, 999999)
    assert codec_of({"type": "int64", "name": "io.debezium.time.Timestamp"}).decode(1500) == datetime(1970, 1, 1, 0, 0, 1, 500000)
    assert codec_of({"type": "int64", "name": "io.debezium.time.NanoTimestamp"}).decode(2500) == datetime(1970, 1, 1, 0, 0, 0, 2)
    assert codec_of({"type": "int32", "name": "io.debezium.time.Date"}).decode(-1) == date(1969, 12, 31)


def test_a_value_that_does_not_match_its_schema_is_a_dead_letter() -> None:
    first = captured()[0]
    doc = json.loads(first["value"])
    doc["payload"]["after"]["amount"] = "not base64!"
    out = decode_debezium(json.dumps(doc), first["key"], topic=first["topic"])
    assert isinstance(out, DeadLetter) and "amount" in out.reason and "decimal(12,3)" in out.reason
    assert out.table == "acct"  # the envelope's source.table: a dead letter says where it belongs


def test_a_message_that_is_not_json_is_a_dead_letter_of_the_topics_table() -> None:
    out = decode_debezium("{not json", None, topic="shop.public.acct")
    assert isinstance(out, DeadLetter) and out.table == "acct"
