"""History (SCD type 2), planned: what one batch of change events does to a replica that keeps one row
per key version, as data.

Pure: no pyspark import. The Delta executor (:mod:`lakemirror.sinks.events.history_merge`) carries a
:class:`HistoryWrite` out with one MERGE per replica; the in-memory twin (:class:`HistoryMemoryReplica`)
carries it out on dicts and, with :func:`history_fold`, is the oracle of the tests.

The rule is one sentence: **the replica equals the SCD2 fold of every distinct event of the table,
ordered by position, whatever order, duplication or batching the events arrived in.** The fold
(:func:`fold_versions`) walks a key's changes oldest first:

- an upsert at order ``o`` closes the open version (its ``end`` becomes ``o``) and opens a new
  one starting at ``o``;
- a delete (or a truncate of the table) at ``o`` closes the open version, if any, at ``o``; a later
  upsert (a re-insert) opens a new version;
- orders are those of the sequence guard (:meth:`ChangeEvent.order`: the position, then a delete
  before an upsert at one position), so a primary-key update (a delete and a create at one
  position) and a snapshot read (older than every streamed change) land where the current-rows
  replica puts them.

A late, older event is therefore inserted into the chain at its position: the version before it is
closed at it, and it ends where that version used to end (the next version's start, a delete, or
never: then it is current only if nothing newer exists). Redeliveries change nothing: a version is
identified by (key, start order) and a close by (key, order).

What the replica stores so that any later event can be folded in exactly:

- every version (columns, ``start`` / ``end`` orders, the source commit times of both) as a row;
  a version whose end has an operation rank of 0 was closed by a delete or a truncate, so the
  versions alone remember every close that ends one of them;
- a close that ends no version (a delete that arrived before its row's insert, or one whose
  version a later-arriving, older delete closed earlier) goes to a side table of remembered
  closes, kept for the tombstone horizon like the current-rows tombstones; every truncate of the
  table is kept there too (never purged).

Each batch reads only what the batch can change: the versions of its keys that end at or after the
batch's oldest order (older versions cannot change, and a close before the first of them has
nothing open to close), the remembered closes of its keys, the table's truncates and, when the batch
brings a truncate older than stored history, the closed versions spanning it. Versions that are
current, start before a new truncate and belong to keys the batch does not touch are closed by the
MERGE itself (``WHEN NOT MATCHED BY SOURCE``), as :meth:`HistoryMemoryReplica.apply` does here.

Two *different* events of one key at one order (no real log produces them): inside a batch the one
with the highest content digest opens the version; across batches the version already stored stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from lakemirror.sinks.events.guard_plan import Key, TableEvents, _rank, split_by_table
from lakemirror.sources.change_event import DELETE, TRUNCATE, UPSERT, ChangeEvent, Order

#: The replica's history columns (besides ``_lakemirror_position``, the order that opened the version).
VALID_FROM, VALID_TO, IS_CURRENT = "valid_from", "valid_to", "is_current"
#: The order that closed the version (NULL while it is current).
END_POSITION_COLUMN = "_lakemirror_end_position"
HISTORY_COLUMNS = (VALID_FROM, VALID_TO, IS_CURRENT, END_POSITION_COLUMN)

HISTORY_CURRENT, HISTORY_SCD2 = "current", "scd2"


@dataclass(frozen=True)
class Version:
    """One version of one key: the row as it was from ``start`` (inclusive) to ``end`` (exclusive)."""

    key: Key
    start: Order
    columns: Mapping[str, Any]
    end: Order | None = None
    start_ts_ms: int | None = None      # the source commit time of the change that opened it (valid_from)
    end_ts_ms: int | None = None        # ... and of the change that closed it (valid_to)

    @property
    def is_current(self) -> bool:
        return self.end is None


@dataclass(frozen=True)
class Close:
    """A delete of one key (``key``) or a truncate of the table (``key`` None), as the history keeps it."""

    key: Key | None
    order: Order
    ts_ms: int | None = None


@dataclass(frozen=True)
class HistoryTablePlan:
    """One table's share of a batch: its distinct changes per key, oldest first, and its truncates."""

    table: str
    key_columns: tuple[str, ...]
    changes: Mapping[Key, tuple[ChangeEvent, ...]]
    truncates: tuple[ChangeEvent, ...] = ()
    events: int = 0
    duplicates: int = 0

    @property
    def winners(self) -> tuple[ChangeEvent, ...]:
        """The newest change per key (what status reports: position basis, source times)."""
        return tuple(max(evs, key=_rank) for evs in self.changes.values())

    @property
    def upserts(self) -> tuple[ChangeEvent, ...]:
        return tuple(e for evs in self.changes.values() for e in evs if e.op == UPSERT)

    def oldest(self) -> Order | None:
        """The oldest order of the batch: versions that ended before it cannot change."""
        orders = [e.order() for evs in self.changes.values() for e in evs] + [t.order() for t in self.truncates]
        return min(orders, default=None)

    def column_names(self) -> tuple[str, ...]:
        """Every column any upsert names, key columns first, then in order of first appearance."""
        seen: dict[str, None] = dict.fromkeys(self.key_columns)
        for e in self.upserts:
            seen.update(dict.fromkeys(e.columns))
        return tuple(seen)


def _distinct_per_order(events: Iterable[ChangeEvent]) -> tuple[ChangeEvent, ...]:
    """One event per order (the highest content digest), oldest first."""
    best: dict[Order, ChangeEvent] = {}
    for e in events:
        held = best.get(e.order())
        if held is None or e.digest() > held.digest():
            best[e.order()] = e
    return tuple(best[o] for o in sorted(best))


def _table_plan(table: str, te: TableEvents) -> HistoryTablePlan:
    by_key: dict[Key, list[ChangeEvent]] = {}
    for e in te.changes:
        by_key.setdefault(e.key, []).append(e)
    return HistoryTablePlan(table, te.key_columns, {k: _distinct_per_order(v) for k, v in by_key.items()},
                            _distinct_per_order(te.truncates), te.events, te.duplicates)


def plan_history_batch(events: Iterable[ChangeEvent]) -> tuple[dict[str, HistoryTablePlan],
                                                                 list[tuple[ChangeEvent, str]]]:
    """Group a batch's change events by table and key (redeliveries dropped); the events refused
    (key columns differing from their table's) with the reason, as :func:`guard_plan.plan_batch`."""
    split, refused = split_by_table(events)
    return {table: _table_plan(table, te) for table, te in split.items()}, refused


# -- the fold ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    order: Order
    opens: bool
    columns: Mapping[str, Any] = field(default_factory=dict)
    ts_ms: int | None = None


def fold_versions(key: Key, steps: Iterable[_Step]) -> list[Version]:
    """The versions of one key: ``steps`` (opens and closes, at most one open per order) oldest first."""
    versions: list[Version] = []
    open_: Version | None = None
    for s in sorted(steps, key=lambda s: (s.order, s.opens)):
        if open_ is not None:
            versions[-1] = replace(open_, end=s.order, end_ts_ms=s.ts_ms)
            open_ = None
        if s.opens:
            open_ = Version(key, s.order, dict(s.columns), None, s.ts_ms)
            versions.append(open_)
    return versions


def _step(e: ChangeEvent) -> _Step:
    return _Step(e.order(), e.op == UPSERT, e.columns if e.op == UPSERT else {}, e.ts_ms)


def history_fold(events: Iterable[ChangeEvent]) -> dict[Key, list[Version]]:
    """The reference: every distinct event, ordered by position, folded into versions per key."""
    unique = list({e.digest(): e for e in events}.values())
    truncates = [_step(e) for e in unique if e.op == TRUNCATE]
    by_key: dict[Key, list[ChangeEvent]] = {}
    for e in unique:
        if e.op != TRUNCATE:
            by_key.setdefault(e.key, []).append(e)
    out: dict[Key, list[Version]] = {}
    for key, evs in by_key.items():
        versions = fold_versions(key, [_step(e) for e in _distinct_per_order(evs)] + truncates)
        if versions:
            out[key] = versions
    return out


# -- the plan against what the replica holds ---------------------------------------------------------


@dataclass(frozen=True)
class StoredHistory:
    """What the executor read for one batch (see the module's docstring for which rows)."""

    versions: Mapping[Key, Sequence[Version]] = field(default_factory=dict)
    closes: Mapping[Key, Sequence[Close]] = field(default_factory=dict)   # remembered closes of the batch's keys
    truncates: Sequence[Close] = ()                                        # every remembered truncate


@dataclass(frozen=True)
class HistoryWrite:
    """What one batch writes: new versions, stored versions with a new end, closes to remember."""

    inserts: tuple[Version, ...] = ()
    updates: tuple[Version, ...] = ()       # stored versions (same key and start) whose end changed
    closes: tuple[Close, ...] = ()          # closes that end no version, and new truncates
    truncates: tuple[Close, ...] = ()       # the batch's new truncates: current versions of untouched keys
                                            # that started before one are closed at it (by the executor)
    stale: int = 0                          # changes already in the history (redeliveries across batches)

    @property
    def empty(self) -> bool:
        return not (self.inserts or self.updates or self.closes)


def plan_history(plan: HistoryTablePlan, stored: StoredHistory) -> HistoryWrite:
    """Fold the batch's changes into the stored history of the keys they (or a new truncate) touch."""
    known_truncates = {t.order for t in stored.truncates}
    new_truncates = tuple(Close(None, t.order(), t.ts_ms) for t in plan.truncates if t.order() not in known_truncates)
    truncate_steps = [_Step(t.order, False, ts_ms=t.ts_ms) for t in (*stored.truncates, *new_truncates)]
    truncate_orders = {t.order for t in truncate_steps}
    inserts: list[Version] = []
    updates: list[Version] = []
    closes: list[Close] = list(new_truncates)
    stale = len(plan.truncates) - len(new_truncates)
    for key in {**dict.fromkeys(plan.changes), **dict.fromkeys(stored.versions)}:
        versions = list(stored.versions.get(key, ()))
        starts = {v.start: v for v in versions}
        remembered = {c.order: c for c in stored.closes.get(key, ())}
        ended = {v.end for v in versions if v.end is not None}
        steps = [_Step(v.start, True, v.columns, v.start_ts_ms) for v in versions]
        steps += [_Step(v.end, False, ts_ms=v.end_ts_ms) for v in versions if v.end is not None and v.end[-1] == 0]
        steps += [_Step(c.order, False, ts_ms=c.ts_ms) for c in remembered.values()]
        for e in plan.changes.get(key, ()):
            if e.op == UPSERT:
                if e.order() in starts:
                    stale += 1
                    continue
            elif e.order() in remembered or e.order() in ended:
                stale += 1
                continue
            steps.append(_step(e))
        steps += truncate_steps
        desired = fold_versions(key, steps)
        for d in desired:
            held = starts.get(d.start)
            if held is None:
                inserts.append(d)
            elif (held.end, held.end_ts_ms) != (d.end, d.end_ts_ms):
                updates.append(replace(held, end=d.end, end_ts_ms=d.end_ts_ms))
        ends = {d.end for d in desired if d.end is not None}
        key_closes = {s.order: s for s in steps if not s.opens and s.order not in truncate_orders}
        closes += [Close(key, o, s.ts_ms) for o, s in sorted(key_closes.items())
                   if o not in ends and o not in remembered]
    return HistoryWrite(tuple(inserts), tuple(updates), tuple(closes), new_truncates, stale)


# -- the in-memory twin ------------------------------------------------------------------------------


@dataclass
class HistoryMemoryReplica:
    """A history replica in dicts, read and written as the Delta executor reads and writes it."""

    versions: dict[tuple[Key, Order], Version] = field(default_factory=dict)
    closes: dict[tuple[Key | None, Order], tuple[Close, float]] = field(default_factory=dict)   # with the time kept

    def rows(self) -> dict[Key, list[Version]]:
        out: dict[Key, list[Version]] = {}
        for (key, _), v in sorted(self.versions.items(), key=lambda kv: kv[0][1]):
            out.setdefault(key, []).append(v)
        return out

    def read(self, plan: HistoryTablePlan) -> StoredHistory:
        """What the executor reads for ``plan``: the same rows, by the same filters."""
        oldest = plan.oldest()
        truncates = [c for (k, _), (c, _) in self.closes.items() if k is None]
        known = {t.order for t in truncates}
        new = [t.order() for t in plan.truncates if t.order() not in known]
        keys = set(plan.changes)
        keys |= {k for (k, _), v in self.versions.items()
                 if v.end is not None and any(v.start < t < v.end for t in new)}
        versions: dict[Key, list[Version]] = {}
        for (k, _), v in self.versions.items():
            if k in keys and (oldest is None or v.end is None or v.end >= oldest):
                versions.setdefault(k, []).append(v)
        closes: dict[Key, list[Close]] = {}
        for (held, _), (c, _) in self.closes.items():
            if held is not None and held in plan.changes:
                closes.setdefault(held, []).append(c)
        return StoredHistory(versions, closes, truncates)

    def apply(self, write: HistoryWrite, now: float) -> None:
        written = {(v.key, v.start) for v in (*write.inserts, *write.updates)}
        for v in (*write.inserts, *write.updates):
            self.versions[(v.key, v.start)] = v
        # the MERGE's WHEN NOT MATCHED BY SOURCE: rows the batch does not write, current and older than a
        # new truncate, are closed at the oldest such truncate
        for (k, s), v in list(self.versions.items()):
            if (k, s) in written or not v.is_current:
                continue
            t = min((t for t in write.truncates if v.start < t.order), key=lambda t: t.order, default=None)
            if t is not None:
                self.versions[(k, s)] = replace(v, end=t.order, end_ts_ms=t.ts_ms)
        for c in write.closes:
            self.closes.setdefault((c.key, c.order), (c, now))

    def purge(self, now: float, horizon_seconds: float) -> int:
        """Forget remembered deletes older than the horizon (truncates stay); how many."""
        old = [k for k, (c, at) in self.closes.items() if c.key is not None and at < now - horizon_seconds]
        for k in old:
            del self.closes[k]
        return len(old)
