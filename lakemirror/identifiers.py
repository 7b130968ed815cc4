"""Three-part table names and SQL identifier quoting.

Every identifier that reaches SQL text goes through :func:`quote`; nothing is interpolated raw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = re.compile(r"`((?:[^`]|``)+)`|([^.`]+)")


def quote(name: str) -> str:
    """Quote one identifier for Spark SQL: wrap in backticks, double any backtick inside."""
    if not name:
        raise ValueError("an identifier cannot be empty")
    if "\x00" in name:
        raise ValueError(f"identifier {name!r} contains a NUL character")
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal: single quotes, with backslashes and quotes escaped."""
    if "\x00" in value:
        raise ValueError("a SQL string literal cannot contain NUL")
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def split_name(text: str) -> list[str]:
    """Split a dotted name into its parts; parts may be backtick-quoted (``a.`b.c`.d``)."""
    parts: list[str] = []
    pos = 0
    while pos <= len(text):
        m = _PART.match(text, pos)
        if not m:
            raise ValueError(f"cannot parse the name {text!r} at position {pos}")
        parts.append(m.group(1).replace("``", "`") if m.group(1) is not None else m.group(2).strip())
        pos = m.end()
        if pos == len(text):
            break
        if text[pos] != ".":
            raise ValueError(f"cannot parse the name {text!r}: expected '.' at position {pos}")
        pos += 1
    if any(not p for p in parts):
        raise ValueError(f"the name {text!r} has an empty part")
    return parts


@dataclass(frozen=True, order=True)
class TableName:
    """A Unity-Catalog-style three-part table name: ``catalog.schema.table``."""

    catalog: str
    schema: str
    table: str

    def __post_init__(self) -> None:
        for label, part in (("catalog", self.catalog), ("schema", self.schema), ("table", self.table)):
            if not part or not part.strip():
                raise ValueError(f"the {label} part of a table name cannot be empty")
            if "\x00" in part or "/" in part:
                raise ValueError(f"the {label} name {part!r} contains '/' or NUL, which a table name cannot hold")

    @classmethod
    def parse(cls, text: str) -> "TableName":
        parts = split_name(text)
        if len(parts) != 3:
            raise ValueError(f"{text!r} is not a three-part name catalog.schema.table")
        return cls(*parts)

    @property
    def sql(self) -> str:
        """The name quoted for SQL text."""
        return ".".join(quote(p) for p in (self.catalog, self.schema, self.table))

    def __str__(self) -> str:
        return ".".join(p if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else quote(p)
                        for p in (self.catalog, self.schema, self.table))

    @property
    def slug(self) -> str:
        """A filesystem-safe, collision-free name for checkpoint folders."""
        # Percent-encode the UTF-8 bytes of everything but [A-Za-z0-9-]; '_' is encoded too so
        # the '__' separator can never occur inside a part. The mapping is injective.
        def enc(p: str) -> str:
            return "".join(c if (c.isascii() and (c.isalnum() or c == "-")) else
                           "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in p)
        return "__".join(enc(p) for p in (self.catalog, self.schema, self.table))
