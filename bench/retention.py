"""The retention run of the chunked bootstrap workload, its pure part (no Spark, no files).

A writer (bench/retention_writer.py) changes the source while lakemirror bootstraps it, and
VACUUMs it with a retention shorter than the whole bootstrap. Here: which keys each of its
commits changes (:func:`plan_step`), what the daemon's log says of its change-feed capture rounds
(:func:`catch_ups`), and the figures the report gives (:func:`summarize`).

The changed keys lie in two hot ranges of the source's ids: its first ``hot`` ids, which the
bootstrap's first chunk copies (so the captured changes are MERGEd onto rows already copied), and
its last ``hot`` ids, which the last chunk copies (reading them at its own, later version, so the
changes captured before it must not be applied again), plus new ids above them. Keeping the changes
in two key ranges keeps each writer MERGE to a few of the source's files: the run measures whether
changes are lost, not how a MERGE scales with scattered keys.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

#: One change of a writer step: (id, op), op one of "u" (update), "d" (delete), "i" (insert).
Change = tuple[int, str]

_CAPTURE = re.compile(r"bootstrap capture (\d+) copied source versions (\d+)\.\.(\d+) of the change feed "
                      r"\((\d+|\?) change rows")


@dataclass(frozen=True)
class HotKeys:
    """The writer's view of the keys it may change: live ones, deleted ones (to insert again), and
    the next new id."""

    live: tuple[int, ...]
    deleted: tuple[int, ...] = ()
    next_id: int = 0

    @classmethod
    def of_source(cls, rows: int, hot: int) -> "HotKeys":
        """The first and last ``hot`` ids of a source of ids ``0 .. rows-1``; new ids from ``rows``."""
        if rows <= 0 or hot <= 0:
            raise ValueError(f"rows and hot must be positive (got rows={rows}, hot={hot})")
        hot = min(hot, (rows + 1) // 2)
        return cls(live=tuple(sorted({*range(hot), *range(rows - hot, rows)})), next_id=rows)


@dataclass(frozen=True)
class StepSizes:
    """How many keys one writer commit updates, deletes, inserts again (deleted by an earlier
    commit) and inserts new."""

    updates: int = 20
    deletes: int = 5
    reinserts: int = 3
    inserts: int = 2


@dataclass(frozen=True)
class Step:
    """One writer commit: its changes, how many of each kind, and the keys after it."""

    changes: list[Change]
    counts: dict[str, int]
    after: HotKeys


def plan_step(rng: random.Random, keys: HotKeys, sizes: StepSizes = StepSizes()) -> Step:
    """One writer commit's changes. A key appears at most once in a step; updates and deletes take
    live keys, re-inserts take keys deleted by an earlier step, inserts take new ids."""
    picked = rng.sample(keys.live, min(len(keys.live), sizes.updates + sizes.deletes))
    deletes = picked[:sizes.deletes]
    updates = picked[sizes.deletes:]
    again = rng.sample(keys.deleted, min(len(keys.deleted), sizes.reinserts))
    new = list(range(keys.next_id, keys.next_id + sizes.inserts))
    changes = [(k, "u") for k in updates] + [(k, "d") for k in deletes] + [(k, "i") for k in [*again, *new]]
    gone = set(deletes)
    back = set(again)
    after = replace(keys, live=tuple(sorted((set(keys.live) - gone) | back | set(new))),
                    deleted=tuple(sorted((set(keys.deleted) - back) | gone)), next_id=keys.next_id + sizes.inserts)
    counts = {"updates": len(updates), "deletes": len(deletes), "reinserts": len(again), "inserts": len(new)}
    return Step(changes, counts, after)


def catch_ups(log_text: str) -> list[dict[str, int]]:
    """The change-feed capture rounds a daemon's log reports (the bootstrap keeps its change window
    with them): round number, source versions captured, change rows (0 when the log says ``?``)."""
    return [{"round": int(m.group(1)), "first_version": int(m.group(2)), "last_version": int(m.group(3)),
             "change_rows": int(m.group(4)) if m.group(4).isdigit() else 0} for m in _CAPTURE.finditer(log_text)]


@dataclass
class WriterLog:
    """What the writer did, by wall-clock time: its commits (version, ``began`` and ``at``: when its
    MERGE began and returned, change counts) and its VACUUMs (start time)."""

    commits: list[dict[str, Any]] = field(default_factory=list)
    vacuums: list[float] = field(default_factory=list)

    @classmethod
    def parse(cls, lines: Iterable[str]) -> "WriterLog":
        """From the writer's ``events.jsonl``: ``{"commit": version, "at": time, <counts>}`` and
        ``{"vacuum": time, "seconds": s}`` lines (a line cut short by a killed writer is skipped)."""
        out = cls()
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "commit" in event:
                out.commits.append({"version": int(event.pop("commit")), **event})
            elif "vacuum" in event:
                out.vacuums.append(float(event["vacuum"]))
        return out


def summarize(writer: WriterLog, *, pinned: int, started: float, ended: float, retain_hours: float) -> dict[str, Any]:
    """The retention run's figures: the bootstrap from ``started`` to ``ended`` (wall-clock times of
    its first and last log lines) at the pinned snapshot version ``pinned``.

    ``vacuum_removed_first_change_by``: the first VACUUM during the bootstrap that began more than the
    retention after the writer's first commit began (its files are no older), i.e. one that may
    delete the change data of version ``pinned + 1`` (None when none did: the bootstrap then did not
    outlive the retention)."""
    retain = retain_hours * 3600.0
    during = [c for c in writer.commits if c["version"] > pinned and c["at"] <= ended]
    first = min((c.get("began", c["at"]) for c in writer.commits if c["version"] > pinned), default=None)
    vacuums = [v for v in writer.vacuums if started <= v <= ended]
    expiring = [v for v in vacuums if first is not None and v - first > retain]
    counts = {op: sum(c.get(op, 0) for c in during) for op in ("updates", "deletes", "reinserts", "inserts")}
    return {"retain_hours": retain_hours, "retain_seconds": round(retain, 1),
            "bootstrap_seconds": round(ended - started, 2),
            "bootstrap_over_retention": round((ended - started) / retain, 2) if retain else None,
            "versions_during_bootstrap": len(during),
            "last_version_during_bootstrap": max((c["version"] for c in during), default=pinned),
            "vacuums_during_bootstrap": len(vacuums),
            "vacuum_removed_first_change_by": round(expiring[0] - started, 1) if expiring else None,
            "changes_during_bootstrap": counts}
