"""The sequence guard, planned: what one batch of change events does to a replica, as data.

Pure: no pyspark import. The Delta executor (:mod:`lakemirror.sinks.events.guard_merge`) carries a
:class:`GuardPlan` out with one MERGE per replica; the in-memory twin
(:class:`GuardedMemoryReplica`) carries it out on dicts and is the oracle of the tests.

The rules (the semantics of Databricks' AUTO CDC / APPLY CHANGES, with each event's source log
position as its sequence), for events that may arrive in any order, any number of times:

- a change's order is its :class:`~lakemirror.sources.change_event.Position`, then its operation's
  rank (a delete before an upsert at one position); per key, the batch's winner is the highest
  order; exact redeliveries (equal content) are counted and dropped;
- against the replica, a change applies only if its order is strictly newer than the order stored
  with the key: on the live row (``_lakemirror_position``) or on the key's tombstone. Replays,
  redeliveries and late events therefore never move a row backwards;
- a delete leaves a tombstone (key, order, deletion time) so a late, older insert cannot bring the
  row back; tombstones older than the configured horizon are purged (an event later than the
  horizon could then resurrect its row: the horizon must exceed the worst delivery delay);
- a truncate at order T empties the table of every row older than T and leaves a table-wide floor:
  any later-arriving change older than T is dropped;
- two different events of one key at one order (no real log produces them) are settled by their
  content digest, so a batch's winner never depends on arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from lakemirror.sources.change_event import DELETE, TRUNCATE, UPSERT, ChangeEvent, Order

Key = tuple[Any, ...]

#: The replica's column holding the order that wrote the row: a struct of five BIGINTs.
POSITION_COLUMN = "_lakemirror_position"
POSITION_FIELDS = ("phase", "major", "minor", "micro", "rank")
#: The winner's operation in the MERGE's source (never written to the replica).
OP_COLUMN = "_lakemirror_op"
#: Tombstones: when the delete was applied (purged past the horizon).
DELETED_AT_COLUMN = "_lakemirror_deleted_at"
#: Tombstones: 'key' for a deleted row, 'table' for a truncate's floor (key columns NULL).
SCOPE_COLUMN = "_lakemirror_scope"
SCOPE_KEY, SCOPE_TABLE = "key", "table"
RESERVED_COLUMNS = (POSITION_COLUMN, OP_COLUMN, DELETED_AT_COLUMN, SCOPE_COLUMN)


@dataclass(frozen=True)
class TablePlan:
    """What one batch does to one replica."""

    table: str
    key_columns: tuple[str, ...]
    winners: tuple[ChangeEvent, ...]          # one per key, the highest order; none older than ``truncate``
    truncate: Order | None = None             # the batch's newest truncate of the table, if any
    events: int = 0                           # change events of the table in the batch
    duplicates: int = 0                       # exact redeliveries dropped
    superseded: int = 0                       # older changes of a key folded into its winner

    @property
    def upserts(self) -> tuple[ChangeEvent, ...]:
        return tuple(w for w in self.winners if w.op == UPSERT)

    @property
    def deletes(self) -> tuple[ChangeEvent, ...]:
        return tuple(w for w in self.winners if w.op == DELETE)

    def column_names(self) -> tuple[str, ...]:
        """Every column any upsert names, key columns first, then in order of first appearance."""
        seen: dict[str, None] = dict.fromkeys(self.key_columns)
        for w in self.upserts:
            seen.update(dict.fromkeys(w.columns))
        return tuple(seen)


@dataclass(frozen=True)
class KeyConflict:
    """A table's events disagree on its key columns (e.g. a key changed its columns mid-stream)."""

    table: str
    reason: str


def _rank(event: ChangeEvent) -> tuple[Order, str]:
    return (event.order(), event.digest())


@dataclass(frozen=True)
class TableEvents:
    """One table's distinct change events of a batch (exact redeliveries dropped), arrival order kept."""

    key_columns: tuple[str, ...]
    changes: tuple[ChangeEvent, ...]        # keyed changes (upserts and deletes)
    truncates: tuple[ChangeEvent, ...]
    events: int = 0                         # change events of the table in the batch, duplicates included
    duplicates: int = 0


def split_by_table(events: Iterable[ChangeEvent]) -> tuple[dict[str, TableEvents], list[tuple[ChangeEvent, str]]]:
    """Group a batch's change events by table, drop exact redeliveries (equal digests), and refuse the
    events whose key columns differ from the first keyed event of their table in the batch."""
    by_table: dict[str, list[ChangeEvent]] = {}
    for event in events:
        by_table.setdefault(event.table, []).append(event)
    out: dict[str, TableEvents] = {}
    refused: list[tuple[ChangeEvent, str]] = []
    for table, table_events in by_table.items():
        key_columns: tuple[str, ...] | None = None
        seen: set[str] = set()
        changes: list[ChangeEvent] = []
        truncates: list[ChangeEvent] = []
        for event in table_events:
            digest = event.digest()
            if digest in seen:
                continue
            seen.add(digest)
            if event.op == TRUNCATE:
                truncates.append(event)
                continue
            if key_columns is None:
                key_columns = event.key_columns
            elif event.key_columns != key_columns:
                refused.append((event, f"key columns {list(event.key_columns)} differ from the table's "
                                       f"{list(key_columns)}"))
                continue
            changes.append(event)
        out[table] = TableEvents(key_columns or (), tuple(changes), tuple(truncates), len(table_events),
                                 len(table_events) - len(seen))
    return out, refused


def plan_batch(events: Iterable[ChangeEvent]) -> tuple[dict[str, TablePlan], list[tuple[ChangeEvent, str]]]:
    """Group a batch's change events by table and fold each key to its winner.

    Returns the per-table plans and the events refused (with the reason): events whose key columns
    differ from the first keyed event of their table in the batch.
    """
    split, refused = split_by_table(events)
    plans: dict[str, TablePlan] = {}
    for table, te in split.items():
        winners: dict[Key, ChangeEvent] = {}
        truncate = max((t.order() for t in te.truncates), default=None)
        superseded = 0
        for event in te.changes:
            best = winners.get(event.key)
            if best is None:
                winners[event.key] = event
            else:
                superseded += 1
                if _rank(event) > _rank(best):
                    winners[event.key] = event
        kept = tuple(w for w in winners.values() if truncate is None or w.order() > truncate)
        superseded += len(winners) - len(kept)
        plans[table] = TablePlan(table, te.key_columns, kept, truncate, te.events, te.duplicates, superseded)
    return plans, refused


# -- the in-memory twin ------------------------------------------------------------------------------


@dataclass
class Stored:
    order: Order
    columns: dict[str, Any] | None = None     # None: a tombstone
    deleted_at: float | None = None


@dataclass
class GuardCounts:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0          # winners older than (or as old as) what the replica holds
    truncated: int = 0      # rows removed by a truncate


@dataclass
class GuardedMemoryReplica:
    """A replica with its tombstones and truncate floor in dicts, guarded as the Delta replica is."""

    rows: dict[Key, Stored] = field(default_factory=dict)
    tombstones: dict[Key, Stored] = field(default_factory=dict)
    floor: Order | None = None

    def live(self) -> dict[Key, dict[str, Any]]:
        return {k: dict(v.columns or {}) for k, v in self.rows.items()}

    def newest(self, key: Key) -> Order | None:
        orders = [s.order for s in (self.rows.get(key), self.tombstones.get(key)) if s is not None]
        if self.floor is not None:
            orders.append(self.floor)
        return max(orders) if orders else None

    def apply(self, plan: TablePlan, now: float) -> GuardCounts:
        counts = GuardCounts()
        if plan.truncate is not None and (self.floor is None or plan.truncate > self.floor):
            self.floor = plan.truncate
            for key in [k for k, s in self.rows.items() if s.order < plan.truncate]:
                del self.rows[key]
                counts.truncated += 1
            self.tombstones = {k: s for k, s in self.tombstones.items() if s.order >= plan.truncate}
        for change in plan.winners:
            newest = self.newest(change.key)
            if newest is not None and change.order() <= newest:
                counts.stale += 1
                continue
            if change.op == DELETE:
                if self.rows.pop(change.key, None) is not None:
                    counts.deleted += 1
                self.tombstones[change.key] = Stored(change.order(), None, now)
            else:
                counts.updated += change.key in self.rows
                counts.inserted += change.key not in self.rows
                self.rows[change.key] = Stored(change.order(), dict(change.columns))
        return counts

    def purge(self, now: float, horizon_seconds: float) -> int:
        """Forget tombstones older than the horizon; how many were purged."""
        old = [k for k, s in self.tombstones.items() if s.deleted_at is not None and s.deleted_at < now - horizon_seconds]
        for key in old:
            del self.tombstones[key]
        return len(old)


def ordered_fold(events: Iterable[ChangeEvent]) -> dict[Key, dict[str, Any]]:
    """The reference: every distinct event applied once, oldest first, to a plain dict."""
    unique = {e.digest(): e for e in events}
    rows: dict[Key, dict[str, Any]] = {}
    for event in sorted(unique.values(), key=_rank):
        if event.op == TRUNCATE:
            rows.clear()
        elif event.op == DELETE:
            rows.pop(event.key, None)
        else:
            rows[event.key] = dict(event.columns)
    return rows


def position_value(order: Order) -> dict[str, int]:
    """An order as the replica's position struct."""
    return dict(zip(POSITION_FIELDS, order))


def row_order(value: Mapping[str, Any] | None) -> Order | None:
    """The order stored in a replica's position struct (None for a row written without one)."""
    if value is None:
        return None
    return tuple(int(value[f]) for f in POSITION_FIELDS)  # type: ignore[return-value]
