"""Primary-key inference, as a pure function with its reason reported.

Order of rules: explicit configuration, then a declared constraint (Unity Catalog PRIMARY KEY;
locally the table property ``lakemirror.primaryKey``), then a column named ``id``, then the
first NOT NULL column. A table with none of these is refused: replicating without a key would
duplicate rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from lakemirror.errors import NoUsableKey
from lakemirror.schema import Column

#: The local lakehouse's documented table property declaring a primary key: "col1,col2".
PRIMARY_KEY_PROPERTY = "lakemirror.primaryKey"


@dataclass(frozen=True)
class KeyChoice:
    columns: tuple[str, ...]
    rule: str  # "config", "declared constraint", "column named id", "first NOT NULL column"

    def describe(self) -> str:
        return f"({', '.join(self.columns)}) by {self.rule}"


def choose_key(table: str, columns: Sequence[Column], *, configured: Sequence[str] = (),
               declared: Sequence[str] = ()) -> KeyChoice:
    by_lower = {c.name.lower(): c for c in columns}

    def resolve(names: Sequence[str], origin: str) -> tuple[str, ...]:
        missing = [n for n in names if n.lower() not in by_lower]
        if missing:
            raise NoUsableKey(
                f"{table}: the {origin} key column(s) {missing} are not columns of the table "
                f"({', '.join(c.name for c in columns)}); fix the key or the table", table=table)
        return tuple(by_lower[n.lower()].name for n in names)

    if configured:
        return KeyChoice(resolve(configured, "configured"), "config")
    if declared:
        return KeyChoice(resolve(declared, "declared"), "declared constraint")
    if "id" in by_lower:
        return KeyChoice((by_lower["id"].name,), "column named id")
    for c in columns:
        if not c.nullable:
            return KeyChoice((c.name,), "first NOT NULL column")
    raise NoUsableKey(
        f"{table}: no usable primary key: no key in the config, no declared primary key, no 'id' "
        f"column and no NOT NULL column. Set `keys:` for this table in the config, or declare one "
        f"(Unity Catalog: ALTER TABLE … ADD CONSTRAINT … PRIMARY KEY; locally the table property "
        f"'{PRIMARY_KEY_PROPERTY}' = 'col1,col2')", table=table)


def parse_declared(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())
