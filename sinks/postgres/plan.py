"""What one batch of change rows does to a Postgres replica, as data. Pure: no connection, no Spark.

A batch's change rows are reduced to one winner per key by the planner's rule
(:func:`lakemirror.sinks.accelerator.arrow_changes.winning_changes`: highest ``_commit_version``, a delete ranks
before an insert or postimage of its version, ``update_preimage`` never applied). Each winner
carries its source *position*, the one orderable bigint ``_commit_version * 2 + rank`` (rank 0 for
a delete, 1 for an upsert), which the replica keeps in ``_lakemirror_position`` and which guards
every write (:mod:`.statements`): a change whose position is not above the row's (or the key's
tombstone's) changes nothing, so a late, older change can never move a row backwards or bring a
deleted key back. A bootstrap snapshot taken at version V writes its rows at ``V * 2 + 1``.

Postgres keys are a primary key, so a winner with NULL in a key column cannot be stored: it goes to
the dead letters with that reason instead (Delta keys may be NULL; the Delta replica takes them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from lakemirror.schema import Column
from lakemirror.sinks.accelerator.arrow_changes import batch_stats, winning_changes
from lakemirror.sinks.merge.planner import COMMIT_VERSION, DELETE, OP_COLUMN, MergePlan, SchemaDiff
from lakemirror.sinks.postgres.types import UnsupportedType, has_postgres_type, is_json, json_column, json_converter, json_text, postgres_type
from lakemirror.sinks.txn import BatchStats

if TYPE_CHECKING:
    import pyarrow as pa

#: The replica column holding the position of the change that wrote the row.
POSITION = "_lakemirror_position"
UPSERT = "upsert"
#: Postgres truncates identifiers to 63 bytes: longer derived names end in a hash instead.
MAX_IDENTIFIER_BYTES = 63


def position(commit_version: int, op: str) -> int:
    """The orderable source position of a change: version first, a delete before an upsert."""
    return int(commit_version) * 2 + (0 if op == DELETE else 1)


def snapshot_position(version: int) -> int:
    """The position of every row of a snapshot taken at ``version`` (as if upserted by it)."""
    return position(version, UPSERT)


def derived_name(base: str, suffix: str) -> str:
    """``base + suffix``, shortened with a hash of ``base`` to fit Postgres's 63-byte identifiers."""
    name = base + suffix
    if len(name.encode("utf-8")) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha1(base.encode("utf-8")).hexdigest()[:10]
    room = MAX_IDENTIFIER_BYTES - len(suffix.encode("utf-8")) - len(digest) - 1
    head = base.encode("utf-8")[:room].decode("utf-8", "ignore")
    return f"{head}_{digest}{suffix}"


@dataclass(frozen=True)
class ReplicaTable:
    """A replica in Postgres: where it is, its key and its columns (Spark types, mapped on use)."""

    schema: str
    name: str
    keys: tuple[str, ...]
    columns: tuple[Column, ...]
    #: The SQL type of ``_lakemirror_position``: one bigint for a change feed (version * 2 + rank);
    #: ``bigint[]`` for an event source's order (phase, major, minor, micro, rank), which Postgres
    #: compares element by element as the guard needs (:mod:`.events`).
    position_type: str = "bigint"

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a Postgres replica needs at least one key column")
        names = [c.name for c in self.columns]
        missing = [k for k in self.keys if k not in names]
        if missing:
            raise ValueError(f"key column(s) {missing} are not among the replica's columns {names}")
        if POSITION in names:
            raise ValueError(f"the source has a column named {POSITION!r}, which the Postgres replica uses itself")
        unsupported = [c for c in self.columns if not has_postgres_type(c.type)]
        if unsupported:
            listed = ", ".join(f"{c.name!r} ({c.type})" for c in unsupported)
            excluded = ", ".join(c.name for c in unsupported)
            raise UnsupportedType(
                f"column(s) {listed} of {self.name!r}: a type a PostgreSQL replica cannot hold. Exclude "
                f"them (table_overrides: {{{self.name}: {{exclude_columns: [{excluded}]}}}}) or cast them to a "
                f"supported type on the source (docs/postgres.md, \"Types\")", table=self.name)

    @classmethod
    def from_plan(cls, schema: str, name: str, plan: MergePlan) -> "ReplicaTable":
        return cls(schema, name, plan.keys, plan.columns)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def pg_columns(self) -> tuple[tuple[str, str], ...]:
        """(name, Postgres type) of every replicated column, in source order."""
        return tuple((c.name, postgres_type(c.type)) for c in self.columns)

    @property
    def tombstones(self) -> str:
        """The table remembering deleted keys and the position that deleted them."""
        return derived_name(self.name, "__lm_tombstones")

    @property
    def loading(self) -> str:
        """The table a bootstrap loads before it replaces the replica."""
        return derived_name(self.name, "__lm_loading")

    @property
    def retired(self) -> str:
        """The name the replica takes while a snapshot is swapped in, until it is dropped."""
        return derived_name(self.name, "__lm_old")

    @cached_property
    def json_flags(self) -> tuple[tuple[str, bool], ...]:
        """(name, whether stored as jsonb) of every column, worked out once."""
        return tuple((c.name, is_json(c.type)) for c in self.columns)

    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[k] for k in self.keys)


class StagedRow(NamedTuple):
    """One winning change, as COPYed into the staging table (a named tuple: a batch makes one per
    winner, and a tuple is built several times faster than a frozen dataclass)."""

    row_no: int
    op: str                      # "upsert" or "delete"
    position: int
    values: tuple[Any, ...]      # in ReplicaTable.columns order; jsonb columns as JSON text


@dataclass(frozen=True)
class DeadRow:
    """A change the replica cannot take, kept with the reason in ``lakemirror_dead_letters``."""

    commit_version: int | None
    op: str
    reason: str
    row_json: str


@dataclass(frozen=True)
class BatchPlan:
    rows: tuple[StagedRow, ...]
    dead: tuple[DeadRow, ...]
    stats: BatchStats
    upserts: int = field(default=0)
    deletes: int = field(default=0)

    @property
    def first_version(self) -> int | None:
        return self.stats.first_version

    @property
    def last_version(self) -> int | None:
        return self.stats.last_version


def dead_row_json(table: ReplicaTable, row: dict[str, Any], types: dict[str, "pa.DataType"]) -> str:
    """A row (as Arrow's ``to_pylist`` gives it) as the JSON a dead letter keeps, nested columns
    shaped by their type (:func:`~.types.json_converter`)."""
    return json_text({c: json_converter(types[c])(row.get(c)) if c in types else row.get(c)
                      for c in table.column_names})


def copy_values(column: "pa.ChunkedArray") -> list[Any]:
    """A column's values as COPY writes them. Decimals come as their exact text (what COPY sends and
    what a dead letter's JSON keeps), converted by Arrow: a Python ``Decimal`` per value is the
    slowest part of planning a batch."""
    import pyarrow as pa

    if pa.types.is_decimal(column.type):
        return column.cast(pa.string()).to_pylist()  # type: ignore[no-any-return]
    return column.to_pylist()  # type: ignore[no-any-return]


def plan_batch(changes: "pa.Table", table: ReplicaTable, *, preimages_dropped: bool = True) -> BatchPlan:
    """Plan one batch of raw change-feed rows (Arrow, CDF columns included).

    ``preimages_dropped``: the batch was read without its ``update_preimage`` rows (they are never
    applied); the statistics then count each postimage for its preimage too, as Spark's path does."""
    stats = batch_stats(changes, preimages_dropped=preimages_dropped)
    if changes.num_rows == 0:
        return BatchPlan((), (), stats)
    import pyarrow.compute as pc

    winners = winning_changes(changes, table.keys, [*table.column_names, COMMIT_VERSION])
    null_key = pc.is_null(winners[table.keys[0]])
    for k in table.keys[1:]:
        null_key = pc.or_(null_key, pc.is_null(winners[k]))
    types = {f.name: f.type for f in winners.schema}
    dead = [DeadRow(int(row[COMMIT_VERSION]), DELETE if row[OP_COLUMN] == DELETE else UPSERT,
                    "NULL in key column(s) " + ", ".join(k for k in table.keys if row[k] is None)
                    + ": a Postgres primary key cannot hold NULL", dead_row_json(table, row, types))
            for row in winners.filter(null_key).to_pylist()]
    kept = winners.filter(pc.invert(null_key))
    deleted = pc.equal(kept[OP_COLUMN], DELETE)
    # Columns to Python once each (not row dicts): the position in Arrow, nested values as JSON text.
    positions = pc.add(pc.multiply(kept[COMMIT_VERSION].cast("int64"), 2),
                       pc.if_else(deleted, 0, 1).cast("int64")).to_pylist()
    ops = pc.if_else(deleted, DELETE, UPSERT).to_pylist()
    values = [json_column(kept[name]) if nested else copy_values(kept[name]) for name, nested in table.json_flags]
    staged = tuple(StagedRow(i, op, pos, vals)
                   for i, (op, pos, vals) in enumerate(zip(ops, positions, zip(*values) if values else ())))
    deletes = sum(1 for op in ops if op == DELETE)
    return BatchPlan(staged, tuple(dead), stats, len(staged) - deletes, deletes)


def snapshot_rows(snapshot: "pa.Table", table: ReplicaTable, version: int) -> tuple[list[tuple[Any, ...]],
                                                                                    list[DeadRow]]:
    """A bootstrap snapshot's rows as COPY tuples (values then position), and the rows with a NULL key.

    Column by column, as :func:`plan_batch` does: decimals as their exact text, nested values as
    JSON shaped by their column's type."""
    import pyarrow.compute as pc

    pos = snapshot_position(version)
    columns = snapshot.select(list(table.column_names))
    if columns.num_rows == 0:
        return [], []
    null_key = pc.is_null(columns[table.keys[0]])
    for k in table.keys[1:]:
        null_key = pc.or_(null_key, pc.is_null(columns[k]))
    types = {f.name: f.type for f in columns.schema}
    dead = [DeadRow(version, UPSERT, f"NULL in key column(s) {', '.join(k for k in table.keys if row[k] is None)}: "
                                     f"a Postgres primary key cannot hold NULL", dead_row_json(table, row, types))
            for row in columns.filter(null_key).to_pylist()]
    kept = columns.filter(pc.invert(null_key)) if dead else columns
    values = [json_column(kept[name]) if nested else copy_values(kept[name]) for name, nested in table.json_flags]
    return [(*row, pos) for row in zip(*values)], dead


def diff_replica(table: ReplicaTable, replica: Sequence[tuple[str, str]]) -> SchemaDiff:
    """How the Postgres replica's columns (name, ``format_type``) differ from the mapped source's.

    Names compare exactly (lakemirror quotes every identifier). Added source columns can be added to
    the replica; a dropped or retyped column cannot be followed in place."""
    have = {name: pg for name, pg in replica if name != POSITION}
    want = dict(table.pg_columns)
    added = tuple(c for c in table.columns if c.name not in have)
    dropped = tuple(n for n in have if n not in want)
    retyped = tuple((n, have[n], want[n]) for n in want if n in have and have[n] != want[n])
    return SchemaDiff(added=added, dropped=dropped, retyped=retyped)
