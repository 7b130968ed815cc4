"""Honest replication lag, as a pure function. "Now minus the commit time of the last applied
version" would grow forever on an idle source; this lag does not.

Lag is 0 when every version committed at the source has been applied. Otherwise it is *now*
minus the commit time of the OLDEST source version not yet applied: an idle, caught-up source
shows 0, and a stuck stream shows a lag that grows from the moment its first missed commit
happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class LagReading:
    lag_seconds: float
    versions_behind: int
    latest_source_version: int
    applied_through_version: int
    retention_headroom_seconds: float | None = None  # see retention.py; None = not measured
    #: When the oldest change not yet applied was committed at the source (None: caught up, or unknown).
    oldest_unapplied_at: float | None = None

    def lag_at(self, now: float) -> float:
        """The lag at ``now``: it keeps growing after the reading while something is behind, so a
        reading that is not renewed (a slow probe, a table still starting) never shows a frozen lag."""
        if self.versions_behind <= 0 or self.oldest_unapplied_at is None:
            return self.lag_seconds
        return max(self.lag_seconds, now - self.oldest_unapplied_at)


def compute_lag(*, applied_through: int, latest_version: int,
                commit_times: Mapping[int, float], now: float) -> LagReading:
    """``commit_times`` must hold the commit epoch seconds of ``applied_through + 1`` when behind."""
    behind = max(0, latest_version - applied_through)
    if behind == 0:
        return LagReading(0.0, 0, latest_version, applied_through)
    oldest = applied_through + 1
    if oldest not in commit_times:
        raise ValueError(f"the commit time of version {oldest} is needed to compute lag")
    return LagReading(max(0.0, now - commit_times[oldest]), behind, latest_version, applied_through,
                      oldest_unapplied_at=commit_times[oldest])
