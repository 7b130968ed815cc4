"""The change planner: from a batch of change-feed rows to one idempotent MERGE, as data.

Pure: no pyspark import. The Delta executor (:mod:`lakemirror.sinks.merge.delta_merge`) turns a
:class:`MergePlan` into DataFrame calls and one SQL ``MERGE``; the in-memory twin
(:mod:`lakemirror.sinks.memory`) applies the same plan to a dict, so the apply semantics have
one definition that fast unit tests can exercise.

Semantics (those of Delta's change data feed, as Databricks' AUTO CDC applies a Delta changelog):
- ``update_preimage`` rows are never applied;
- per key, only the latest change wins: highest ``_commit_version``, and inside one version a
  delete ranks below an insert/postimage (an overwrite deletes then re-inserts the key);
- a winning delete removes the key, any other winner upserts it;
- CDF metadata columns never reach the replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from lakemirror.identifiers import quote
from lakemirror.schema import Column

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CDF_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)

INSERT = "insert"
DELETE = "delete"
UPDATE_PRE = "update_preimage"
UPDATE_POST = "update_postimage"

#: Rank inside one commit version: a delete of a key is ordered before its (re-)insert.
CHANGE_RANK = {DELETE: 0, INSERT: 1, UPDATE_POST: 1}

OP_COLUMN = "__lm_op"
LATEST_COLUMN = "__lm_latest"
SOURCE_ALIAS = "s"
TARGET_ALIAS = "t"


@dataclass(frozen=True)
class ColumnSelection:
    """Which source columns reach the replica. ``include`` empty means all."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def apply(self, columns: Sequence[Column], keys: Sequence[str]) -> tuple[Column, ...]:
        names = [c.name for c in columns]
        for wanted in (*self.include, *self.exclude):
            if wanted not in names:
                raise ValueError(f"column {wanted!r} named in include/exclude is not in the source ({', '.join(names)})")
        for key in keys:
            if key in self.exclude or (self.include and key not in self.include):
                raise ValueError(f"key column {key!r} cannot be excluded from the replica")
        return tuple(
            c for c in columns
            if c.name not in CDF_COLUMNS
            and (not self.include or c.name in self.include)
            and c.name not in self.exclude
        )


def read_columns_change(read: Sequence[str], described: Sequence[Column]) -> str | None:
    """How the data columns of a frame read from the source (a change stream's or a snapshot's; the
    change feed's own columns aside) differ by name from the columns a plan was made from ("added …;
    dropped …"), or None. Pure.

    A frame reads the source's schema of the moment it is made, which a commit between the
    description and the read can change: rows of a column the plan does not have would reach no
    replica column, so whatever read them must be planned again."""
    data = [c for c in read if c not in CDF_COLUMNS]
    planned = [c.name for c in described]
    parts = [f"{what} {', '.join(names)}" for what, names in (("added", [c for c in data if c not in planned]),
                                                              ("dropped", [c for c in planned if c not in data]))
             if names]
    return "; ".join(parts) or None


@dataclass(frozen=True)
class MergePlan:
    """Everything the executor needs to apply one batch with a single MERGE.

    ``change_filter``: SQL predicate keeping the applicable change rows.
    ``latest_expr``: SQL aggregate giving, per key group, the winning row as a struct.
    ``match_condition``: the MERGE ON clause, on keys only (null-safe where a key is nullable).
    """

    keys: tuple[str, ...]
    columns: tuple[Column, ...]
    change_filter: str
    latest_expr: str
    match_condition: str
    delete_condition: str
    upsert_condition: str
    assignments: dict[str, str] = field(default_factory=dict)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def rank_sql() -> str:
    cases = " ".join(f"WHEN '{op}' THEN {rank}" for op, rank in CHANGE_RANK.items())
    return f"CASE {quote(CHANGE_TYPE)} {cases} END"


def plan_merge(columns: Sequence[Column], keys: Sequence[str],
               selection: ColumnSelection = ColumnSelection()) -> MergePlan:
    """Plan the per-batch MERGE of change rows with ``columns`` into a replica keyed on ``keys``."""
    if not keys:
        raise ValueError("a merge needs at least one key column")
    if len(set(keys)) != len(keys):
        raise ValueError(f"key columns repeat: {list(keys)}")
    by_name = {c.name: c for c in columns}
    missing = [k for k in keys if k not in by_name]
    if missing:
        raise ValueError(f"key column(s) {missing} are not in the source columns {list(by_name)}")
    data = selection.apply(columns, keys)
    payload = ", ".join(f"{quote(c.name)} AS {quote(c.name)}" for c in data)
    latest = (f"max_by(struct({payload}, {quote(CHANGE_TYPE)} AS {quote(OP_COLUMN)}), "
              f"struct({quote(COMMIT_VERSION)}, {rank_sql()}))")
    on = " AND ".join(
        f"{TARGET_ALIAS}.{quote(k)} {'<=>' if by_name[k].nullable else '='} {SOURCE_ALIAS}.{quote(k)}"
        for k in keys
    )
    op = f"{SOURCE_ALIAS}.{quote(OP_COLUMN)}"
    return MergePlan(
        keys=tuple(keys),
        columns=data,
        change_filter=f"{quote(CHANGE_TYPE)} <> '{UPDATE_PRE}'",
        latest_expr=latest,
        match_condition=on,
        delete_condition=f"{op} = '{DELETE}'",
        upsert_condition=f"{op} <> '{DELETE}'",
        assignments={quote(c.name): f"{SOURCE_ALIAS}.{quote(c.name)}" for c in data},
    )


@dataclass(frozen=True)
class SchemaDiff:
    """How a replica's schema differs from the source's (both after column selection)."""

    added: tuple[Column, ...] = ()
    dropped: tuple[str, ...] = ()
    retyped: tuple[tuple[str, str, str], ...] = ()  # (name, replica type, source type)

    @property
    def is_additive(self) -> bool:
        return not self.dropped and not self.retyped

    @property
    def is_empty(self) -> bool:
        return not (self.added or self.dropped or self.retyped)

    def describe(self) -> str:
        parts = []
        if self.added:
            parts.append("added " + ", ".join(f"{c.name} {c.type}" for c in self.added))
        if self.dropped:
            parts.append("dropped " + ", ".join(self.dropped))
        if self.retyped:
            parts.append("retyped " + ", ".join(f"{n} {old}->{new}" for n, old, new in self.retyped))
        return "; ".join(parts) or "no change"


def diff_schema(source: Sequence[Column], replica: Sequence[Column]) -> SchemaDiff:
    """Compare column lists by name (case-insensitive, as Spark resolves them)."""
    rep = {c.name.lower(): c for c in replica}
    src = {c.name.lower(): c for c in source}
    added = tuple(c for c in source if c.name.lower() not in rep)
    dropped = tuple(c.name for c in replica if c.name.lower() not in src)
    retyped = tuple(
        (c.name, rep[c.name.lower()].type, c.type)
        for c in source
        if c.name.lower() in rep and rep[c.name.lower()].type.lower() != c.type.lower()
    )
    return SchemaDiff(added=added, dropped=dropped, retyped=retyped)


def add_columns_sql(table_sql: str, added: Sequence[Column]) -> str:
    """``ALTER TABLE … ADD COLUMNS`` for an additive schema change (new columns are nullable)."""
    if not added:
        raise ValueError("no columns to add")
    cols = ", ".join(f"{quote(c.name)} {c.type}" for c in added)
    return f"ALTER TABLE {table_sql} ADD COLUMNS ({cols})"
