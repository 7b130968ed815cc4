"""Honest replication lag, as a pure function. "Now minus the commit time of the last applied
version" would grow forever on an idle source; this lag does not.

Lag is 0 when every version committed at the source has been applied. Otherwise it is *now*
minus the commit time of the OLDEST source version not yet applied: an idle, caught-up source
shows 0, and a stuck stream shows a lag that grows from the moment its first missed commit
happened.

A reading is taken now and then (a probe reads the source's head), but lag is asked for at other
moments: a scrape of ``/metrics``, a status request, a batch that lands between two probes. So a
reading keeps what it needs to answer for a later moment without reading the source again: the
commit time of the oldest unapplied version (:meth:`LagReading.lag_at`: the lag keeps growing
after the reading while something is behind) and the commit times of the versions it saw
unapplied (:meth:`LagReading.repriced`: once a batch applies some of them, the oldest one left
prices the lag, or none does and the lag is 0). A reading that says "caught up" is asked once
more where that is cheap (:func:`as_of` with ``committed_at``: one look at the next version's
commit file): a commit made after the probe and applied before the next one would otherwise
never show, and with batches faster than the probe interval most commits are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar, Mapping


@dataclass(frozen=True)
class LagReading:
    lag_seconds: float
    versions_behind: int
    latest_source_version: int
    applied_through_version: int
    retention_headroom_seconds: float | None = None  # see retention.py; None = not measured
    #: When the oldest change not yet applied was committed at the source (None: caught up, or unknown).
    oldest_unapplied_at: float | None = None
    #: Commit times of the unapplied versions the reading saw (those above ``applied_through_version``;
    #: possibly not all of them), for :meth:`repriced`.
    unapplied_commit_times: Mapping[int, float] = field(default_factory=dict)
    #: Whether a runner's ``applied_through`` is in this reading's version numbers (a change feed's
    #: source versions), so that a batch applied after the reading can reprice it.
    versioned: ClassVar[bool] = True

    def lag_at(self, now: float) -> float:
        """The lag at ``now``: it keeps growing after the reading while something is behind, so a
        reading that is not renewed (a slow probe, a table still starting) never shows a frozen lag."""
        if self.versions_behind <= 0 or self.oldest_unapplied_at is None:
            return self.lag_seconds
        return max(self.lag_seconds, now - self.oldest_unapplied_at)

    def repriced(self, applied_through: int | None, now: float) -> "LagReading":
        """The reading for a replica that now holds every version up to ``applied_through``, at ``now``.

        No source read: the versions applied since the reading are no longer behind. When all of
        them are, the lag is 0 until a probe sees newer commits; otherwise the oldest version left
        prices it, from the commit times the reading kept (or, where that version's time was not
        kept, from the next version whose time was: a lower bound, renewed by the next probe).
        A reading is never repriced backwards."""
        if not self.versioned or applied_through is None or applied_through <= self.applied_through_version:
            return replace(self, lag_seconds=self.lag_at(now))
        behind = max(0, self.latest_source_version - applied_through)
        left = {v: t for v, t in self.unapplied_commit_times.items() if v > applied_through}
        if behind == 0:
            return replace(self, lag_seconds=0.0, versions_behind=0, applied_through_version=applied_through,
                           oldest_unapplied_at=None, unapplied_commit_times={})
        known = sorted(left)
        oldest = left[known[0]] if known else None
        lag = max(0.0, now - oldest) if oldest is not None else 0.0
        return replace(self, lag_seconds=lag, versions_behind=behind, applied_through_version=applied_through,
                       oldest_unapplied_at=oldest, unapplied_commit_times=left)

    def seen(self, version: int, committed_at: float, now: float) -> "LagReading":
        """The reading with ``version``, committed at ``committed_at``, found on the source since it was
        taken (and not applied): it is behind from then on. A version the reading knows changes nothing."""
        if not self.versioned or version <= self.latest_source_version:
            return self
        oldest = committed_at if self.oldest_unapplied_at is None else min(self.oldest_unapplied_at, committed_at)
        return replace(self, lag_seconds=max(self.lag_seconds, now - oldest), oldest_unapplied_at=oldest,
                       versions_behind=max(1, version - self.applied_through_version), latest_source_version=version,
                       unapplied_commit_times={**self.unapplied_commit_times, version: committed_at})


#: The version a table's replica holds now (its runner's ``applied_through``), asked at each use.
HeldVersion = Callable[[], "int | None"]
#: When a source version was committed, asked at each use: None while it is not (or where the
#: source's commit files cannot be looked at cheaply).
CommittedAt = Callable[[int], "float | None"]


def as_of(reading: LagReading, held: HeldVersion | None, now: float,
          committed_at: CommittedAt | None = None) -> LagReading:
    """``reading`` at ``now`` for the replica as it is now: repriced by what ``held`` says it holds
    (a batch that landed since the reading), or only aged (``held`` None); when that says caught up,
    ``committed_at`` (where given) is asked whether the next version has been committed since."""
    current = reading.repriced(held(), now) if held is not None else replace(reading, lag_seconds=reading.lag_at(now))
    if committed_at is None or not current.versioned or current.versions_behind > 0:
        return current
    following = current.applied_through_version + 1
    at = committed_at(following)
    return current if at is None else current.seen(following, at, now)


def compute_lag(*, applied_through: int, latest_version: int,
                commit_times: Mapping[int, float], now: float) -> LagReading:
    """``commit_times`` must hold the commit epoch seconds of ``applied_through + 1`` when behind."""
    behind = max(0, latest_version - applied_through)
    if behind == 0:
        return LagReading(0.0, 0, latest_version, applied_through)
    oldest = applied_through + 1
    if oldest not in commit_times:
        raise ValueError(f"the commit time of version {oldest} is needed to compute lag")
    unapplied = {v: t for v, t in commit_times.items() if applied_through < v <= latest_version}
    return LagReading(max(0.0, now - commit_times[oldest]), behind, latest_version, applied_through,
                      oldest_unapplied_at=commit_times[oldest], unapplied_commit_times=unapplied)
