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


def compute_lag(*, applied_through: int, latest_version: int,
                commit_times: Mapping[int, float], now: float) -> LagReading:
    """``commit_times`` must hold the commit epoch seconds of ``applied_through + 1`` when behind."""
    behind = max(0, latest_version - applied_through)
    if behind == 0:
        return LagReading(0.0, 0, latest_version, applied_through)
    oldest = applied_through + 1
    if oldest not in commit_times:
        raise ValueError(f"the commit time of version {oldest} is needed to compute lag")
    return LagReading(max(0.0, now - commit_times[oldest]), behind, latest_version, applied_through)
