"""The in-memory twin of the Delta MERGE executor: applies change rows to a dict.

It follows the same :class:`~lakemirror.sinks.merge.planner.MergePlan` semantics as the Delta
executor and serves as the reference ("oracle") in tests. :class:`MemoryTableReplica` wraps it as
the twin of a table replica (:class:`~lakemirror.sinks.contract.TableReplica`): claim, bootstrap,
prepare and one epoch's batches, for unit tests of the table runner's parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from lakemirror.errors import DestinationConflict, SchemaIncompatible
from lakemirror.sinks.merge.planner import (
    CHANGE_RANK, CHANGE_TYPE, COMMIT_VERSION, DELETE, UPDATE_PRE, MergePlan,
)

if TYPE_CHECKING:
    from lakemirror.sinks.txn import MergeOutcome, TxnId

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


class MemoryBatchSink:
    """One epoch's batches applied to an :class:`InMemoryReplica` (batches are lists of change rows)."""

    def __init__(self, replica: InMemoryReplica, app_ids: set[str]) -> None:
        self.replica = replica
        self.app_ids = app_ids

    def apply(self, batch: Iterable[Row], txn: "TxnId", read: Any = None) -> "MergeOutcome":
        from lakemirror.sinks.txn import BatchStats, MergeOutcome  # txn imports this module's ApplyCounts

        rows = list(batch)
        versions = [int(r[COMMIT_VERSION]) for r in rows]
        stats = BatchStats(len(rows), min(versions, default=None), max(versions, default=None), None)
        replayed = txn.version <= self.replica.txn_versions.get(txn.app_id, -1)
        counts = self.replica.apply(rows, app_id=txn.app_id, batch_id=txn.version)
        self.app_ids.add(txn.app_id)
        return MergeOutcome(stats, counts, replayed=replayed)


class MemoryTableReplica:
    """The in-memory twin of a table replica (:class:`~lakemirror.sinks.contract.TableReplica`).

    ``owner``: the pipeline that created the replica (None: no replica yet). The bootstrap replaces
    the rows and keeps the transaction ids already recorded, as a Delta overwrite keeps its log."""

    #: No Delta log: the twin's transaction ids are held in memory (a bootstrap copies in one piece).
    delta_log = False

    def server_wait(self) -> None:
        return None

    def on_server(self) -> bool:
        return False

    def __init__(self, pipeline_id: str, owner: str | None = None) -> None:
        self.pipeline_id = pipeline_id
        self.owner = owner
        self.replica: InMemoryReplica | None = None
        self.bootstraps: list[tuple[int, int]] = []   # (version, epoch) of each bootstrap
        self.columns: tuple[str, ...] = ()
        self.app_ids: set[str] = set()

    def claim(self, epoch: int) -> None:
        if epoch == 0 and self.owner is not None and self.owner != self.pipeline_id:
            raise DestinationConflict(f"the replica already exists and was not created by pipeline "
                                      f"{self.pipeline_id!r} (it is the replica of pipeline {self.owner!r}); "
                                      f"lakemirror writes only into replicas it created: set destination_catalog "
                                      f"or destination_schema to another one")

    def bootstrap(self, plan: MergePlan, snapshot: Iterable[Row], version: int, epoch: int,
                  source_properties: Mapping[str, str]) -> None:
        txns = self.replica.txn_versions if self.replica is not None else {}
        self.replica = InMemoryReplica(plan)
        self.replica.txn_versions = dict(txns)
        for row in snapshot:
            self.replica.rows[tuple(row[k] for k in plan.keys)] = {c: row.get(c) for c in plan.column_names}
        self.owner, self.columns = self.pipeline_id, tuple(plan.column_names)
        self.bootstraps.append((version, epoch))

    def prepare(self, plan: MergePlan, allow_evolution: bool) -> bool:
        added = tuple(c for c in plan.column_names if c not in self.columns)
        if not added or self.replica is None:
            return False
        if not allow_evolution:
            raise SchemaIncompatible(f"the source has new columns ({', '.join(added)}) and "
                                     f"allow_schema_evolution is false")
        self.columns += added
        self.replica.plan = plan
        return True

    def batch_sink(self, plan: MergePlan, epoch: int) -> MemoryBatchSink:
        if self.replica is None:
            raise RuntimeError("the replica has not been bootstrapped")
        return MemoryBatchSink(self.replica, self.app_ids)
