"""Every PostgreSQL value at the edge of its type arrives exactly as PostgreSQL holds it, or as a dead
letter that names each column the replica cannot hold; a delete needs only its key.

tests/unit/data/debezium_postgres_edges.jsonl holds every message of a real PostgreSQL 15 → Debezium
3.7 → Kafka run (scripts/capture-debezium-edges.py: the table, its rows and the changes are there),
each beside PostgreSQL's own text (``::text``) and JSON (``to_json``) of the row it describes, read
back from the server. The oracle below reads PostgreSQL's text, never Debezium's encoding.

What Debezium itself does not carry (so no decoder can): numeric ``NaN``/``±Infinity`` arrive as
NULL (Debezium's precise decimal mode), an unconstrained numeric's trailing zeros (``1.500``
arrives as 1.5, the same number), a multi-dimensional array arrives as NULLs, a BC date of
the initial snapshot arrives as the same date AD, and an interval arrives as microseconds with a
month of 30.4375 days (clamped to the int64 range).
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from lakemirror.sinks.events.event_rows import convert
from lakemirror.sources.change_event import DELETE, UPSERT, ChangeEvent, DeadLetter, Skipped
from lakemirror.sources.connect_types import codec_of, decimal_text
from lakemirror.sources.debezium import decode_debezium

DATA = Path(__file__).parent / "data" / "debezium_postgres_edges.jsonl"
REFUSED = object()      # the replica's type cannot hold PostgreSQL's value: the upsert is a dead letter
NOT_CARRIED = object()  # Debezium's message does not carry PostgreSQL's value (see the module docstring)
_INT64 = 2**63

TYPES = {"id": "int", "n38_6": "decimal(38,6)", "n38_0": "decimal(38,0)", "n_var": "string", "n_neg": "decimal(7,0)",
         "n_small": "decimal(5,5)", "n_wide": "string", "i2": "smallint", "i4": "int", "i8": "bigint", "f4": "float",
         "f8": "double", "b": "boolean", "t": "string", "vc": "string", "ch": "string", "ba": "binary", "u": "string",
         "j": "string", "jb": "string", "ai": "string", "at": "string", "d": "date", "ts": "timestamp_ntz",
         "tstz": "timestamp", "tm": "string", "ttz": "string", "iv": "bigint", "mo": "decimal(38,2)"}


def messages() -> list[dict[str, Any]]:
    return [json.loads(line) for line in DATA.read_text().splitlines()]


def changes(op: str) -> list[dict[str, Any]]:
    return [m for m in messages() if m["value"] is not None and json.loads(m["value"])["payload"]["op"] == op]


def _op(m: dict[str, Any]) -> str:
    return str(json.loads(m["value"])["payload"]["op"])


# -- the oracle: PostgreSQL's text -> the value the replica must hold --------------------------------


def _numeric(text: str) -> Any:
    return NOT_CARRIED if text in ("NaN", "Infinity", "-Infinity") else Decimal(text)


def _money(text: str) -> Decimal:
    negative = text.startswith("-")
    return Decimal(("-" if negative else "") + text.lstrip("-").lstrip("$").replace(",", ""))


def _float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _date(text: str, op: str) -> Any:
    if text in ("infinity", "-infinity"):
        return REFUSED
    if text.endswith(" BC"):
        return NOT_CARRIED if op == "r" else REFUSED  # the snapshot sends 4713 BC as 4713 AD
    year = text.split("-", 1)[0]
    return REFUSED if len(year) > 4 else date.fromisoformat(text)


def _timestamp(text: str, zoned: bool) -> Any:
    if text in ("infinity", "-infinity") or text.endswith(" BC") or len(text.split("-", 1)[0]) > 4:
        return REFUSED
    when = datetime.fromisoformat(text + (":00" if zoned else ""))
    return when.astimezone(timezone.utc) if zoned else when


def _time(text: str) -> str:
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(6, '0')}"


def _zoned_time(text: str) -> str:
    """Debezium's ZonedTime: the time of day in UTC, 'Z', the fraction only when there is one."""
    found = re.fullmatch(r"(\d\d):(\d\d):(\d\d)(\.\d+)?([+-])(\d\d)(?::(\d\d))?", text)
    assert found is not None, text
    h, m, s, fraction, sign, oh, om = found.groups()
    seconds = int(h) * 3600 + int(m) * 60 + int(s)
    if seconds < 86400:
        offset = (int(oh) * 3600 + int(om or 0) * 60) * (1 if sign == "+" else -1)
        seconds = (seconds - offset) % 86400
    return f"{seconds // 3600:02}:{seconds // 60 % 60:02}:{seconds % 60:02}{fraction or ''}Z"


def _interval(text: str) -> int:
    """Debezium's MicroDuration: years and months at 30.4375 days a month, clamped to int64."""
    micros = Decimal(0)
    for amount, unit in re.findall(r"(-?\d+) (year|mon|day)s?", text):
        days = {"year": Decimal("365.25"), "mon": Decimal("30.4375"), "day": Decimal(1)}[unit]
        micros += Decimal(amount) * days * 86_400_000_000
    clock = re.search(r"(-?)(\d\d):(\d\d):(\d\d)(\.\d+)?$", text)
    if clock:
        sign, h, m, s, fraction = clock.groups()
        part = (int(h) * 3600 + int(m) * 60 + int(s)) * 1_000_000 + int(Decimal(fraction or "0") * 1_000_000)
        micros += -part if sign else part
    return max(-_INT64, min(_INT64 - 1, int(micros)))


def expected(column: str, pg: dict[str, str | None], op: str) -> Any:
    text, as_json = pg["text"], pg["json"]
    if text is None:
        return None
    if column in ("n38_6", "n38_0", "n_var", "n_neg", "n_small", "n_wide"):
        return _numeric(text)
    if column == "mo":
        return _money(text)
    if column in ("id", "i2", "i4", "i8"):
        return int(text)
    if column in ("f4", "f8"):
        return float(text)
    if column == "b":
        return text == "true"
    if column == "ba":
        return bytes.fromhex(text[2:])
    if column in ("ai", "at"):
        items = json.loads(str(as_json), parse_float=Decimal)
        return NOT_CARRIED if items and isinstance(items[0], list) else items
    if column == "d":
        return _date(text, op)
    if column in ("ts", "tstz"):
        return _timestamp(text, column == "tstz")
    if column == "tm":
        return _time(text)
    if column == "ttz":
        return _zoned_time(text)
    if column == "iv":
        return _interval(text)
    if column in ("j", "jb"):
        return text  # json and jsonb: PostgreSQL's text of the document itself
    return json.loads(str(as_json))  # text, varchar, char (blank-padded: ::text trims), uuid


def same(column: str, got: Any, want: Any) -> bool:
    if column == "n_wide":  # wider than Spark's decimals: the exact text at the column's scale
        return got == decimal_text(want)
    if column == "n_var":  # no fixed scale: the exact value as positional text (Debezium drops the
        return got == decimal_text(Decimal(got)) and Decimal(got) == want  # trailing zeros of 1.500)
    if isinstance(want, Decimal):
        return isinstance(got, Decimal) and got == want and decimal_text(got) == decimal_text(want)
    if column in ("f4", "f8"):
        fit = _float32 if column == "f4" else float
        return (math.isnan(got) and math.isnan(want)) or (fit(got) == fit(want) and math.copysign(1, got) == math.copysign(1, want))
    if column in ("ai", "at"):
        return json.loads(got, parse_float=Decimal) == want
    return bool(got == want) and type(got) is type(want)


def _cases(ops: str) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{_op(m)}:{json.loads(m['key'])['payload']['id']}", m) for m in messages()
            if m["value"] is not None and _op(m) in ops]


@pytest.mark.parametrize("name, message", _cases("rcu"))
def test_every_value_arrives_as_postgres_holds_it_or_the_row_is_a_dead_letter_naming_each_column(
        name: str, message: dict[str, Any]) -> None:
    op = _op(message)
    out = decode_debezium(message["value"], message["key"], topic=message["topic"])
    wants = {c: expected(c, pg, op) for c, pg in message["pg"].items()}
    refused = sorted(c for c, w in wants.items() if w is REFUSED)
    if refused:
        assert isinstance(out, DeadLetter), (name, out)
        assert out.table == "edges"
        named = sorted(re.findall(r"column '(\w+)'", out.reason))
        assert named == refused, out.reason
        return
    assert isinstance(out, ChangeEvent) and out.op == UPSERT, (name, out)
    assert dict(out.types) == TYPES
    for column, want in wants.items():
        got = out.columns[column]
        if want is NOT_CARRIED:
            continue
        if want is None:
            assert got is None, (name, column, got)
            continue
        assert same(column, got, want), (name, column, got, want, message["pg"][column])
        converted = convert(got, out.types[column])  # the replica's type holds it exactly
        assert same(column, converted, want) or column == "tstz", (name, column, converted)


def test_the_cases_cover_snapshot_stream_update_and_every_edge() -> None:
    ops = [_op(m) for m in messages() if m["value"] is not None]
    assert (ops.count("r"), ops.count("c"), ops.count("u"), ops.count("d")) == (8, 8, 2, 4)
    assert sum(1 for m in messages() if m["value"] is None) == 4  # the tombstones after the deletes


@pytest.mark.parametrize("name, message", _cases("d"))
def test_a_delete_needs_only_its_key_whatever_else_its_before_image_holds(name: str, message: dict[str, Any]) -> None:
    """REPLICA IDENTITY FULL: the before image holds 'infinity', BC and far-future values (rows 103-106)."""
    key = json.loads(message["key"])["payload"]["id"]
    with_key = decode_debezium(message["value"], message["key"], topic=message["topic"])
    bare = decode_debezium(message["value"], None, key_columns={"edges": ("id",)}, topic=message["topic"])
    for out in (with_key, bare):
        assert isinstance(out, ChangeEvent) and out.op == DELETE, (name, out)
        assert out.keys == (("id", key),) and out.table == "edges"


def test_tombstones_are_skipped() -> None:
    tombstones = [m for m in messages() if m["value"] is None]
    assert all(isinstance(decode_debezium(None, m["key"], topic=m["topic"]), Skipped) for m in tombstones)


def test_python_28_digit_rounding_is_gone() -> None:
    """The regression: Decimal(int).scaleb(-6) kept 28 digits of numeric(38,6)."""
    codec = codec_of({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                      "parameters": {"scale": "6", "connect.decimal.precision": "38"}})
    unscaled = 12345678901234567890123456789012123456
    raw = base64.b64encode(unscaled.to_bytes(17, "big", signed=True)).decode()
    assert decimal_text(codec.decode(raw)) == "12345678901234567890123456789012.123456"
    nines = base64.b64encode((10**38 - 1).to_bytes(17, "big", signed=True)).decode()
    assert convert(codec.decode(nines), "decimal(38,6)") == Decimal("99999999999999999999999999999999.999999")


@pytest.mark.parametrize("scale, unscaled, text", [
    (0, 123456789012345678901234567890, "123456789012345678901234567890"),
    (20, 1, "0.00000000000000000001"),
    (3, 1500, "1.500"),
    (0, 10**51 + 7, "1" + "0" * 50 + "7"),
    (40, -(10**60 + 1), "-100000000000000000000.0000000000000000000000000000000000000001"),
])
def test_variable_scale_decimals_are_exact_positional_text(scale: int, unscaled: int, text: str) -> None:
    codec = codec_of({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"})
    raw = base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()
    assert codec.sql_type == "string" and codec.decode({"scale": scale, "value": raw}) == text


def test_decimals_as_json_numbers_are_parsed_exactly() -> None:
    """The JSON converter's decimal.format=NUMERIC writes decimals as JSON numbers: never read as doubles."""
    schema = {"type": "struct", "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": []},
        {"field": "after", "type": "struct", "optional": True, "fields": [
            {"field": "id", "type": "int32"},
            {"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
             "parameters": {"scale": "6", "connect.decimal.precision": "38"}},
            {"field": "ratio", "type": "double"}]}]}
    payload = ('{"op": "c", "source": {"table": "t", "lsn": 5}, "after": {"id": 1, '
               '"amount": 12345678901234567890123456789012.123456, "ratio": 0.1}}')
    out = decode_debezium(json.dumps({"schema": schema, "payload": None})[:-5] + payload + "}",
                          '{"id": 1}', topic="db.public.t")
    assert isinstance(out, ChangeEvent), out
    assert out.columns["amount"] == Decimal("12345678901234567890123456789012.123456")
    assert out.columns["ratio"] == 0.1 and isinstance(out.columns["ratio"], float)


def test_a_negative_scale_lands_as_a_whole_decimal() -> None:
    """PostgreSQL 15's numeric(5,-2), which Debezium declares with the scale 2046."""
    codec = codec_of({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                      "parameters": {"scale": "2046", "connect.decimal.precision": "5"}})
    raw = base64.b64encode((9999900 * 10**2046).to_bytes(860, "big", signed=True)).decode()
    assert codec.sql_type == "decimal(7,0)" and decimal_text(codec.decode(raw)) == "9999900"
    plain = codec_of({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                      "parameters": {"scale": "-2", "connect.decimal.precision": "5"}})
    assert plain.sql_type == "decimal(7,0)" and decimal_text(plain.decode(base64.b64encode(b"\x01").decode())) == "100"


@pytest.mark.parametrize("kind, value, reason", [
    ("int16", 32768, "does not fit 16 bits"), ("int32", True, "not an integer"), ("float", "nan", "not a number"),
    ("boolean", 1, "not a boolean"), ("string", 5, "not a string"),
])
def test_a_value_that_breaks_its_declared_type_is_refused(kind: str, value: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        codec_of({"type": kind}).decode(value)
