"""Lag from the outside, pure: source commit times and replica apply events in, per-commit lag out.

A source commit ``v`` made at time ``t_v`` is reflected by the first apply event ``(t, through)``
with ``through >= v`` and ``t >= t_v``; its lag is ``t - t_v``. A commit never reflected before the
run ended is reported as unapplied (never silently dropped from the figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Apply:
    at: float        # wall time the replica's commit became visible
    through: int     # highest source version the replica reflects after it


@dataclass(frozen=True)
class LagSummary:
    commits: int
    unapplied: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float

    def as_dict(self) -> dict[str, float | int]:
        return {"commits": self.commits, "unapplied": self.unapplied, "p50": self.p50, "p95": self.p95,
                "p99": self.p99, "max": self.max, "mean": self.mean}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of non-empty ``values``."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def lags(commits: dict[int, float], applies: Iterable[Apply]) -> tuple[dict[int, float], list[int]]:
    """Per source version, the seconds until the replica reflected it; and the versions never reflected."""
    events = sorted(applies, key=lambda a: a.at)
    out: dict[int, float] = {}
    for version, made in commits.items():
        for event in events:
            if event.through >= version and event.at >= made:
                out[version] = event.at - made
                break
    return out, sorted(set(commits) - set(out))


def summarize(commits: dict[int, float], applies: Iterable[Apply]) -> LagSummary:
    found, missing = lags(commits, applies)
    values = list(found.values())
    if not values:
        return LagSummary(len(commits), len(missing), math.nan, math.nan, math.nan, math.nan, math.nan)
    return LagSummary(len(commits), len(missing), percentile(values, 50), percentile(values, 95),
                      percentile(values, 99), max(values), sum(values) / len(values))


def summarize_runs(runs: Iterable[tuple[dict[int, float], list[Apply]]]) -> LagSummary:
    """One summary over several tables' commits (each table's versions are its own)."""
    values: list[float] = []
    commits = unapplied = 0
    for table_commits, applies in runs:
        found, missing = lags(table_commits, applies)
        values.extend(found.values())
        commits += len(table_commits)
        unapplied += len(missing)
    if not values:
        return LagSummary(commits, unapplied, math.nan, math.nan, math.nan, math.nan, math.nan)
    return LagSummary(commits, unapplied, percentile(values, 50), percentile(values, 95), percentile(values, 99),
                      max(values), sum(values) / len(values))


def lag_at(commits: dict[int, float], applies: Iterable[Apply], at: float) -> float:
    """The lag ``lakemirror_lag_seconds`` stands for, from the outside, at the moment ``at``: ``at``
    minus the time of the oldest source commit made by then and not yet reflected by an apply at or
    before it; 0 when there is none. The per-commit figures (:func:`lags`) answer another question
    (how long each commit waited), so a scrape of the metric is compared with this, at its moment."""
    reflected = max((a.through for a in applies if a.at <= at), default=-1)
    pending = [made for version, made in commits.items() if version > reflected and made <= at]
    return at - min(pending) if pending else 0.0


def sampled_lag(tables: Iterable[tuple[dict[int, float], list[Apply]]], moments: Sequence[float]) -> list[float]:
    """At each of ``moments``, the largest outside lag over the tables (:func:`lag_at`): what a scrape
    of the metric that takes the largest value over the tables should read then."""
    runs = list(tables)
    return [max((lag_at(commits, applies, at) for commits, applies in runs), default=0.0) for at in moments]
