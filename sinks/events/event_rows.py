"""Column types of event-fed replicas: inferred from JSON values, and values checked against them.

Pure: no pyspark import. Events carry JSON values; a replica has Spark SQL types. A replica that
lakemirror creates takes its types from the first values it sees (:func:`infer_type`); a value
later written to it is converted to the column's type (:func:`convert`), and a value that does not
fit raises :class:`ValueError`: its event goes to the dead letters instead of failing the batch.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable

STRING, BIGINT, DOUBLE, BOOLEAN = "string", "bigint", "double", "boolean"
_INTEGRAL = {"bigint": 2**63, "int": 2**31, "smallint": 2**15, "tinyint": 2**7}


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return BOOLEAN
    if isinstance(v, int):
        return BIGINT
    if isinstance(v, float):
        return DOUBLE
    if isinstance(v, datetime):
        return "timestamp" if v.tzinfo is not None else "timestamp_ntz"
    if isinstance(v, date):
        return "date"
    if isinstance(v, (bytes, bytearray)):
        return "binary"
    return STRING


def infer_type(values: Iterable[Any]) -> str:
    """The Spark SQL type for a column with these values (all NULL: string).

    Used only when the events declare no types (schemaless JSON); Connect-typed events carry the
    source's own types (:attr:`lakemirror.sources.change_event.ChangeEvent.types`).
    """
    kinds = set()
    for v in values:
        if v is None:
            continue
        kinds.add(_kind(v))
    if not kinds:
        return STRING
    if len(kinds) == 1:
        return kinds.pop()
    return DOUBLE if kinds == {BIGINT, DOUBLE} else STRING


def _integral(value: Any, kind: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean, not a {kind}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not a whole number for a {kind} column")
        value = int(value)
    elif isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a whole number for a {kind} column") from None
    if not isinstance(value, int):
        raise ValueError(f"{value!r} does not fit a {kind} column")
    bound = _INTEGRAL[kind]
    if not -bound <= value < bound:
        raise ValueError(f"{value} is out of range for a {kind} column")
    return value


def convert(value: Any, sql_type: str) -> Any:
    """``value`` (a JSON value) as the Python value Spark writes into a ``sql_type`` column."""
    if value is None:
        return None
    kind = sql_type.lower()
    if kind in _INTEGRAL:
        return _integral(value, kind)
    if kind in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{value!r} is not a number for a {kind} column")
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a number for a {kind} column") from None
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"{value!r} is not a boolean")
    if kind == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, (Decimal, date)):
            return str(value) if not isinstance(value, datetime) else value.isoformat()
        return json.dumps(value, sort_keys=True, default=str)
    if kind.startswith("decimal"):
        if isinstance(value, bool) or isinstance(value, (dict, list, bytes)):
            raise ValueError(f"{value!r} is not a decimal")
        try:
            return Decimal(str(value))
        except InvalidOperation:
            raise ValueError(f"{value!r} is not a decimal") from None
    if kind == "binary":
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        raise ValueError(f"{value!r} is not bytes for a binary column")
    if kind == "date" and isinstance(value, date) and not isinstance(value, datetime):
        return value
    if kind in ("timestamp", "timestamp_ntz") and isinstance(value, datetime):
        if kind == "timestamp_ntz":  # wall-clock time: an aware value is read as UTC's wall clock
            return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo else value
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if kind == "date" and isinstance(value, str):
        try:
            return date.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO date") from None
    if kind in ("timestamp", "timestamp_ntz") and isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO timestamp") from None
        return when.replace(tzinfo=timezone.utc) if when.tzinfo is None and kind == "timestamp" else when
    raise ValueError(f"{value!r} cannot be written to a {sql_type} column")
