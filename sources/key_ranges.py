"""Bootstrap chunks as ranges of the key (the public read path). Pure: no Spark.

A chunk read through Spark's and Delta's public API is ``VERSION AS OF V`` restricted by a
predicate. A predicate on ``_metadata.file_path`` does not narrow Delta's scan (measured on Delta
4.4: the scan still reads every file and filters rows afterwards), but a range on a data column
does: Delta's data skipping drops every file whose min/max statistics lie outside it. So a chunk is
a half-open range of the first key column, ``lower <= key < upper``, and the ranges follow the
files' own key ranges, so that each chunk's scan touches only its own files.

The plan is made from one row per source file: the file's size, rows and smallest and largest key
(one aggregate over the key column at V). Files whose key ranges overlap are kept in one chunk
(splitting them would make both chunks read both files); the groups are packed in key order up to
the byte target. Correctness does not rest on the statistics: the ranges cover the whole key domain
(the first is open below and also takes NULL keys, the last is open above), so every row of the
snapshot falls in exactly one chunk whatever the files hold; the statistics only decide how much
each chunk's scan can skip. A table whose files all overlap (keys not clustered) is one chunk.

A small file whose keys span others' (a MERGE's output: a few changed keys from anywhere in the
domain) would tie every range it overlaps into one chunk. Such a *stray*, at most
``STRAY_SHARE`` of the chunk target, is left out of the grouping when that gives more chunks and
reading every stray in every chunk costs at most ``STRAY_COST`` of the snapshot's bytes: each
chunk's scan then also reads the strays (data skipping cannot drop them), and its predicate keeps
the rows of its own range.
"""

from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from lakemirror.identifiers import quote, sql_string

#: Key types a range can be written for exactly: a bound is kept as text and cast back to the
#: key's type, which round-trips for these. Floating point and timestamp keys do not, so a table
#: keyed by one is copied as one chunk on the public path.
RANGE_TYPES = ("tinyint", "smallint", "int", "bigint", "string", "date")
#: A file no larger than this share of the chunk target may be left out of the grouping (a stray).
STRAY_SHARE = 1 / 16
#: Leaving strays out is taken when every chunk reading every stray reads at most this share of
#: the snapshot's bytes more.
STRAY_COST = 0.10


def range_type(sql_type: str) -> bool:
    """Whether a key of this Spark SQL type (``DataType.simpleString()``) can bound a chunk."""
    return sql_type in RANGE_TYPES or sql_type.startswith("decimal(")


@dataclass(frozen=True)
class FileKeys:
    """One source file at V: its size, its live rows and the smallest and largest key among them
    (None: the file has no row with a non-NULL key)."""

    path: str
    size_bytes: int
    rows: int
    low: Any
    high: Any


@dataclass(frozen=True)
class KeyRange:
    """The rows of a chunk: ``lower <= column < upper``; an open end is None. The range open below
    also holds the rows whose key is NULL."""

    column: str
    sql_type: str
    lower: str | None
    upper: str | None

    def predicate(self, qualifier: str | None = None) -> str | None:
        """The Spark SQL filter of the range; None when it is the whole table. ``qualifier``: the
        alias the column is qualified with (a MERGE's target), none by default."""
        col = quote(self.column) if qualifier is None else f"{qualifier}.{quote(self.column)}"
        parts = []
        if self.lower is not None:
            parts.append(f"{col} >= {self._literal(self.lower)}")
        if self.upper is not None:
            below = f"{col} < {self._literal(self.upper)}"
            parts.append(f"({col} IS NULL OR {below})" if self.lower is None else below)
        return " AND ".join(parts) if parts else None

    def spanning(self, other: "KeyRange") -> "KeyRange":
        """The range from this one's lower bound to ``other``'s upper bound (``other`` follows it)."""
        return KeyRange(self.column, self.sql_type, self.lower, other.upper)

    def _literal(self, text: str) -> str:
        return f"CAST({sql_string(text)} AS {self.sql_type.upper()})"

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "sql_type": self.sql_type, "lower": self.lower, "upper": self.upper}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "KeyRange":
        return cls(str(data["column"]), str(data["sql_type"]), data.get("lower"), data.get("upper"))


def bound_text(value: Any) -> str:
    """A key value as the text its range keeps (cast back to the key's type when read)."""
    if isinstance(value, bool):
        raise TypeError("a boolean key cannot bound a chunk")
    if isinstance(value, (int, str, decimal.Decimal)):
        return str(value)
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value.isoformat()
    raise TypeError(f"a key of type {type(value).__name__} cannot bound a chunk")


@dataclass(frozen=True)
class _Group:
    low: Any
    high: Any
    size_bytes: int
    rows: int
    paths: tuple[str, ...]


def _overlapping_groups(files: Sequence[FileKeys]) -> list[_Group]:
    keyed = sorted((f for f in files if f.low is not None), key=lambda f: (f.low, f.high, f.path))
    groups: list[_Group] = []
    for f in keyed:
        last = groups[-1] if groups else None
        if last is not None and f.low <= last.high:
            groups[-1] = _Group(last.low, max(last.high, f.high), last.size_bytes + f.size_bytes,
                                last.rows + f.rows, last.paths + (f.path,))
        else:
            groups.append(_Group(f.low, f.high, f.size_bytes, f.rows, (f.path,)))
    return groups


def plan_key_ranges(files: Iterable[FileKeys], target_bytes: int, column: str,
                    sql_type: str) -> list[tuple[KeyRange, int, int]]:
    """The chunks of a snapshot as ``(range, bytes, rows)`` in key order; one whole-table range when
    the files fit one chunk or cannot be told apart by key.

    Files with only NULL keys go to the first range (open below), as do their bytes and rows; a
    stray left out of the grouping counts in the range of its smallest key."""
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, not {target_bytes}")
    listed = list(files)
    null_only = [f for f in listed if f.low is None]
    keyed = [f for f in listed if f.low is not None]
    packs, strays = _packs(_overlapping_groups(keyed), target_bytes), []
    small = {f.path for f in keyed if f.size_bytes <= target_bytes * STRAY_SHARE}
    if small and len(small) < len(keyed):
        without = _packs(_overlapping_groups([f for f in keyed if f.path not in small]), target_bytes)
        stray_bytes = sum(f.size_bytes for f in keyed if f.path in small)
        total = sum(f.size_bytes for f in listed)
        if len(without) > len(packs) and stray_bytes * len(without) <= STRAY_COST * total:
            packs, strays = without, [f for f in keyed if f.path in small]
    if len(packs) <= 1:
        return [(KeyRange(column, sql_type, None, None), sum(f.size_bytes for f in listed),
                 sum(f.rows for f in listed))]
    lowers = [p[0].low for p in packs]
    sizes = [sum(g.size_bytes for g in pack) for pack in packs]
    rows = [sum(g.rows for g in pack) for pack in packs]
    sizes[0] += sum(f.size_bytes for f in null_only)
    rows[0] += sum(f.rows for f in null_only)
    for f in strays:
        i = max([0] + [n for n, low in enumerate(lowers) if n > 0 and f.low >= low])
        sizes[i] += f.size_bytes
        rows[i] += f.rows
    bounds = [bound_text(low) for low in lowers]
    return [(KeyRange(column, sql_type, bounds[i] if i > 0 else None, bounds[i + 1] if i + 1 < len(packs) else None),
             sizes[i], rows[i]) for i in range(len(packs))]


def _packs(groups: Sequence[_Group], target_bytes: int) -> list[list[_Group]]:
    """The groups (in key order) packed up to ``target_bytes`` each; a group larger than that alone."""
    packs: list[list[_Group]] = []
    size = 0
    for g in groups:
        if not packs or (size + g.size_bytes > target_bytes and packs[-1]):
            packs.append([])
            size = 0
        packs[-1].append(g)
        size += g.size_bytes
    return packs
