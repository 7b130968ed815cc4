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
int8 / int16 / int32 / int64                         int                      tinyint / smallint / int / bigint
float32 / float64 (``float`` / ``double``)           float                    float / double
boolean, string                                      bool, str                boolean, string
bytes                                                bytes (base64 decoded)   binary
``org.apache.kafka.connect.data.Decimal``            Decimal at its scale     decimal(p, s)
``io.debezium.data.VariableScaleDecimal``            Decimal                  string (no fixed scale)
``io.debezium.time.Date``, connect ``Date``          date (days since epoch)  date
``io.debezium.time.Timestamp`` (ms), ``Micro…`` (µs), ``Nano…`` (ns), connect ``Timestamp``
                                                     naive datetime           timestamp_ntz
``io.debezium.time.ZonedTimestamp`` (ISO text)       aware datetime (UTC)     timestamp
``io.debezium.time.Time`` / ``MicroTime`` / ``NanoTime``, connect ``Time``
                                                     "HH:MM:SS.ffffff" text   string
``io.debezium.data.Json``, ``Uuid``, ``Enum`` …      str                      string
array, map, struct                                   JSON text                string
==================================================  =======================  ==================
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Mapping

_EPOCH_DATE = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1)
_PRIMITIVE_SQL = {"int8": "tinyint", "int16": "smallint", "int32": "int", "int64": "bigint", "float": "float",
                  "float32": "float", "double": "double", "float64": "double", "boolean": "boolean",
                  "string": "string", "bytes": "binary"}
_SPARK_MAX_PRECISION = 38


class BadValue(ValueError):
    """A value that does not match its declared Connect type."""


@dataclass(frozen=True)
class Codec:
    """How one column's JSON value becomes its Python value, and the Spark SQL type it lands as."""

    sql_type: str
    decode: Callable[[Any], Any]


def _bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        raise BadValue(f"{value!r} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadValue(f"{value!r} is not base64") from None


def _unscaled(value: Any, scale: int) -> Decimal:
    """A Connect Decimal: base64 of the big-endian two's-complement unscaled integer (or, with
    ``decimal.format=NUMERIC``, a JSON number)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Decimal(str(value)).quantize(Decimal(1).scaleb(-scale))
    raw = _bytes(value)
    return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)


def _variable_decimal(value: Any) -> Decimal:
    if not isinstance(value, dict) or "scale" not in value or "value" not in value:
        raise BadValue(f"{value!r} is not a VariableScaleDecimal struct (scale, value)")
    return _unscaled(value["value"], int(value["scale"]))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue(f"{value!r} is not an integer")
    return value


def _since_epoch(unit_micros: float) -> Callable[[Any], datetime]:
    def decode(value: Any) -> datetime:
        n = _int(value)
        micros = n * unit_micros if unit_micros >= 1 else n // int(1 / unit_micros)
        return _EPOCH + timedelta(microseconds=int(micros))
    return decode


def _zoned(value: Any) -> datetime:
    if not isinstance(value, str):
        raise BadValue(f"{value!r} is not an ISO 8601 timestamp")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadValue(f"{value!r} is not an ISO 8601 timestamp") from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


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
    return _EPOCH_DATE + timedelta(days=_int(value))


def _json_text(value: Any) -> Any:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _same(value: Any) -> Any:
    return value


def _decimal_codec(params: Mapping[str, Any]) -> Codec:
    try:
        scale = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", _SPARK_MAX_PRECISION))
    except (TypeError, ValueError):
        raise BadValue(f"decimal parameters {dict(params)!r} are not numbers") from None
    if precision > _SPARK_MAX_PRECISION or scale > precision:
        return Codec("string", lambda v: str(_unscaled(v, scale)))  # wider than Spark's decimals: exact text
    return Codec(f"decimal({precision},{scale})", lambda v: _unscaled(v, scale))


_LOGICAL: dict[str, Callable[[Mapping[str, Any]], Codec]] = {
    "org.apache.kafka.connect.data.Decimal": _decimal_codec,
    "io.debezium.data.VariableScaleDecimal": lambda _: Codec("string", lambda v: str(_variable_decimal(v))),
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


def codec_of(field_schema: Mapping[str, Any]) -> Codec:
    """The codec of one field of a Connect struct schema."""
    name, kind = field_schema.get("name"), field_schema.get("type")
    if isinstance(name, str) and name in _LOGICAL:
        return _LOGICAL[name](field_schema.get("parameters") or {})
    if kind == "bytes":
        return Codec("binary", _bytes)
    if kind in ("array", "map", "struct"):
        return Codec("string", _json_text)
    if isinstance(kind, str) and kind in _PRIMITIVE_SQL:
        return Codec(_PRIMITIVE_SQL[kind], _same)
    return Codec("string", _json_text)


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


def decode_row(row: Mapping[str, Any], codecs: Mapping[str, Codec] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """A row image's Python values and the Spark SQL types of its columns ({} without codecs)."""
    if codecs is None:
        return dict(row), {}
    values: dict[str, Any] = {}
    for column, value in row.items():
        codec = codecs.get(column)
        if value is None or codec is None:
            values[column] = value
            continue
        try:
            values[column] = codec.decode(value)
        except (BadValue, InvalidOperation, OverflowError) as exc:
            raise BadValue(f"column {column!r} ({codec.sql_type}): {exc}") from None
    return values, {c: k.sql_type for c, k in codecs.items() if c in row}
