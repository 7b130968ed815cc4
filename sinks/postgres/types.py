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
array, map, struct     jsonb                           maps with non-string keys: an array of pairs
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
from typing import Any

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


class UnsupportedType(ValueError):
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


def is_json(spark_type: str) -> bool:
    return postgres_type(spark_type) == JSONB


def json_ready(value: Any) -> Any:
    """``value`` (as Arrow's ``to_pylist`` gives it) made of JSON types only.

    Arrow gives a map as a list of (key, value) pairs: string-keyed maps become objects, others
    stay a list of ``[key, value]`` pairs. Bytes become base64, decimals their exact positional text
    (no precision lost, never ``1E-20``), dates and times ISO 8601. NUL characters, which ``jsonb``
    refuses, become U+FFFD."""
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
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = list(value)
        if items and all(isinstance(i, tuple) and len(i) == 2 for i in items):
            if all(isinstance(k, str) for k, _ in items):
                return {k: json_ready(v) for k, v in items}
            return [[json_ready(k), json_ready(v)] for k, v in items]
        return [json_ready(i) for i in items]
    return str(value)


def json_text(value: Any) -> str:
    """``value`` as compact JSON text (see :func:`json_ready`)."""
    return json.dumps(json_ready(value), separators=(",", ":"), ensure_ascii=False)
