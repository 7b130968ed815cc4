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
