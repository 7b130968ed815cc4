"""The in-memory twin of the Delta MERGE executor: applies change rows to a dict.

It follows the same :class:`~lakemirror.sinks.planner.MergePlan` semantics as the Delta
executor and serves as the reference ("oracle") in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from lakemirror.sinks.planner import (
    CHANGE_RANK, CHANGE_TYPE, COMMIT_VERSION, DELETE, UPDATE_PRE, MergePlan,
)

Row = Mapping[str, Any]
Key = tuple[Any, ...]


@dataclass(frozen=True)
class ApplyCounts:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0

    @property
    def total(self) -> int:
        return self.inserted + self.updated + self.deleted


def latest_per_key(plan: MergePlan, changes: Iterable[Row]) -> dict[Key, Row]:
    """The winning change per key, by (commit version, change rank)."""
    winners: dict[Key, tuple[tuple[int, int], Row]] = {}
    for row in changes:
        op = row[CHANGE_TYPE]
        if op == UPDATE_PRE:
            continue
        if op not in CHANGE_RANK:
            raise ValueError(f"unknown change type {op!r}")
        key = tuple(row[k] for k in plan.keys)
        order = (int(row[COMMIT_VERSION]), CHANGE_RANK[op])
        best = winners.get(key)
        if best is None or order >= best[0]:
            winners[key] = (order, row)
    return {k: v[1] for k, v in winners.items()}


class InMemoryReplica:
    """A replica table held in a dict keyed by the plan's key columns."""

    def __init__(self, plan: MergePlan) -> None:
        self.plan = plan
        self.rows: dict[Key, dict[str, Any]] = {}
        self.txn_versions: dict[str, int] = {}

    def apply(self, changes: Iterable[Row], *, app_id: str | None = None,
              batch_id: int | None = None) -> ApplyCounts:
        """Apply one batch; like Delta, a batch id <= the last recorded for app_id is skipped."""
        if app_id is not None and batch_id is not None:
            if batch_id <= self.txn_versions.get(app_id, -1):
                return ApplyCounts()
        latest = latest_per_key(self.plan, changes)  # validates the whole batch before any write
        ins = upd = dele = 0
        for key, row in latest.items():
            exists = key in self.rows
            if row[CHANGE_TYPE] == DELETE:
                if exists:
                    del self.rows[key]
                    dele += 1
            else:
                self.rows[key] = {c: row.get(c) for c in self.plan.column_names}
                if exists:
                    upd += 1
                else:
                    ins += 1
        if app_id is not None and batch_id is not None:
            self.txn_versions[app_id] = batch_id  # like Delta: recorded with the commit, never before
        return ApplyCounts(ins, upd, dele)
