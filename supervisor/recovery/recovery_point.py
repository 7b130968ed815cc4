"""A recovery point consistent across tables: which replica version of each table shows the source as
it was at one instant ``T``. Pure.

Each table's replica is exact, but the replicas of related tables (orders and their lines) are not
at the same moment: each applies its source's change feed in batches of its own. A failover that
switches readers to the latest version of every replica can show an order whose lines have not
arrived, or lines whose order has not. This module finds, instead, one source instant ``T`` and for
every table the replica version that reflects exactly its source as of ``T``.

What a replica version reflects. Every batch commit of a replica applies the source's changes of
the versions ``first_version … last_version`` (contiguous with the previous batch: no change in
between is skipped), and its checkpoint row records the commit times of those two source versions.
After the batch, the replica holds the source as of ``last_version``; it keeps showing the source
exactly until the next source version that changed data, ``first_version`` of the next batch. So a
replica commit is exact for every ``T`` in ``[time(last_version), time(next batch's first_version))``.
For the newest commit the end is what the caller knows of the source: the commit time of its first
version not yet applied, or the time it was seen with nothing newer (``TableTimeline.exact_until``);
without either (the source cannot be reached, as in a disaster) the newest commit is exact only at
its own source time. Inside a batch that applied several source versions at once no replica version
shows the intermediate states: those instants are not recoverable for that table.

The recovery point for ``T`` takes, per table, the commit whose interval holds ``T``; without ``T``,
the newest instant at which every table has such a commit (the start of that common interval: the
cut shows the source from ``as_of`` until ``valid_until``). ``anchor`` restricts the candidates to
the instants a given table's commits begin at: for writers that commit to several tables in steps
and to one table last (lines after their order), the source is consistent across the tables only
once a step's last commit is in, and each of the anchor's own commit times is such an instant.

Delta has no transactions across tables: the source itself is consistent across tables only at the
instants its writers make it so. The cut shows the sources exactly as they were at ``T``; choosing a
``T`` at which they were consistent is what ``anchor`` is for.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping, Sequence


@dataclass(frozen=True)
class ReplicaCommit:
    """One batch commit of a replica and the source versions it applied."""

    replica_version: int
    first_version: int
    last_version: int
    first_time: float | None    # commit time of first_version (None: not recorded)
    last_time: float            # commit time of last_version: the replica reflects the source as of then
    epoch: int = 0              # the bootstrap epoch: a resync rewrote the replica between two epochs


@dataclass(frozen=True)
class TableTimeline:
    """A table's replica commits (any order) and what is known past the newest one."""

    table: str
    replica: str
    commits: tuple[ReplicaCommit, ...]
    #: The newest commit is exact until (excluding) this time; None: only at its own source time.
    exact_until: float | None = None


@dataclass(frozen=True)
class Interval:
    """The instants ``start <= T < end`` (``end`` None: only ``T == start``) at which ``commit`` is exact."""

    start: float
    end: float | None
    commit: ReplicaCommit

    def holds(self, t: float) -> bool:
        return t == self.start if self.end is None else self.start <= t < self.end


def intervals(timeline: TableTimeline) -> list[Interval]:
    """The instants each commit of ``timeline`` is exact at, in time order (see the module docstring)."""
    commits = sorted(timeline.commits, key=lambda c: c.replica_version)
    # One commit per applied range (a batch replayed on a restart commits nothing new).
    unique: list[ReplicaCommit] = []
    for c in commits:
        if unique and (c.epoch, c.last_version) == (unique[-1].epoch, unique[-1].last_version):
            continue
        unique.append(c)
    out: list[Interval] = []
    for i, c in enumerate(unique):
        if i + 1 < len(unique):
            nxt = unique[i + 1]
            if nxt.epoch != c.epoch:  # a new snapshot replaced the replica in between: nothing known
                end = None
            else:
                end = nxt.first_time if nxt.first_time is not None else (
                    nxt.last_time if nxt.first_version == nxt.last_version else None)
        else:
            end = timeline.exact_until
        out.append(Interval(c.last_time, end if end is not None and end > c.last_time else None, c))
    return out


@dataclass(frozen=True)
class TableCut:
    table: str
    replica: str
    replica_version: int
    source_version: int
    source_time: float


@dataclass(frozen=True)
class RecoveryPoint:
    """Per table, the replica version showing its source as of ``as_of`` (and until ``valid_until``,
    exclusive; None: at ``as_of`` only, as far as recorded)."""

    as_of: float
    valid_until: float | None
    tables: tuple[TableCut, ...]

    def versions(self) -> dict[str, int]:
        return {t.table: t.replica_version for t in self.tables}


class NoRecoveryPoint(Exception):
    """No cut exists (at the time asked for); ``reasons`` names each table that prevents it and why."""

    def __init__(self, message: str, reasons: Mapping[str, str]) -> None:
        super().__init__(message)
        self.reasons = dict(reasons)


def _containing(spans: list[Interval], starts: list[float], t: float) -> Interval | None:
    i = bisect.bisect_right(starts, t) - 1
    return spans[i] if i >= 0 and spans[i].holds(t) else None


def recovery_point(timelines: Sequence[TableTimeline], at: float | None = None,
                   anchor: str | None = None) -> RecoveryPoint:
    """The cut at ``at``, or the newest one (see the module docstring); raises :class:`NoRecoveryPoint`."""
    if not timelines:
        raise NoRecoveryPoint("no tables to cut", {})
    names = [t.table for t in timelines]
    if anchor is not None and anchor not in names:
        raise NoRecoveryPoint(f"anchor {anchor!r} is not one of the tables ({', '.join(names)})",
                              {anchor: "not a table of the cut"})
    empty = {t.table: "no applied batch with source commit times recorded (nothing applied since the "
                      "bootstrap, or checkpoint rows from before commit times were recorded)"
             for t in timelines if not t.commits}
    if empty:
        raise NoRecoveryPoint("some tables have no recorded replica commits", empty)
    spans = {t.table: intervals(t) for t in timelines}
    starts = {name: [s.start for s in ss] for name, ss in spans.items()}

    def cut_at(t: float) -> dict[str, Interval] | None:
        found = {}
        for name in names:
            hit = _containing(spans[name], starts[name], t)
            if hit is None:
                return None
            found[name] = hit
        return found

    if at is not None:
        found = cut_at(at)
        if found is None:
            reasons = {name: _why(spans[name], at) for name in names
                       if _containing(spans[name], starts[name], at) is None}
            raise NoRecoveryPoint(f"no replica version of {', '.join(sorted(reasons))} shows its source as of "
                                  f"{instant(at)}: " + "; ".join(f"{k}: {v}" for k, v in sorted(reasons.items())),
                                  reasons)
        return _point(at, found, timelines)
    candidates = sorted(set(starts[anchor] if anchor else [s for ss in starts.values() for s in ss]), reverse=True)
    for t in candidates:
        found = cut_at(t)
        if found is not None:
            return _point(t, found, timelines)
    raise NoRecoveryPoint("the replicas have no instant in common at which each shows its source exactly "
                          "(their batches never ended together)" + (f" at a commit of {anchor}" if anchor else ""),
                          {name: f"exact at {len(spans[name])} instants or intervals" for name in names})


def instant(t: float) -> str:
    """``t`` (seconds since the epoch) as ISO 8601 in UTC, to the millisecond."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _why(spans: list[Interval], t: float) -> str:
    if t < spans[0].start:
        return f"its oldest recorded replica commit shows the source as of {instant(spans[0].start)}, after that"
    last = spans[-1]
    if (last.end is None and t > last.start) or (last.end is not None and t >= last.end):
        return (f"its newest replica commit shows the source as of {instant(last.start)}; nothing after that is "
                f"known to be applied")
    return "that instant falls inside a batch that applied several source versions in one replica commit"


def _point(t: float, found: Mapping[str, Interval], timelines: Sequence[TableTimeline]) -> RecoveryPoint:
    ends = [i.end for i in found.values()]
    until = None if any(e is None for e in ends) else min(e for e in ends if e is not None)
    by_name = {tl.table: tl for tl in timelines}
    return RecoveryPoint(t, until, tuple(
        TableCut(name, by_name[name].replica, i.commit.replica_version, i.commit.last_version, i.commit.last_time)
        for name, i in sorted(found.items())))
