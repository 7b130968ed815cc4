"""Kafka Connect's typed values, as the JSON converter with schemas writes them, back into Python values.

Pure: no pyspark import. A Debezium message written with ``schemas.enable=true`` carries, beside
each row image, the Connect schema of every column: a primitive type (``int16``, ``int64``,
``bytes`` …) and, for logical types, a ``name`` with ``parameters``. The JSON value alone is not
the column's value: a ``NUMERIC(12,3)`` is base64 bytes of the unscaled big-endian integer
(``"AeJA"`` is 123.456 at scale 3), a ``DATE`` is a count of days, a ``TIMESTAMP`` a count of
microseconds. :func:`column_codecs` reads a row image's schema once; :func:`decode_row` turns a row
image into Python values (``Decimal``, ``date``, ``datetime`` …) and names each column's Spark SQL
type, so a replica created from the events gets the source's types, not guesses from JSON.

Mapping (Debezium 3.7, PostgreSQL connector, default modes; anything unknown keeps its JSON value):

==================================================  =======================  ==================
Connect type / logical name                          Python value             Spark SQL type
==================================================  =======================  ==================
int8 / int16 / int32 / int64                         int (range checked)      tinyint / smallint / int / bigint
float32 / float64 (``float`` / ``double``)           float ("NaN", "Infinity" float / double
                                                     and "-Infinity" too)
boolean, string                                      bool, str                boolean, string
bytes                                                bytes (base64 decoded)   binary
``org.apache.kafka.connect.data.Decimal``            Decimal at its scale     decimal(p, s), see below
``io.debezium.data.VariableScaleDecimal``            exact decimal text       string (no fixed scale)
``io.debezium.time.Date``, connect ``Date``          date (days since epoch)  date
``io.debezium.time.Timestamp`` (ms), ``Micro…`` (µs), ``Nano…`` (ns), connect ``Timestamp``
                                                     naive datetime           timestamp_ntz
``io.debezium.time.ZonedTimestamp`` (ISO text)       aware datetime (UTC)     timestamp
``io.debezium.time.Time`` / ``MicroTime`` / ``NanoTime``, connect ``Time``
                                                     "HH:MM:SS.ffffff" text   string
``io.debezium.data.Json``, ``Uuid``, ``Enum`` …      str                      string
array (items decoded by their own schema), map,      JSON text                string
struct
==================================================  =======================  ==================

Decimals are exact at any precision: the unscaled integer is scaled without a context (never
rounded to Python's 28 digits), and decimal text is plain positional text (``0.00000000000000000001``,
never ``1E-20``). A ``Decimal(p, s)`` lands as ``decimal(p, s)`` while Spark holds it (p <= 38); a
scale above the precision (PostgreSQL's ``numeric(3,5)``) as ``decimal(s, s)``; a negative scale
(PostgreSQL 15's ``numeric(5,-2)``, which Debezium declares as the unsigned 11-bit scale 2046) as
``decimal(p - s, 0)``; anything wider as its exact decimal text in a ``string`` column.

Values the replica's types cannot hold are refused here with the column, its type and the reason
(the message becomes a dead letter, the stream goes on): dates and timestamps outside
0001-01-01..9999-12-31 (PostgreSQL's BC and far-future values), PostgreSQL's ``infinity`` and
``-infinity`` (which Debezium sends as the int64 bounds, or as the text ``infinity`` for a
``timestamptz``), integers outside their width.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any, Callable, Mapping

_EPOCH_DATE = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1)
_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_PRIMITIVE_SQL = {"int8": "tinyint", "int16": "smallint", "int32": "int", "int64": "bigint", "float": "float",
                  "float32": "float", "double": "double", "float64": "double", "boolean": "boolean",
                  "string": "string", "bytes": "binary"}
_FLOAT_KINDS = ("float", "float32", "double", "float64")
SPARK_MAX_PRECISION = 38
#: PostgreSQL's numeric scales are -1000..1000; Debezium declares a negative scale s as s + 2048
#: (the 11 bits of the type modifier read unsigned): numeric(5,-2) arrives with scale 2046.
_PG_MAX_SCALE, _PG_SCALE_WRAP = 1000, 2048
#: Exact arithmetic: no rounding at any number of digits (Python's default context keeps 28).
EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class BadValue(ValueError):
    """A value that does not match its declared Connect type, or that the replica's type cannot hold."""


class NeedsExactNumbers(Exception):
    """A decimal arrived as a JSON number (the JSON converter's ``decimal.format=NUMERIC``) and was
    parsed as a binary float: the message is to be parsed again with its numbers kept exact."""


@dataclass(frozen=True)
class Codec:
    """How one column's JSON value becomes its Python value, and the Spark SQL type it lands as.

    ``nested`` decodes the same JSON value for a place inside a JSON text (an array's item): a
    decimal stays a :class:`~decimal.Decimal` there, to be written as a JSON number."""

    sql_type: str
    decode: Callable[[Any], Any]
    nested: Callable[[Any], Any] | None = None

    def inner(self, value: Any) -> Any:
        return (self.nested or self.decode)(value)


def decimal_text(value: Decimal) -> str:
    """A decimal's exact positional text at its own scale: ``0.00000000000000000001``, ``1.500``,
    ``123000000000000000000000000000`` (never the ``1E-20`` or ``1.23E+29`` forms ``str`` gives)."""
    return format(value, "f")


def _bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        raise BadValue(f"{value!r} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadValue(f"{value!r} is not base64") from None


def _unscaled(value: Any, scale: int) -> Decimal:
    """A Connect Decimal, exactly: base64 of the big-endian two's-complement unscaled integer (or,
    with ``decimal.format=NUMERIC``, a JSON number, parsed exactly)."""
    if isinstance(value, float):
        raise NeedsExactNumbers()
    if isinstance(value, (int, Decimal)) and not isinstance(value, bool):
        number = Decimal(value)
        if not number.is_finite():
            raise BadValue(f"{value!r} is not a finite decimal")
        exact = number.quantize(Decimal(1).scaleb(-scale, EXACT), context=EXACT)
        if exact != number:
            raise BadValue(f"{value} has more than {scale} digits after the point")
        return exact
    raw = _bytes(value)
    return EXACT.scaleb(Decimal(int.from_bytes(raw, "big", signed=True)), -scale)


def _variable_decimal(value: Any) -> Decimal:
    if not isinstance(value, dict) or "scale" not in value or "value" not in value:
        raise BadValue(f"{value!r} is not a VariableScaleDecimal struct (scale, value)")
    scale = value["scale"]
    if isinstance(scale, bool) or not isinstance(scale, int):
        raise BadValue(f"the scale {scale!r} is not an integer")
    return _unscaled(value["value"], scale)


def _integer(bits: int | None = None) -> Callable[[Any], int]:
    def decode(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadValue(f"{value!r} is not an integer")
        if bits is not None and not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise BadValue(f"{value} does not fit {bits} bits")
        return value
    return decode


_int = _integer()


def _float(value: Any) -> float:
    if isinstance(value, str) and value in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[value]  # the JSON converter writes NaN and the infinities as text
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise BadValue(f"{value!r} is not a number")
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadValue(f"{value!r} is not a boolean")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise BadValue(f"{value!r} is not a string")
    return value


def _infinity(n: int) -> str | None:
    """PostgreSQL's ``infinity`` as Debezium sends it in an int64 time (the int64 bounds)."""
    return "'infinity'" if n == _INT64_MAX else "'-infinity'" if n == _INT64_MIN else None


def _since_epoch(unit_micros: float) -> Callable[[Any], datetime]:
    def decode(value: Any) -> datetime:
        n = _int(value)
        special = _infinity(n)
        if special is not None:
            raise BadValue(f"PostgreSQL's {special} has no Spark timestamp (they hold 0001-01-01..9999-12-31)")
        micros = n * unit_micros if unit_micros >= 1 else n // int(1 / unit_micros)
        try:
            return _EPOCH + timedelta(microseconds=int(micros))
        except OverflowError:
            raise BadValue(f"{n} (since 1970-01-01) is outside the timestamps Spark holds "
                           f"(0001-01-01..9999-12-31)") from None
    return decode


def _zoned(value: Any) -> datetime:
    if not isinstance(value, str):
        raise BadValue(f"{value!r} is not an ISO 8601 timestamp")
    if value in ("infinity", "-infinity"):
        raise BadValue(f"PostgreSQL's '{value}' has no Spark timestamp (they hold 0001-01-01..9999-12-31)")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        if value[:1] in ("+", "-"):  # a year before 1 or after 9999 (ISO 8601's expanded years)
            raise BadValue(f"{value!r} is outside the timestamps Spark holds (0001-01-01..9999-12-31)") from None
        raise BadValue(f"{value!r} is not an ISO 8601 timestamp") from None
    try:
        return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    except OverflowError:
        raise BadValue(f"{value!r} is outside the timestamps Spark holds (0001-01-01..9999-12-31)") from None


def _time_of_day(unit_micros: float) -> Callable[[Any], str]:
    def decode(value: Any) -> str:
        n = _int(value)
        micros = int(n * unit_micros) if unit_micros >= 1 else n // int(1 / unit_micros)
        seconds, micro = divmod(micros, 1_000_000)
        minutes, second = divmod(seconds, 60)
        hour, minute = divmod(minutes, 60)
        return f"{hour:02}:{minute:02}:{second:02}.{micro:06}"
    return decode


def _days(value: Any) -> date:
    n = _int(value)
    special = _infinity(n)
    if special is not None:
        raise BadValue(f"PostgreSQL's {special} has no Spark date (they hold 0001-01-01..9999-12-31)")
    try:
        return _EPOCH_DATE + timedelta(days=n)
    except OverflowError:
        raise BadValue(f"{n} days from 1970-01-01 is outside the dates Spark holds (0001-01-01..9999-12-31)") from None


def json_value_text(value: Any) -> str:
    """``value`` (decoded JSON: dicts, lists, decimals, dates, bytes …) as JSON text: decimals as exact
    JSON numbers, NaN and the infinities as text (JSON has no such number), dates and times in ISO
    8601, bytes as PostgreSQL writes them (``"\\x…"`` hex), non-ASCII characters as themselves."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return decimal_text(value) if value.is_finite() else json.dumps(str(value))
    if isinstance(value, float):
        return json.dumps(value) if value == value and value not in (float("inf"), float("-inf")) else \
            json.dumps("NaN" if value != value else "Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (date, datetime)):
        return json.dumps(value.isoformat())
    if isinstance(value, (bytes, bytearray)):
        return json.dumps("\\x" + bytes(value).hex())
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json_value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)}: {json_value_text(v)}"
                               for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "}"
    return json.dumps(value if isinstance(value, str) else str(value), ensure_ascii=False)


def _json_text(value: Any) -> Any:
    return value if isinstance(value, str) else json_value_text(value)


def _same(value: Any) -> Any:
    return value


def decimal_sql_type(precision: int, scale: int) -> str | None:
    """The Spark SQL decimal type that holds every value of a ``Decimal(precision, scale)`` exactly
    (None when none does: more than 38 digits)."""
    if scale < 0:
        precision, scale = precision - scale, 0
    precision = max(precision, scale)
    return f"decimal({precision},{scale})" if 0 < precision <= SPARK_MAX_PRECISION else None


def _decimal_codec(params: Mapping[str, Any]) -> Codec:
    try:
        declared = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", SPARK_MAX_PRECISION))
    except (TypeError, ValueError):
        raise BadValue(f"decimal parameters {dict(params)!r} are not numbers") from None
    scale = declared - _PG_SCALE_WRAP if _PG_MAX_SCALE < declared < _PG_SCALE_WRAP else declared

    def exact(value: Any) -> Decimal:
        number = _unscaled(value, declared)
        if scale < 0:  # an integer at a negative scale: at scale 0 (exact: no digit after the point)
            whole = number.quantize(Decimal(1), context=EXACT)
            if whole != number:
                raise BadValue(f"{decimal_text(number)} is not a whole number at scale {scale}")
            return whole
        return number

    sql_type = decimal_sql_type(precision, scale)
    if sql_type is None:  # wider than Spark's decimals: the exact text
        return Codec("string", lambda v: decimal_text(exact(v)), exact)
    return Codec(sql_type, exact)


_LOGICAL: dict[str, Callable[[Mapping[str, Any]], Codec]] = {
    "org.apache.kafka.connect.data.Decimal": _decimal_codec,
    "io.debezium.data.VariableScaleDecimal": lambda _: Codec("string", lambda v: decimal_text(_variable_decimal(v)),
                                                             _variable_decimal),
    "io.debezium.time.Date": lambda _: Codec("date", _days),
    "org.apache.kafka.connect.data.Date": lambda _: Codec("date", _days),
    "io.debezium.time.Timestamp": lambda _: Codec("timestamp_ntz", _since_epoch(1000)),
    "org.apache.kafka.connect.data.Timestamp": lambda _: Codec("timestamp_ntz", _since_epoch(1000)),
    "io.debezium.time.MicroTimestamp": lambda _: Codec("timestamp_ntz", _since_epoch(1)),
    "io.debezium.time.NanoTimestamp": lambda _: Codec("timestamp_ntz", _since_epoch(0.001)),
    "io.debezium.time.ZonedTimestamp": lambda _: Codec("timestamp", _zoned),
    "io.debezium.time.Time": lambda _: Codec("string", _time_of_day(1000)),
    "org.apache.kafka.connect.data.Time": lambda _: Codec("string", _time_of_day(1000)),
    "io.debezium.time.MicroTime": lambda _: Codec("string", _time_of_day(1)),
    "io.debezium.time.NanoTime": lambda _: Codec("string", _time_of_day(0.001)),
}


def _array_codec(field_schema: Mapping[str, Any]) -> Codec:
    items = field_schema.get("items")
    item = codec_of(items) if isinstance(items, dict) else None

    def decode_items(value: Any) -> Any:
        if not isinstance(value, list):
            raise BadValue(f"{value!r} is not an array")
        return [None if v is None or item is None else item.inner(v) for v in value]

    return Codec("string", lambda v: json_value_text(decode_items(v)), decode_items)


def _struct_codec(field_schema: Mapping[str, Any]) -> Codec:
    fields = column_codecs(field_schema)

    def decode_fields(value: Any) -> Any:
        if not isinstance(value, dict) or fields is None:
            return value
        return {k: None if v is None or k not in fields else fields[k].inner(v) for k, v in value.items()}

    return Codec("string", lambda v: _json_text(decode_fields(v)), decode_fields)


def codec_of(field_schema: Mapping[str, Any]) -> Codec:
    """The codec of one field of a Connect struct schema."""
    name, kind = field_schema.get("name"), field_schema.get("type")
    if isinstance(name, str) and name in _LOGICAL:
        return _LOGICAL[name](field_schema.get("parameters") or {})
    if kind == "bytes":
        return Codec("binary", _bytes)
    if kind == "array":
        return _array_codec(field_schema)
    if kind == "struct":
        return _struct_codec(field_schema)
    if kind == "map":
        return Codec("string", _json_text, _same)
    if kind in _INT_BITS:
        return Codec(_PRIMITIVE_SQL[kind], _integer(_INT_BITS[kind]))
    if kind in _FLOAT_KINDS:
        return Codec(_PRIMITIVE_SQL[kind], _float)
    if kind == "boolean":
        return Codec("boolean", _boolean)
    if kind == "string":
        return Codec("string", _string)
    return Codec("string", _json_text, _same)


def column_codecs(struct_schema: Mapping[str, Any] | None) -> dict[str, Codec] | None:
    """Codecs of a row image's columns from its struct schema (None when there is no schema)."""
    if not isinstance(struct_schema, dict) or struct_schema.get("type") != "struct":
        return None
    fields = struct_schema.get("fields")
    if not isinstance(fields, list):
        return None
    return {f["field"]: codec_of(f) for f in fields if isinstance(f, dict) and isinstance(f.get("field"), str)}


def envelope_field(schema: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    """The schema of the envelope's field ``name`` (``before``, ``after``)."""
    if not isinstance(schema, dict):
        return None
    for f in schema.get("fields") or ():
        if isinstance(f, dict) and f.get("field") == name:
            return f
    return None


def decode_row(row: Mapping[str, Any], codecs: Mapping[str, Codec] | None,
               only: tuple[str, ...] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """A row image's Python values and the Spark SQL types of its columns ({} without codecs);
    with ``only``, just those columns (a delete needs its key alone).

    Every column that does not decode is named in the :class:`BadValue` raised, with its type and
    the reason (one message may hold several)."""
    names = tuple(row) if only is None else tuple(c for c in only if c in row)
    if codecs is None:
        return {c: row[c] for c in names}, {}
    values: dict[str, Any] = {}
    bad: list[str] = []
    for column in names:
        value, codec = row[column], codecs.get(column)
        if value is None or codec is None:
            values[column] = value
            continue
        try:
            values[column] = codec.decode(value)
        except (BadValue, InvalidOperation, OverflowError) as exc:
            bad.append(f"column {column!r} ({codec.sql_type}): {exc}")
    if bad:
        raise BadValue("; ".join(bad))
    return values, {c: k.sql_type for c, k in codecs.items() if c in names}
