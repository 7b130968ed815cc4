"""Cycles of ``triggered`` and ``snapshot`` PostgreSQL replicas (:mod:`lakemirror.sinks.postgres.modes`).

A table whose destination mode is not ``continuous`` has no stream. On the destination's schedule
the daemon's sub-task service (:mod:`lakemirror.supervisor.subtasks.service`) runs one *cycle* per table
through the batch runner (:mod:`lakemirror.supervisor.subtasks.batch_runner`: retries, timeout, one audit row per
attempt, status and metrics of a sub-task), with :class:`SparkCycles` as the operations of its
``postgres_triggered`` and ``postgres_snapshot`` jobs, and :class:`PostgresCycle` brings the replica
up to the source's latest version ``head``:

1. key and plan as a stream's preparation makes them (:func:`~lakemirror.sources.keys.choose_key`,
   :func:`~lakemirror.sinks.merge.planner.plan_merge`);
2. the epoch: cycles continue an epoch only if a cycle started it and no stream has run in it
   (no stream checkpoint for it) and the source is the same table; otherwise the cycle starts a
   new epoch with a snapshot, so a cycle's snapshot (which starts fresh tombstones) is never
   followed by a stream replaying older changes of the same epoch;
3. ``reached``: the newest source version the replica's progress rows record for the epoch;
4. the choice (:func:`~lakemirror.sinks.postgres.modes.choose_cycle`, pure): nothing new; an
   incremental cycle, the change rows of versions ``reached + 1 … head`` applied like a stream's
   batch (guarded upsert, tombstones, progress row in one transaction); or a snapshot at ``head``
   swapped in atomically (:meth:`~lakemirror.sinks.postgres.executor.PostgresReplica.refresh`).
   Triggered mode measures the change fraction (change rows / source rows) and compares it with
   ``snapshot_above_fraction``; a source change the replica cannot follow by adding columns, or
   change versions the source no longer holds, take the snapshot too.

Each cycle's progress row has the batch id :func:`~lakemirror.sinks.postgres.modes.cycle_batch_id`
of the version it reaches, so a cycle whose commit is replayed (a crash before the state was
saved) is recognised and skipped. After a cycle the pipeline's state says the epoch's replica holds
``head`` (``bootstrap_version``), so a table switched back to ``continuous`` streams from ``head + 1``
in that epoch, without a new bootstrap.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from lakemirror.checkpoints.state import StateStore, TableProgress
from lakemirror.errors import SchemaIncompatible
from lakemirror.sinks.batch.operations import BatchJob, Operations, TaggedSessions
from lakemirror.sinks.merge.planner import ColumnSelection, MergePlan, plan_merge
from lakemirror.sinks.postgres.modes import CycleChoice, Mode, change_fraction, choose_cycle, cycle_batch_id
from lakemirror.sinks.postgres.protocol import SinkResult
from lakemirror.sinks.postgres.waits import ServerCalls, ServerWait
from lakemirror.sources.catalog import Catalog, TableInfo
from lakemirror.sources.feed_required import require_change_feed
from lakemirror.sources.keys import choose_key

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from lakemirror.sinks.postgres.executor import Connector

log = logging.getLogger(__name__)

#: The batch runner's operation of a cycle, per mode (audit rows, sub-task status).
OPERATIONS: Mapping[str, Mode] = {"postgres_triggered": "triggered", "postgres_snapshot": "snapshot"}


def operation_of(mode: Mode) -> str:
    return next(op for op, m in OPERATIONS.items() if m == mode)


class CycleSource(Protocol):
    """What a cycle reads of its source table (:class:`~lakemirror.sources.delta_versions.DeltaVersions`)."""

    def describe(self) -> TableInfo: ...
    def enable_change_feed(self) -> None: ...
    def latest_version(self) -> int: ...
    def row_count(self, version: int) -> int: ...
    def change_count(self, after: int, through: int) -> int: ...
    def changes(self, after: int, through: int, columns: Sequence[str]) -> "pa.Table": ...
    def snapshot(self, version: int, columns: Sequence[str]) -> "pa.Table": ...


class CycleReplica(Protocol):
    """What a cycle needs of the replica (:class:`~lakemirror.sinks.postgres.executor.PostgresReplica`,
    its twin :class:`~lakemirror.sinks.postgres.protocol.MemoryReplicaSink`)."""

    def prepare(self, allow_evolution: bool) -> Any: ...
    def refresh(self, snapshot: "pa.Table", version: int, epoch: int, batch_id: int) -> int: ...
    def apply(self, changes: "pa.Table", epoch: int, batch_id: int) -> SinkResult: ...
    def last_applied(self, epoch: int) -> int | None: ...


class TableOptions(Protocol):
    """A table's overrides (:class:`lakemirror.supervisor.control.pipeline_spec.TableOptions`): empty ``keys``: infer."""

    @property
    def keys(self) -> tuple[str, ...]: ...
    @property
    def include_columns(self) -> tuple[str, ...]: ...
    @property
    def exclude_columns(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class NoOptions:
    keys: tuple[str, ...] = ()
    include_columns: tuple[str, ...] = ()
    exclude_columns: tuple[str, ...] = ()


class CycleSpec(Protocol):
    """What the cycles read of the pipeline (:class:`lakemirror.supervisor.control.pipeline_spec.PipelineSpec`)."""

    @property
    def pipeline_id(self) -> str: ...
    @property
    def checkpoint_root(self) -> str: ...
    @property
    def allow_schema_evolution(self) -> bool: ...
    @property
    def enable_change_data_feed(self) -> bool: ...
    def source(self, table: str) -> Any: ...
    def options_for(self, table: str) -> TableOptions: ...


@dataclass(frozen=True)
class CycleResult:
    """What one cycle did (the details of its audit row)."""

    mode: Mode
    action: str
    reason: str
    epoch: int
    version: int
    fraction: float | None = None
    rows_loaded: int = 0
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    replayed: bool = False

    def details(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PostgresCycle:
    """One cycle of one table (see the module docstring)."""

    source: CycleSource
    replica_for: Callable[[MergePlan], CycleReplica]
    states: StateStore            # the pipeline's: epoch, bootstrap version (shared with the stream)
    cycle_states: StateStore      # the cycles' own: which epoch a cycle started
    slug: str
    label: str
    mode: Mode
    options: TableOptions = NoOptions()
    snapshot_above: float = 0.10
    allow_evolution: bool = True
    #: Whether a stream checkpoint exists for an epoch of this table (a stream ran in it).
    stream_ran: Callable[[int], bool] = lambda epoch: False
    #: ``enable_change_data_feed``: turn a triggered table's change data feed on instead of refusing it.
    enable_change_feed: bool = False

    def run(self) -> CycleResult:
        # The head first, then the description: a column added before the head is always in the
        # plan, never left out while the versions that fill it are read. One added after the head
        # is in the plan too; a read of it at the head gives NULLs or fails, and a failed cycle is
        # retried with a later head.
        head = self.source.latest_version()
        info = self.source.describe()
        opts = self.options
        key = choose_key(self.label, info.columns, configured=opts.keys, declared=info.declared_key)
        plan = plan_merge(info.columns, key.columns, ColumnSelection(opts.include_columns, opts.exclude_columns))
        if self.mode == "triggered":
            info = require_change_feed(self.source, info, self.label, enable=self.enable_change_feed,
                                       otherwise="; or keep the table in mode snapshot, which reads no change feed")
        replica = self.replica_for(plan)
        progress = self.states.load(self.slug)
        forced = self._new_epoch_reason(progress, info)
        reached = None if forced else self._reached(replica, progress)
        fraction: float | None = None
        if forced is None and reached is not None and head > reached and self.mode == "triggered":
            forced, fraction = self._measure(replica, reached, head)
        choice = choose_cycle(self.mode, head=head, reached=reached, fraction=fraction,
                              snapshot_above=self.snapshot_above, fresh_epoch_reason=forced)
        log.info("%s: %s cycle: %s (%s)", self.label, self.mode, choice.action, choice.reason)
        if choice.action == "nothing":
            assert reached is not None
            return CycleResult(self.mode, "nothing", choice.reason, progress.epoch, reached)
        new_epoch = forced is not None and self._needs_new_epoch(progress, info)
        if new_epoch:
            progress = progress.next_epoch(head, info.table_id)
            self.states.save(self.slug, progress)
        if choice.action == "snapshot":
            result = self._snapshot(replica, plan, progress.epoch, head, choice)
        else:
            assert reached is not None
            result = self._incremental(replica, plan, progress.epoch, reached, head, choice)
        self.states.save(self.slug, replace(progress, bootstrapped=True, bootstrap_version=head,
                                            source_table_id=info.table_id))
        self.cycle_states.save(self.slug, TableProgress(epoch=progress.epoch, bootstrap_version=head,
                                                        bootstrapped=True, source_table_id=info.table_id))
        return result

    # -- the epoch --------------------------------------------------------------------------------

    def _needs_new_epoch(self, progress: TableProgress, info: TableInfo) -> bool:
        own = self.cycle_states.load(self.slug)
        return (own.epoch != progress.epoch or not own.bootstrapped or self.stream_ran(progress.epoch)
                or bool(progress.source_table_id and info.table_id and progress.source_table_id != info.table_id))

    def _new_epoch_reason(self, progress: TableProgress, info: TableInfo) -> str | None:
        own = self.cycle_states.load(self.slug)
        if progress.epoch == 0:
            return "the replica's first cycle: a snapshot"
        if progress.source_table_id and info.table_id and progress.source_table_id != info.table_id:
            return f"the source was dropped and recreated (table id {progress.source_table_id} is now {info.table_id})"
        if own.epoch != progress.epoch or not own.bootstrapped:
            return f"epoch {progress.epoch} was not started by a cycle (the table was streamed): a new epoch"
        if self.stream_ran(progress.epoch):
            return f"a stream ran in epoch {progress.epoch} since the last cycle: a new epoch"
        return None

    def _reached(self, replica: CycleReplica, progress: TableProgress) -> int | None:
        """The newest version the epoch's progress rows record (or the cycles' state, for a cycle
        whose changes were all no-ops and so left no progress row)."""
        recorded = replica.last_applied(progress.epoch)
        own = self.cycle_states.load(self.slug).bootstrap_version
        known = [v for v in (recorded, own) if v is not None]
        return max(known) if recorded is not None and known else None

    def _measure(self, replica: CycleReplica, reached: int, head: int) -> tuple[str | None, float | None]:
        """(a reason to snapshot regardless, or None; the change fraction)."""
        try:
            replica.prepare(self.allow_evolution)
        except SchemaIncompatible as exc:
            return f"the source's schema changed beyond added columns ({exc}): a snapshot rebuilds the replica", None
        try:
            changed = self.source.change_count(reached, head)
        except Exception as exc:  # noqa: BLE001 (versions past retention, a vacuumed feed: copy instead)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            log.warning("%s: cannot read the changes of versions %d-%d (%s); taking a snapshot", self.label,
                        reached + 1, head, first)
            return f"the change feed of versions {reached + 1}-{head} cannot be read ({first})", None
        return None, change_fraction(changed, self.source.row_count(head))

    # -- the two actions ------------------------------------------------------------------------

    def _snapshot(self, replica: CycleReplica, plan: MergePlan, epoch: int, head: int,
                  choice: CycleChoice) -> CycleResult:
        snapshot = self.source.snapshot(head, [c.name for c in plan.columns])
        loaded = replica.refresh(snapshot, head, epoch, cycle_batch_id(head))
        return CycleResult(self.mode, "snapshot", choice.reason, epoch, head, choice.fraction, rows_loaded=loaded,
                           replayed=loaded == 0 and snapshot.num_rows > 0)

    def _incremental(self, replica: CycleReplica, plan: MergePlan, epoch: int, reached: int, head: int,
                     choice: CycleChoice) -> CycleResult:
        changes = self.source.changes(reached, head, [c.name for c in plan.columns])
        result = replica.apply(changes, epoch, cycle_batch_id(head))
        c = result.counts
        return CycleResult(self.mode, "incremental", choice.reason, epoch, head, choice.fraction,
                           rows_inserted=c.inserted, rows_updated=c.updated, rows_deleted=c.deleted,
                           replayed=result.replayed)


def stream_checkpoint_exists(checkpoint_root: str, pipeline_id: str, slug: str) -> Callable[[int], bool]:
    """Whether the table's stream checkpoint of an epoch exists (``checkpoint_volume`` is local)."""
    from lakemirror.checkpoints.layout import stream_checkpoint

    def ran(epoch: int) -> bool:
        path = stream_checkpoint(checkpoint_root, pipeline_id, slug, epoch)
        return os.path.isdir(path[len("file:"):] if path.startswith("file:") else path)
    return ran


class WithPostgresCycles:
    """Cycle operations (:data:`OPERATIONS`) go to ``cycles``, every other operation to ``base``."""

    def __init__(self, base: Operations, cycles: Operations) -> None:
        self.base = base
        self.cycles = cycles

    def run(self, operation: str, job: BatchJob, tag: str) -> Mapping[str, Any]:
        return (self.cycles if operation in OPERATIONS else self.base).run(operation, job, tag)

    def cancel(self, tag: str) -> None:
        self.base.cancel(tag)
        self.cycles.cancel(tag)


class SparkCycles:
    """The batch runner's ``postgres_triggered`` / ``postgres_snapshot`` operations (an
    :class:`~lakemirror.sinks.batch.operations.Operations`): one cycle of the job's table, on Spark and
    the pipeline's Postgres connections. Each attempt reads in a Spark session of its own, tagged
    with the attempt, so :meth:`cancel` (a timed-out attempt) interrupts its Spark jobs."""

    def __init__(self, spark: "SparkSession", catalog: Catalog, connector: "Connector", spec: CycleSpec,
                 states: StateStore, cycle_states: StateStore, snapshot_above: float) -> None:
        self.spark = spark
        self.catalog = catalog
        self.connector = connector
        self.spec = spec
        self.states = states
        self.cycle_states = cycle_states
        self.snapshot_above = snapshot_above
        self.sessions = TaggedSessions(spark)
        #: Each table's call to the server in flight, for its waits in ``/status`` (:meth:`wait_of`).
        self._calls: dict[str, ServerCalls] = {}
        self._calls_lock = threading.Lock()

    def calls_of(self, table: str, label: str) -> ServerCalls:
        with self._calls_lock:
            if table not in self._calls:
                target = self.connector.target
                self._calls[table] = ServerCalls(label, retry_seconds=target.retry_seconds,
                                                 statement_timeout_seconds=target.statement_timeout_seconds)
            return self._calls[table]

    def wait_of(self, table: str) -> ServerWait | None:
        """What the table's cycle waits on in the server now (an outage, a lock), or None."""
        with self._calls_lock:
            calls = self._calls.get(table)
        return calls.wait(self.connector.lock_wait) if calls is not None else None

    def cycle(self, job: BatchJob, mode: Mode, session: "SparkSession") -> PostgresCycle:
        from lakemirror.sinks.postgres.spark_batches import PostgresTable
        from lakemirror.sources.delta_versions import DeltaVersions

        spec, table, label = self.spec, job.source.table, str(job.source)
        slug = spec.source(table).slug
        pg = PostgresTable(self.connector, spec.pipeline_id, table, label, calls=self.calls_of(table, label))
        return PostgresCycle(DeltaVersions(session, self.catalog, job.source), pg.replica, self.states,
                             self.cycle_states, slug, label, mode, spec.options_for(table), self.snapshot_above,
                             spec.allow_schema_evolution,
                             stream_checkpoint_exists(spec.checkpoint_root, spec.pipeline_id, slug),
                             spec.enable_change_data_feed)

    def around(self, base: Operations) -> Operations:
        """``base`` with the cycle operations run here."""
        return WithPostgresCycles(base, self)

    def run(self, operation: str, job: BatchJob, tag: str) -> Mapping[str, Any]:
        mode = OPERATIONS.get(operation)
        if mode is None:
            raise ValueError(f"not a Postgres cycle operation: {operation}")
        with self.sessions.session(tag) as session:
            return self.cycle(job, mode, session).run().details()

    def cancel(self, tag: str) -> None:
        self.sessions.cancel(tag)
