"""Spark SQL types as PostgreSQL column types, and row values as psycopg can send them. Pure.

The mapping (documented in docs/postgres.md):

=====================  ==============================  ==========================================
Spark                  PostgreSQL                      note
=====================  ==============================  ==========================================
tinyint, smallint      smallint                        Postgres has no 1-byte integer
int                    integer
bigint                 bigint
float                  real
double                 double precision
decimal(p,s)           numeric(p,s)                    exact; p <= 38 as in Spark
string, varchar, char  text                            a NUL character is rejected by Postgres
boolean                boolean
date                   date
timestamp              timestamp with time zone        Spark's timestamp is an instant
timestamp_ntz          timestamp without time zone     wall-clock time, no zone
binary                 bytea
array, map, struct     jsonb                           shaped by the type: string-keyed maps as
                                                      objects, other maps as [key, value] pairs
=====================  ==============================  ==========================================

The Postgres spelling is ``format_type()``'s, so a replica column read back from the catalog
compares equal to the mapped type of its source column (schema evolution, :mod:`.plan`).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import re
from typing import TYPE_CHECKING, Any, Callable

from lakemirror.errors import UnsupportedColumnType

if TYPE_CHECKING:
    import pyarrow as pa

_SIMPLE = {
    "tinyint": "smallint", "byte": "smallint", "smallint": "smallint", "short": "smallint",
    "int": "integer", "integer": "integer", "bigint": "bigint", "long": "bigint",
    "float": "real", "real": "real", "double": "double precision",
    "string": "text", "boolean": "boolean", "date": "date",
    "timestamp": "timestamp with time zone", "timestamp_ltz": "timestamp with time zone",
    "timestamp_ntz": "timestamp without time zone", "binary": "bytea",
}
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_TEXTUAL = re.compile(r"^(varchar|char)\(\d+\)$")
_NESTED = ("array<", "map<", "struct<")

JSONB = "jsonb"


class UnsupportedType(UnsupportedColumnType, ValueError):
    """A Spark type with no Postgres column type here (e.g. interval, variant)."""


def postgres_type(spark_type: str) -> str:
    """The Postgres column type for a Spark ``simpleString`` type, e.g. ``decimal(10,2)`` → ``numeric(10,2)``."""
    t = spark_type.strip().lower()
    if t in _SIMPLE:
        return _SIMPLE[t]
    if t == "decimal":
        return "numeric(10,0)"
    m = _DECIMAL.match(t)
    if m:
        return f"numeric({int(m.group(1))},{int(m.group(2))})"
    if _TEXTUAL.match(t):
        return "text"
    if t.startswith(_NESTED):
        return JSONB
    raise UnsupportedType(f"Spark type {spark_type!r} has no PostgreSQL mapping; exclude the column "
                          f"(exclude_columns) or cast it on the source")


def has_postgres_type(spark_type: str) -> bool:
    """Whether a Spark type has a PostgreSQL column type (:func:`postgres_type`)."""
    try:
        postgres_type(spark_type)
    except UnsupportedType:
        return False
    return True


def is_json(spark_type: str) -> bool:
    return postgres_type(spark_type) == JSONB


def json_ready(value: Any) -> Any:
    """``value`` made of JSON types only, its shape read from the value itself.

    For lakemirror's own values (dead-letter rows, scalars); a column's values go through
    :func:`json_converter`, which takes the shape from the column's type. Bytes become base64,
    decimals their exact positional text (no precision lost, never ``1E-20``), dates and times
    ISO 8601. NUL characters, which ``jsonb`` refuses, become U+FFFD."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")  # exact positional text: 0.00000000000000000001, never 1E-20
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {json_key(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(i) for i in value]
    return str(value)


def json_key(key: Any) -> str:
    """A JSON object's key: text, NUL characters replaced as in values."""
    return str(key).replace("\x00", "\ufffd")


Convert = Callable[[Any], Any]


def json_converter(arrow_type: "pa.DataType") -> Convert:
    """The function that makes one value of a column of ``arrow_type`` (as Arrow's ``to_pylist``
    gives it) made of JSON types only; NULL stays None.

    The JSON shape comes from the column's type, never from the value: Spark gives a column its
    Arrow type from its own (``map`` → map, ``array`` → list, ``struct`` → struct), and Arrow gives
    every map as a list of (key, value) pairs, so an empty map and an empty array look the same as
    values. A map whose keys are strings becomes an object (``{}`` when empty), any other map a
    list of ``[key, value]`` pairs, an array a list, a struct an object with its fields in order;
    the rule applies at every depth (a map in an array, an array in a struct's map)."""
    import pyarrow as pa

    t = arrow_type
    if pa.types.is_map(t):
        key, item = json_converter(t.key_type), json_converter(t.item_type)
        if pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type):
            return lambda v: None if v is None else {json_key(k): item(x) for k, x in _pairs(v)}
        return lambda v: None if v is None else [[key(k), item(x)] for k, x in _pairs(v)]
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        each = json_converter(t.value_type)
        return lambda v: None if v is None else [each(i) for i in v]
    if pa.types.is_struct(t):
        fields = [(t.field(i).name, json_converter(t.field(i).type)) for i in range(t.num_fields)]
        return lambda v: None if v is None else {json_key(name): conv(v.get(name)) for name, conv in fields}
    return json_ready


def _pairs(value: Any) -> Any:
    """A map's (key, value) pairs, whether Arrow gave it as pairs or as a dict."""
    return value.items() if isinstance(value, dict) else value


def json_text(value: Any) -> str:
    """``value`` as compact JSON text (see :func:`json_ready`)."""
    return json.dumps(json_ready(value), separators=(",", ":"), ensure_ascii=False)


def json_column(column: "pa.ChunkedArray | pa.Array") -> list[str | None]:
    """A nested column's values as ``jsonb`` text, shaped by the column's type (:func:`json_converter`)."""
    convert = json_converter(column.type)
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    return [None if v is None else dumps(convert(v)) for v in column.to_pylist()]
