"""The interface of a replica that takes change batches on the driver, and its in-memory twin.

:class:`ReplicaSink` is what the runner needs from a replica target that is not a Delta table
(the Delta replica takes Spark DataFrames: :mod:`lakemirror.sinks.merge.delta_merge`): make sure it can
follow the source's columns, load a bootstrap snapshot, apply one micro-batch exactly once, and
say how far it has applied. :class:`PostgresReplica` (:mod:`.executor`) implements it against a
real server; :class:`MemoryReplicaSink` implements the same semantics on dicts, for unit tests:
the same plan (:func:`.plan.plan_batch`), the same sequence guard, tombstones and progress rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from lakemirror.errors import SchemaIncompatible
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.planner import DELETE
from lakemirror.sinks.postgres.plan import (DeadRow, ReplicaTable, StagedRow, diff_replica, plan_batch,
                                            snapshot_position, snapshot_rows)
from lakemirror.sinks.postgres.types import is_json, json_text
from lakemirror.sinks.txn import BatchStats

if TYPE_CHECKING:
    import pyarrow as pa

Key = tuple[Any, ...]


@dataclass(frozen=True)
class SinkResult:
    """What applying one batch did. ``replayed``: the batch had been committed before; nothing changed."""

    stats: BatchStats
    counts: ApplyCounts
    replayed: bool
    dead: int = 0


class ReplicaSink(Protocol):
    """A replica that applies change batches (Arrow tables of change-feed rows) exactly once.

    Lifecycle: :meth:`prepare` when the table starts (and after every restart); :meth:`bootstrap`
    once per epoch, before the epoch's first batch; then :meth:`apply` for each micro-batch, in
    batch order, possibly again for a batch after a crash (a replay, which must change nothing).
    """

    table: ReplicaTable

    def prepare(self, allow_evolution: bool) -> None:
        """Check the replica can be reached and follows the source's columns; add new ones
        (``allow_evolution``) or raise :class:`SchemaIncompatible` saying what to do."""

    def bootstrap(self, snapshot: "pa.Table", version: int, epoch: int) -> None:
        """Replace the replica with ``snapshot`` (the source at ``version``), in one transaction."""

    def refresh(self, snapshot: "pa.Table", version: int, epoch: int, batch_id: int) -> int:
        """Replace the replica with ``snapshot`` atomically, recorded as ``batch_id`` of ``epoch``
        (a refresh already committed is skipped, answering 0); the rows loaded."""

    def apply(self, changes: "pa.Table", epoch: int, batch_id: int) -> SinkResult:
        """Apply one micro-batch; a batch id already applied in ``epoch`` is recognised and skipped."""

    def last_applied(self, epoch: int) -> int | None:
        """The newest source version applied in ``epoch`` (the bootstrap's version before any batch)."""


def staged_row_json(table: ReplicaTable, row: StagedRow) -> str:
    """A staged row as the JSON a dead letter keeps (jsonb columns as their JSON, not a string)."""
    out: dict[str, Any] = {}
    for c, v in zip(table.columns, row.values):
        out[c.name] = json.loads(v) if is_json(c.type) and isinstance(v, str) else v
    return json_text(out)


@dataclass
class MemoryReplicaSink:
    """The in-memory twin of :class:`~lakemirror.sinks.postgres.executor.PostgresReplica`.

    ``reject``: a stand-in for the server's constraints: returns why a row (as a dict) would be
    refused, or None. ``now``: the clock that dates tombstones, for the purge horizon."""

    table: ReplicaTable
    reject: Callable[[dict[str, Any]], str | None] = lambda row: None
    tombstone_horizon_seconds: float = 7 * 86400.0
    now: Callable[[], float] = lambda: 0.0
    rows: dict[Key, tuple[dict[str, Any], int]] = field(default_factory=dict)
    tombstones: dict[Key, tuple[int, float]] = field(default_factory=dict)
    progress: dict[tuple[int, int], tuple[int | None, ApplyCounts]] = field(default_factory=dict)
    dead_letters: list[tuple[int, int, DeadRow]] = field(default_factory=list)
    replica_columns: list[tuple[str, str]] = field(default_factory=list)

    def prepare(self, allow_evolution: bool) -> None:
        if not self.replica_columns:
            return
        diff = diff_replica(self.table, self.replica_columns)
        if diff.is_empty:
            return
        if not diff.is_additive or not allow_evolution:
            raise SchemaIncompatible(f"{self.table.name}: cannot follow the source ({diff.describe()})")
        self.replica_columns += [(c.name, pg) for c in diff.added for n, pg in self.table.pg_columns if n == c.name]

    def bootstrap(self, snapshot: "pa.Table", version: int, epoch: int) -> None:
        self.refresh(snapshot, version, epoch, -1)

    def refresh(self, snapshot: "pa.Table", version: int, epoch: int, batch_id: int) -> int:
        if (epoch, batch_id) in self.progress:
            return 0
        rows, dead = snapshot_rows(snapshot, self.table, version)
        self.rows = {}
        for values in rows:
            row = dict(zip(self.table.column_names, values[:-1]))
            self.rows[self.table.key_of(row)] = (row, snapshot_position(version))
        self.tombstones = {}
        self.replica_columns = list(self.table.pg_columns)
        self.progress[(epoch, batch_id)] = (version, ApplyCounts(len(rows), 0, 0))
        self.dead_letters += [(epoch, batch_id, d) for d in dead]
        return len(rows)

    def apply(self, changes: "pa.Table", epoch: int, batch_id: int) -> SinkResult:
        plan = plan_batch(changes, self.table)
        if plan.stats.rows_read == 0:
            return SinkResult(plan.stats, ApplyCounts(), replayed=False)
        if (epoch, batch_id) in self.progress:
            return SinkResult(plan.stats, self.progress[(epoch, batch_id)][1], replayed=True)
        ins = upd = dele = 0
        dead = list(plan.dead)
        for staged in plan.rows:
            row = dict(zip(self.table.column_names, staged.values))
            key, pos = self.table.key_of(row), staged.position
            if staged.op == DELETE:
                current = self.rows.get(key)
                if current is not None and current[1] < pos:
                    del self.rows[key]
                    dele += 1
                tomb = self.tombstones.get(key)
                if tomb is None or tomb[0] < pos:
                    self.tombstones[key] = (pos, self.now())
                continue
            tomb = self.tombstones.get(key)
            if tomb is not None and tomb[0] >= pos:
                continue
            current = self.rows.get(key)
            if current is not None and current[1] >= pos:
                continue
            why = self.reject(row)
            if why is not None:
                dead.append(DeadRow(pos // 2, staged.op, why, staged_row_json(self.table, staged)))
                continue
            self.rows[key] = (row, pos)
            if current is None:
                ins += 1
            else:
                upd += 1
            if tomb is not None:
                del self.tombstones[key]
        horizon = self.now() - self.tombstone_horizon_seconds
        self.tombstones = {k: v for k, v in self.tombstones.items() if v[1] >= horizon}
        counts = ApplyCounts(ins, upd, dele)
        self.progress[(epoch, batch_id)] = (plan.last_version, counts)
        self.dead_letters += [(epoch, batch_id, d) for d in dead]
        return SinkResult(plan.stats, counts, replayed=False, dead=len(dead))

    def last_applied(self, epoch: int) -> int | None:
        versions = [v for (e, _), (v, _) in self.progress.items() if e == epoch and v is not None]
        return max(versions) if versions else None

    def snapshot(self) -> dict[Key, dict[str, Any]]:
        """The replica's rows by key (what a reader of the table sees)."""
        return {k: dict(v[0]) for k, v in self.rows.items()}
