"""Column types of event-fed replicas: inferred from JSON values, and values checked against them.

Pure: no pyspark import. Events carry JSON values; a replica has Spark SQL types. A replica that
lakemirror creates takes its types from the first values it sees (:func:`infer_type`); a value
later written to it is converted to the column's type (:func:`convert`), and a value that does not
fit raises :class:`ValueError`: its event goes to the dead letters instead of failing the batch.
"""

from __future__ import annotations

import json
import math
import re
import struct
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping

from lakemirror.sources.connect_types import EXACT, decimal_text

STRING, BIGINT, DOUBLE, BOOLEAN = "string", "bigint", "double", "boolean"
_INTEGRAL = {"bigint": 2**63, "int": 2**31, "integer": 2**31, "smallint": 2**15, "tinyint": 2**7}
_DECIMAL = re.compile(r"decimal\((\d+)\s*,\s*(\d+)\)$")


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
    if isinstance(value, Decimal):
        if not value.is_finite() or value != value.to_integral_value():
            raise ValueError(f"{decimal_text(value)} is not a whole number for a {kind} column")
        value = int(value)
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


def exact_decimal(value: Any, sql_type: str) -> Decimal:
    """``value`` as a ``decimal(p,s)`` holds it, exactly: refused (never rounded) when it has more
    digits after the point than ``s`` or more before it than ``p - s``. Spark would round the first
    silently and fail the whole MERGE on the second (``NUMERIC_VALUE_OUT_OF_RANGE``)."""
    if isinstance(value, bool) or isinstance(value, (dict, list, bytes)):
        raise ValueError(f"{value!r} is not a decimal")
    try:
        number = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else str(value))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal") from None
    if not number.is_finite():
        raise ValueError(f"{number} has no {sql_type} value")
    shape = _DECIMAL.match(sql_type.lower().replace(" ", ""))
    if shape is None:  # a bare "decimal" is Spark's decimal(10,0)
        precision, scale = (10, 0) if sql_type.lower() == "decimal" else (38, 18)
    else:
        precision, scale = int(shape.group(1)), int(shape.group(2))
    exact = number.quantize(Decimal(1).scaleb(-scale, EXACT), context=EXACT)
    if exact != number:
        raise ValueError(f"{decimal_text(number)} has more than {scale} digits after the point: a {sql_type} "
                         f"column would round it")
    if len(exact.as_tuple().digits) > precision and exact != 0:
        raise ValueError(f"{decimal_text(number)} has more than {precision - scale} digits before the point: "
                         f"out of range for a {sql_type} column")
    return exact


def convert(value: Any, sql_type: str) -> Any:
    """``value`` (a JSON value) as the Python value Spark writes into a ``sql_type`` column, exactly:
    a value the column would round, overflow or mangle raises :class:`ValueError`."""
    if value is None:
        return None
    kind = sql_type.lower()
    if kind in _INTEGRAL:
        return _integral(value, kind)
    if kind in ("double", "float", "real"):
        if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
            raise ValueError(f"{value!r} is not a number for a {kind} column")
        try:
            number = float(value)
        except (ValueError, OverflowError):
            raise ValueError(f"{value!r} is not a number for a {kind} column") from None
        if kind != "double" and math.isfinite(number):
            try:  # the nearest 32-bit float: infinity (or an error) past its range
                narrowed = struct.unpack("f", struct.pack("f", number))[0]
            except OverflowError:
                narrowed = math.inf
            if not math.isfinite(narrowed):
                raise ValueError(f"{value!r} is out of range for a {kind} column (it would become infinity)")
        if isinstance(value, (int, Decimal, str)) and number in (float("inf"), float("-inf")) and \
                str(value).strip().lstrip("+-").lower() not in ("inf", "infinity"):
            raise ValueError(f"{value!r} is out of range for a {kind} column")
        return number
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"{value!r} is not a boolean")
    if kind == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, Decimal):
            return decimal_text(value)
        if isinstance(value, date):
            return str(value) if not isinstance(value, datetime) else value.isoformat()
        return json.dumps(value, sort_keys=True, default=str)
    if kind.startswith("decimal"):
        return exact_decimal(value, sql_type)
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


def convert_row(values: Mapping[str, Any], types: Mapping[str, str], columns: Iterable[str]) -> dict[str, Any]:
    """``columns`` of ``values`` converted to their ``types`` (:func:`convert`); a ValueError names every
    column whose value does not fit, with its type and why."""
    out: dict[str, Any] = {}
    bad: list[str] = []
    for column in columns:
        try:
            out[column] = convert(values.get(column), types[column])
        except ValueError as exc:
            bad.append(f"column {column!r} ({types[column]}): {exc}")
    if bad:
        raise ValueError("; ".join(bad))
    return out
