"""Column descriptions shared by sources (introspection) and sinks (planning); no pyspark."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Column:
    """A column of a table schema: name, Spark SQL type string, nullability."""

    name: str
    type: str
    nullable: bool = True


def columns_from_struct(schema: Any) -> tuple[Column, ...]:
    """Convert a pyspark ``StructType`` (duck-typed) to :class:`Column` values."""
    return tuple(Column(f.name, f.dataType.simpleString(), bool(f.nullable)) for f in schema.fields)


def names(columns: Sequence[Column]) -> list[str]:
    return [c.name for c in columns]


#: Delta's names of primitive types (a log's ``schemaString``) where Spark's ``simpleString`` differs.
_SPARK_NAMES = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}


def spark_type_name(kind: Any) -> str:
    """A type of a Delta log's schema (``metaData.schemaString``: Spark's own JSON form) as Spark's
    ``DataType.simpleString`` names it (``long`` is ``bigint``, ``array<int>``, ``struct<a:int>``)."""
    if isinstance(kind, str):
        return _SPARK_NAMES.get(kind, kind)
    if not isinstance(kind, dict):
        raise ValueError(f"not a Delta schema type: {kind!r}")
    shape = kind.get("type")
    if shape == "array":
        return f"array<{spark_type_name(kind['elementType'])}>"
    if shape == "map":
        return f"map<{spark_type_name(kind['keyType'])},{spark_type_name(kind['valueType'])}>"
    if shape == "struct":
        return "struct<" + ",".join(f"{f['name']}:{spark_type_name(f['type'])}" for f in kind["fields"]) + ">"
    raise ValueError(f"not a Delta schema type: {kind!r}")


def columns_from_delta_schema(schema: Any) -> tuple[Column, ...]:
    """The columns of a Delta log's schema (the parsed ``schemaString`` of its ``metaData``), typed as
    :func:`columns_from_struct` types the schema Spark reads (:func:`spark_type_name`)."""
    if not isinstance(schema, dict) or schema.get("type") != "struct":
        raise ValueError("a Delta table's schema is a struct")
    return tuple(Column(f["name"], spark_type_name(f["type"]), bool(f.get("nullable", True))) for f in schema["fields"])


def schema_change(before: Sequence[Column], after: Sequence[Column]) -> str | None:
    """How the columns ``after`` differ from ``before`` (added, dropped, retyped, nullability
    changed, reordered); None when they are the same. Pure."""
    if tuple(before) == tuple(after):
        return None
    old, new = {c.name: c for c in before}, {c.name: c for c in after}
    parts = []
    added = [n for n in new if n not in old]
    dropped = [n for n in old if n not in new]
    if added:
        parts.append("added " + ", ".join(added))
    if dropped:
        parts.append("dropped " + ", ".join(dropped))
    for name in (n for n in old if n in new):
        was, now = old[name], new[name]
        if was.type != now.type:
            parts.append(f"{name} {was.type} is now {now.type}")
        if was.nullable != now.nullable:
            parts.append(f"{name} is now {'nullable' if now.nullable else 'NOT NULL'}")
    return "; ".join(parts) or "columns reordered"
