"""The per-table runner: prepares a table (key, plan, bootstrap) and runs its streaming query.

One runner per table, each with its own Spark session (``newSession``), so Delta's session-wide
transaction confs never race between tables. ``launch`` works in a background thread (a bootstrap
may take long and must not hold up other tables); everything the supervisor needs to know comes
back through :meth:`poll` as state-machine events and :class:`BatchReport` values.

The table's query runs one of three ways: always on, with a processing-time trigger
(``apply_workers: 0``), or in turns (:mod:`lakemirror.supervisor.turns`), where the turn pool calls
:meth:`TableRunner.take_turn`. With a session of its own JVM (local Spark, a Databricks job) the
query stays up and each batch waits for its turn inside the batch function
(:mod:`lakemirror.supervisor.turn_gate`); through Spark Connect, whose batch functions run on the
server, a turn starts the query with a ``once`` or ``availableNow`` trigger and waits for its end.
All apply batches through the same :meth:`TableRunner._apply_batch`, with the same transaction ids.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from lakemirror.checkpoints import stream_dir
from lakemirror.checkpoints.bootstrap_state import BootstrapStore, bootstrap_store_for
from lakemirror.checkpoints.records import CheckpointRow, CheckpointStore
from lakemirror.checkpoints.state import StateStore, TableProgress
from lakemirror.errors import (
    DestinationConflict, LakemirrorError, SchemaIncompatible, SourceReplaced,
)
from lakemirror.sinks import snapshot_copy
from lakemirror.sinks.apply_choice import ApplyChoice, choose_apply
from lakemirror.sinks.delta_merge import DeltaMergeSink, MergeOutcome, TxnId, txn_app_id
from lakemirror.sinks.driver_apply import ChangeReader
from lakemirror.sinks.planner import ColumnSelection, MergePlan, diff_schema, plan_merge
from lakemirror.sinks.postgres.spark_batches import PostgresTable
from lakemirror.sources import change_feed
from lakemirror.sources.catalog import Catalog, table_id
from lakemirror.sources.change_feed import SourceHead
from lakemirror.sources.commit_log import CommitLog, commit_log_for, probe_head
from lakemirror.sources.keys import KeyChoice, choose_key
from lakemirror.supervisor import state as sm
from lakemirror.supervisor import replica_record, turns
from lakemirror.supervisor.batch_feed import BatchFeed
from lakemirror.supervisor.bootstrap_policy import BootstrapProgress
from lakemirror.supervisor.chunked_bootstrap import BootstrapInterrupted, BootstrapJob, ChunkedBootstrap
from lakemirror.supervisor.classify import classify
from lakemirror.supervisor.failure import failed_event
from lakemirror.supervisor.connect_batches import ConnectBatches, batch_job, server_batch_cause
from lakemirror.supervisor.lag import LagReading, compute_lag
from lakemirror.supervisor.offsets import applied_through_from_offset
from lakemirror.supervisor.retention import RetentionWindow, headroom_seconds
from lakemirror.supervisor.spec import PipelineSpec
from lakemirror.supervisor.turn_gate import TurnGate
from lakemirror.tables import has_own_jvm, own_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lakemirror.sinks.postgres.executor import Connector
    from lakemirror.tables import TableLocation

log = logging.getLogger(__name__)


#: How often a turn's worker looks at the query while it waits for the turn's batch to begin.
GATE_POLL_SECONDS = 0.02
#: How long a turn waits for its batch to begin once Spark has committed the batch before it, when
#: the source may have new commits: Spark lists the source and plans the batch meanwhile. A turn
#: withdrawn too early loses nothing: the batch then waits for the table's next turn.
GATE_SETTLE_SECONDS = 1.0


class Drained(Exception):
    """Raised inside a batch that begins after a drain was requested: nothing was applied."""


@dataclass(frozen=True)
class BatchReport:
    table: str
    batch_id: int
    outcome: MergeOutcome
    duration_seconds: float
    ended_at: float


@dataclass(frozen=True)
class Prepared:
    key: KeyChoice
    plan: MergePlan
    progress: TableProgress
    retention: RetentionWindow = RetentionWindow()


@dataclass
class RunnerContext:
    """Shared dependencies of every runner; built once by the composition root."""

    spark: "SparkSession"
    catalog: Catalog
    states: StateStore
    checkpoints: CheckpointStore
    spec: PipelineSpec
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    #: Crash-test hook: called at named points of a batch's life (see FAULT_POINTS); a no-op
    #: unless the torture harness arms it to kill the process there.
    fault: Callable[[str], None] = lambda point: None
    #: Bootstrap chunks copied at once over all tables (``bootstrap.parallel_chunks``), and where a
    #: chunked bootstrap keeps its plan (default: beside ``states``); both made from the spec if None.
    bootstrap_slots: threading.Semaphore | None = None
    bootstraps: BootstrapStore | None = None

    #: The Postgres server the replicas go to (``destination.kind: postgres``); None: Delta replicas.
    postgres: "Connector | None" = None

    def __post_init__(self) -> None:
        if self.bootstrap_slots is None:
            self.bootstrap_slots = threading.BoundedSemaphore(max(1, self.spec.bootstrap.parallel_chunks))
        if self.bootstraps is None:
            self.bootstraps = bootstrap_store_for(self.states)


#: Where the torture harness may kill the daemon (tests/torture): each is a moment at which a
#: crash must lose nothing and apply nothing twice.
FAULT_POINTS = (
    "bootstrap_before_snapshot",   # the new epoch is saved, the snapshot not yet written
    "bootstrap_inside_chunk",      # a chunk's rows are read, its commit not yet written
    "bootstrap_between_chunks",    # a chunk is committed, the next not yet begun
    "bootstrap_after_catch_up",    # a catch-up's MERGE is committed, its touched keys are not
    "bootstrap_after_snapshot",    # the snapshot is committed, the state does not say so yet
    "schema_change",               # the replica gained columns, the stream not restarted yet
    "before_merge",                # a micro-batch is planned (offsets logged), nothing written
    "after_merge",                 # the MERGE is committed, its checkpoint row is not
    "before_commit_log",           # the checkpoint row is written, Spark's commit log is not
)


class TableRunner:
    def __init__(self, table: str, ctx: RunnerContext) -> None:
        self.table = table
        self.ctx = ctx
        self.source = ctx.spec.source(table)
        self.destination = ctx.spec.destination(table)
        self.slug = self.source.slug
        #: The table's Postgres replica, when the pipeline writes to Postgres (sinks/choose.py).
        self.pg = (PostgresTable(ctx.postgres, ctx.spec.pipeline_id, table, str(self.source))
                   if ctx.postgres is not None else None)
        self._events: list[sm.Event | BatchReport | BootstrapProgress] = []
        self._healthy_query: "StreamingQuery | None" = None
        self._lock = threading.Lock()
        self._batch_lock = threading.Lock()
        self._turn_lock = threading.Lock()
        self.last_trigger: str | None = None  # how its latest turn ran: gated, once or availableNow
        #: The driver path's delta-rs read of this launch's batches (None: Spark reads every batch).
        self.batch_feed: BatchFeed | None = None
        #: Turns: starts the table's query (True: a ``once`` trigger); set while ready for a turn.
        self._turn_query: Callable[[bool], "StreamingQuery"] | None = None
        self._turn_proven = False
        self._gate: TurnGate | None = None  # turns taken inside an always-on query's batch function
        self._draining = False
        self._query: StreamingQuery | None = None
        #: Spark Connect: the batches the server-side batch function recorded (None: a local session).
        self._connect: ConnectBatches | None = None
        self._connect_progress_id: int | None = None
        #: The session the table's query is started in: :attr:`session`, or one of the query's own
        #: (``kernel_change_feed``: :func:`lakemirror.sources.change_feed.kernel_stream`).
        self.stream_session: SparkSession | None = None
        self._thread: threading.Thread | None = None
        self._session: SparkSession | None = None
        self._batch_error: LakemirrorError | None = None
        self._resync_reason: str | None = None
        self._resynced_from_table_id: str | None = None
        self._headroom_low = False
        self._commit_log: CommitLog | None = None  # None: not opened yet, or unavailable
        self._commit_log_opened = False
        self._commit_times: dict[int, float] = {}
        self._known_latest: int | None = None
        self.prepared: Prepared | None = None
        self.applied_through: int | None = None
        #: The last batch of the epoch the replica's own log records at launch: a replay of it or
        #: an earlier batch is skipped unread (:mod:`lakemirror.supervisor.replica_record`).
        self._recorded_txn: int | None = None
        self.last_batch_at: float | None = None
        self.last_lag: LagReading | None = None
        #: The running bootstrap's progress (None when the table is not bootstrapping).
        self.bootstrap_progress: BootstrapProgress | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def session(self) -> "SparkSession":
        if self._session is None:
            self._session = own_session(self.ctx.spark)
        return self._session

    @property
    def query_running(self) -> bool:
        """Whether the table's always-on query is up (observability and tests)."""
        query = self._query
        return query is not None and bool(query.isActive)

    def launch(self) -> None:
        """Prepare and start the stream in the background; outcome arrives through ``poll``."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._draining = False
        self._batch_error = None
        self._turn_query, self._turn_proven, self._gate = None, False, None
        self._thread = threading.Thread(target=self._launch, name=f"launch:{self.table}", daemon=True)
        self._thread.start()

    def halt(self, timeout: float = 60.0) -> None:
        """Stop the stream after the batch in flight (if any) has finished."""
        deadline = time.monotonic() + timeout
        self._draining = True
        self._turn_query = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._gate is not None:
            # After the launch has ended, so a query it was starting is covered too: a query
            # held in its batch function could not be stopped.
            self._gate.open()
        query = self._query
        if query is not None:
            # Wait for the batch in flight, then stop. The lock is not held across stop(): a batch
            # that begins meanwhile must reach its Drained check, not block on the lock while
            # stop() waits for the very thread that runs it (that deadlocked a drain).
            if self._batch_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self._batch_lock.release()
            try:
                query.stop()
            except Exception as exc:  # a query that already died cannot be stopped: nothing to do
                log.debug("stopping %s: %s", self.table, exc)
            finally:
                self._query = None
        # A turn that started before the drain ends by itself: its next batch is refused (Drained).
        if self._turn_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._turn_lock.release()

    def persisted_pause(self) -> bool:
        return self.ctx.states.load(self.slug).paused

    def pause_persisted(self, paused: bool) -> None:
        progress = self.ctx.states.load(self.slug)
        self.ctx.states.save(self.slug, replace(progress, paused=paused))

    # -- events ---------------------------------------------------------------------------------

    def _emit(self, item: "sm.Event | BatchReport | BootstrapProgress") -> None:
        with self._lock:
            self._events.append(item)

    def poll(self) -> list["sm.Event | BatchReport | BootstrapProgress"]:
        """Events since the last poll, plus a failure event if the query died."""
        # Started-per-turn queries report their own end; always-on ones (gated or not) end only by failing.
        query = self._query if self.ctx.spec.apply_workers == 0 or self._gate is not None else None
        if query is not None and not query.isActive and not self._draining:
            self._query = None
            exc = query.exception()
            error = self._batch_error or classify(server_batch_cause(exc or RuntimeError("the stream stopped")),
                                                  table=str(self.source))
            self._emit(self._failed(error))
        elif query is not None and (self._gate is None or not self._turn_proven):
            self._track_progress(query)
            self._collect_connect_batches(query)
        with self._lock:
            out, self._events = self._events, []
        return out

    def _failed(self, error: LakemirrorError) -> sm.Failed:
        spec = self.ctx.spec
        return failed_event(error, table=self.table, allow_schema_evolution=spec.allow_schema_evolution,
                            change_window_policy=spec.change_window_policy, rand=random.random())

    def source_exists(self) -> bool:
        """Whether the source table exists now (the discovery loop's check of a missing table)."""
        return bool(snapshot_copy.tables.exists(self.session, self.ctx.catalog.locate(self.source)))

    def resync(self, reason: str) -> None:
        """Forget the replica's progress so the next launch bootstraps a new epoch.

        Persisted at once (a crash before the bootstrap still resyncs); the old checkpoint and
        transaction ids belong to the old epoch and are never reused."""
        progress = self.ctx.states.load(self.slug)
        self.ctx.states.save(self.slug, replace(progress, bootstrapped=False, bootstrap_version=None,
                                                source_table_id=None))
        self.applied_through = None
        self.last_lag = None
        self.prepared = None
        self._commit_log, self._commit_times, self._known_latest = None, {}, None
        self._commit_log_opened = False
        self._recorded_txn = None
        self._resync_reason = reason
        self._resynced_from_table_id = progress.source_table_id
        log.warning("table %s: resync (%s)", self.source, reason)

    def _track_progress(self, query: "StreamingQuery") -> None:
        progress = query.lastProgress
        if not progress:
            return
        if query is not self._healthy_query and self._turn_query is None:
            # A completed trigger of this always-on query (even one with no data) proves it healthy.
            self._healthy_query = query
            self._turn_proven = True
            self._emit(sm.BatchApplied())
        try:
            payload = json.loads(progress.json) if hasattr(progress, "json") else progress
            through = applied_through_from_offset(payload["sources"][0].get("endOffset"))
        except (KeyError, IndexError, TypeError, ValueError):
            return
        if through is not None and (self.applied_through is None or through > self.applied_through):
            self.applied_through = through

    # -- lag ------------------------------------------------------------------------------------

    def probe_lag(self, now: float) -> LagReading | None:
        # One reading of the applied version for the whole probe: batches advance it on the
        # stream's thread meanwhile, and commit times read for one version cannot price another
        # (that mix once reported a 0 s change window and a lag off by whole batches).
        through, prepared = self.applied_through, self.prepared
        if through is None:
            return None
        loc = self.ctx.catalog.locate(self.source)
        # Read only as many of the newest commits as the table was behind at the last probe (plus
        # two): a caught-up table reads 2 commit files per probe instead of 32.
        window = 32 if self.last_lag is None else min(32, self.last_lag.versions_behind + 2)
        head = (self._head_from_commit_files(loc, through)
                or change_feed.source_head(self.session, loc, through, window=window))
        self._known_latest = head.latest_version
        times = dict(head.commit_times)
        headroom = None if prepared is None else headroom_seconds(
            applied_through=through, latest_version=head.latest_version, commit_times=times,
            window=prepared.retention, now=now)
        needed = through + 1
        if head.latest_version >= needed and needed not in times:
            # The needed commit is gone from the log: lag is at least the oldest commit still there.
            times[needed] = min(t for v, t in times.items() if v > through)
        reading = compute_lag(applied_through=through, latest_version=head.latest_version,
                              commit_times=times, now=now)
        self.last_lag = replace(reading, retention_headroom_seconds=headroom)
        if headroom is not None:
            self._warn_on_headroom(headroom)
        return self.last_lag

    def _head_from_commit_files(self, loc: TableLocation, through: int) -> SourceHead | None:
        """The head read from the source's commit files (no Spark job), or None: use history."""
        log = self._commit_files(loc)
        if log is None:
            return None
        return probe_head(log.commit_time, applied_through=through,
                          known_latest=self._known_latest, cache=self._commit_times)

    def _commit_files(self, loc: TableLocation) -> CommitLog | None:
        """The source's commit files, opened once; None where they cannot be read directly."""
        if not self._commit_log_opened:
            self._commit_log, self._commit_log_opened = commit_log_for(self.session, loc), True
        return self._commit_log

    def _warn_on_headroom(self, headroom: float) -> None:
        low = headroom < self.ctx.spec.retention_warning_seconds
        if low and not self._headroom_low:
            log.warning("table %s: the change window closes in %.0fs: source versions the replica still needs "
                        "may be vacuumed or log-cleaned (raise delta.deletedFileRetentionDuration / "
                        "delta.logRetentionDuration on the source, or let the table catch up)",
                        self.source, headroom)
        self._headroom_low = low

    # -- preparation and bootstrap --------------------------------------------------------------

    def _adopt_record(self) -> None:
        """Take the applied version from the replica's own record before anything else: a table
        that fails to start reports what its replica holds, not its epoch's bootstrap version."""
        spec = self.ctx.spec
        try:
            record = replica_record.read_record(
                self.ctx.states.load(self.slug), checkpoint_root=spec.checkpoint_root, pipeline_id=spec.pipeline_id,
                table_slug=self.slug, replica_path=self.ctx.catalog.locate(self.destination).path,
                source_path=self.ctx.catalog.locate(self.source).path)
        except Exception as exc:  # noqa: BLE001 (the stream's own progress remains)
            log.info("table %s: cannot read the replica's transaction record: %s", self.source, exc)
            record = None
        self._recorded_txn = record.txn_version if record is not None else None
        if record is not None and record.applied_through is not None:
            self.applied_through = max(self.applied_through or -1, record.applied_through)

    def _launch(self) -> None:
        try:
            self._adopt_record()
            prepared = self.prepare()
            if self._draining:
                return
            self.prepared = prepared
            if self._resync_reason is not None:
                self._record_event(f"resync: {self._resync_reason}{self._replacement_note(prepared.progress)}",
                                   prepared.progress, degraded=False)
                self._resync_reason = None
            self.applied_through = (prepared.progress.bootstrap_version
                                    if self.applied_through is None else self.applied_through)
            self._start_stream(prepared)
            self._emit(sm.StreamStarted())
        except BootstrapInterrupted as exc:  # a drain stopped the bootstrap between chunks: not a failure
            log.info("table %s: %s", self.source, exc)
        except Exception as exc:  # every failure becomes a visible state, never a dead thread
            log.warning("table %s failed to start: %s", self.source, exc)
            error = classify(exc, table=str(self.source))
            self._record_event(str(error), self.ctx.states.load(self.slug), degraded=True)
            self._emit(self._failed(error))

    def _replacement_note(self, progress: TableProgress) -> str:
        """Name a replaced source in the resync record, whichever error first noticed it: the
        stream's reader can fail on the vanished log of the old table (reported as an expired
        window) before any batch sees the new table id."""
        before, after = self._resynced_from_table_id, progress.source_table_id
        if before and after and before != after:
            return f" The source was dropped and recreated (table id {before} is now {after})."
        return ""

    def prepare(self) -> Prepared:
        spark, spec = self.session, self.ctx.spec
        info = self.ctx.catalog.describe(spark, self.source)
        opts = spec.options_for(self.table)
        key = choose_key(str(self.source), info.columns, configured=opts.keys, declared=info.declared_key)
        plan = plan_merge(info.columns, key.columns,
                          ColumnSelection(opts.include_columns, opts.exclude_columns))
        if not info.cdf_enabled:
            raise LakemirrorError(
                f"{self.source}: Change Data Feed is not enabled. Run: ALTER TABLE {info.location.sql} "
                f"SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')", table=str(self.source),
                code="cdf_disabled")
        progress = self.ctx.states.load(self.slug)
        if progress.source_table_id and info.table_id and progress.source_table_id != info.table_id:
            raise SourceReplaced(
                f"{self.source}: the source was dropped and recreated (table id {progress.source_table_id} "
                f"is now {info.table_id}); the replica no longer follows it. Resync the table.",
                table=str(self.source))
        if not progress.bootstrapped:
            progress = self._bootstrap(progress, info.table_id, plan, info.properties)
        self._evolve_replica(plan)
        log.info("table %s: key %s", self.source, key.describe())
        return Prepared(key, plan, progress, RetentionWindow.from_properties(info.properties))

    def _bootstrap(self, progress: TableProgress, table_id: str | None, plan: MergePlan,
                   source_properties: dict[str, str]) -> TableProgress:
        spark = self.session
        src = self.ctx.catalog.locate(self.source)
        dst = self.ctx.catalog.locate(self.destination)
        if self.pg is None and progress.epoch == 0 and snapshot_copy.tables.exists(spark, dst):
            owner = snapshot_copy.replica_properties(spark, dst).get(snapshot_copy.PIPELINE_PROPERTY)
            if owner != self.ctx.spec.pipeline_id:
                raise DestinationConflict(
                    f"{self.destination} already exists and was not created by pipeline "
                    f"{self.ctx.spec.pipeline_id!r}; drop it or choose another destination", table=str(self.source))
        self._emit(sm.BootstrapStarted())
        if progress.bootstrap_version is None or progress.epoch == 0:
            head = change_feed.source_head(spark, src, since_version=1 << 62, window=1)
            progress = progress.next_epoch(head.latest_version, table_id)
            self.ctx.states.save(self.slug, progress)
        version = progress.bootstrap_version
        assert version is not None
        self.ctx.fault("bootstrap_before_snapshot")
        through, chunked = version, None
        if self.pg is not None:
            self.pg.bootstrap(plan, change_feed.snapshot(spark, src, version), version, progress.epoch)
        else:
            self.ctx.catalog.ensure_schema(spark, self.destination.catalog, self.destination.schema)
            log.info("table %s: bootstrapping %s from source version %d (epoch %d)",
                     self.source, self.destination, version, progress.epoch)
            spec = self.ctx.spec
            job = BootstrapJob(spark, str(self.source), self.slug, src, dst, plan, progress.epoch, version,
                               txn_app_id(spec.pipeline_id, self.slug, progress.epoch),
                               f"{spec.checkpoint_root.rstrip('/')}/{spec.pipeline_id}/{self.slug}/e{progress.epoch}-touched",
                               source_properties)
            assert self.ctx.bootstraps is not None and self.ctx.bootstrap_slots is not None
            chunked = ChunkedBootstrap(job, policy=spec.bootstrap, store=self.ctx.bootstraps,
                                       slots=self.ctx.bootstrap_slots, clock=self.ctx.clock, fault=self.ctx.fault,
                                       on_progress=self._bootstrap_progressed, stopping=lambda: self._draining)
            # The replica holds the source as of ``through``: V, or later when the change feed was
            # applied between chunks; the table's stream starts after it.
            through = chunked.run()
            snapshot_copy.set_properties(spark, dst, {
                **spec.replica_properties, snapshot_copy.PIPELINE_PROPERTY: spec.pipeline_id,
                snapshot_copy.SOURCE_PROPERTY: str(self.source), snapshot_copy.EPOCH_PROPERTY: str(progress.epoch),
                snapshot_copy.BOOTSTRAP_VERSION_PROPERTY: str(through)})
        self.ctx.fault("bootstrap_after_snapshot")
        progress = replace(progress, bootstrapped=True, bootstrap_version=through)
        self.ctx.states.save(self.slug, progress)
        if chunked is not None:
            chunked.finish()
        self.bootstrap_progress = None
        log.info("table %s: bootstrapped %s at source version %d (epoch %d; snapshot at %d)",
                 self.source, self.destination, through, progress.epoch, version)
        return progress

    def _bootstrap_progressed(self, progress: BootstrapProgress) -> None:
        self.bootstrap_progress = progress
        self._emit(progress)

    def _evolve_replica(self, plan: MergePlan) -> None:
        if self.pg is not None:
            self.pg.prepare(plan, self.ctx.spec.allow_schema_evolution)
            return
        spark = self.session
        dst = self.ctx.catalog.locate(self.destination)
        diff = diff_schema(plan.columns, snapshot_copy.replica_columns(spark, dst))
        if diff.is_empty:
            return
        if not diff.is_additive:
            raise SchemaIncompatible(
                f"{self.source}: the replica cannot follow the source schema ({diff.describe()}). "
                f"Resync the table to rebuild the replica, or revert the change on the source.",
                table=str(self.source))
        if not self.ctx.spec.allow_schema_evolution:
            raise SchemaIncompatible(
                f"{self.source}: the source has new columns ({diff.describe()}) and allow_schema_evolution "
                f"is false. Set allow_schema_evolution: true, or exclude the columns.", table=str(self.source))
        snapshot_copy.add_columns(spark, dst, diff.added)
        self.ctx.fault("schema_change")
        log.info("table %s: added columns to %s: %s", self.source, self.destination, diff.describe())

    # -- the stream -----------------------------------------------------------------------------

    def _start_stream(self, prepared: Prepared) -> None:
        spec, progress = self.ctx.spec, prepared.progress
        assert progress.bootstrap_version is not None
        src = self.ctx.catalog.locate(self.source)
        options: dict[str, Any] = {}
        if spec.max_files_per_trigger:
            options["maxFilesPerTrigger"] = spec.max_files_per_trigger
        if spec.max_bytes_per_trigger:
            options["maxBytesPerTrigger"] = spec.max_bytes_per_trigger
        kernel = spec.kernel_change_feed
        stream = change_feed.change_stream(self.session, src, progress.bootstrap_version, options, kernel=kernel)
        sink: Any = (self.pg.batch_sink(prepared.plan, progress.epoch) if self.pg is not None else
                     DeltaMergeSink(self.ctx.catalog.locate(self.destination), prepared.plan, stable_source=True,
                                    choose=lambda: self._choose_apply(prepared.plan)))
        app_id = txn_app_id(spec.pipeline_id, self.slug, progress.epoch)
        checkpoint = replica_record.stream_checkpoint(spec.checkpoint_root, spec.pipeline_id, self.slug, progress.epoch)
        self.stream_session = stream.sparkSession
        stream_dir.use_file_system_manager(self.stream_session, checkpoint)
        removed = stream_dir.remove_interrupted_writes(self.session, checkpoint)
        if removed:
            log.warning("table %s: removed %d unfinished checkpoint write(s) of a stopped or killed query: %s",
                        self.source, len(removed), ", ".join(removed))

        if not has_own_jvm(self.session):
            self._start_connect_query(prepared, stream, app_id, checkpoint)
            return
        gate = TurnGate() if spec.apply_workers > 0 and has_own_jvm(self.session) else None
        feed = self.batch_feed = BatchFeed.for_stream(checkpoint, src, progress.bootstrap_version)

        def apply_batch(batch: "DataFrame", batch_id: int) -> None:
            if kernel:
                change_feed.leave_kernel_mode(batch.sparkSession)

            def apply() -> None:
                self._apply_batch(sink, TxnId(app_id, batch_id), batch, progress.epoch, progress.source_table_id,
                                  feed.reader(batch_id) if feed is not None else None)
            if gate is None:
                apply()
            else:
                gate.pass_batch(apply, batch_id)

        writer = (stream.writeStream.queryName(f"lakemirror:{spec.pipeline_id}:{self.source}")
                  .option("checkpointLocation", checkpoint)
                  .foreachBatch(apply_batch))
        if spec.apply_workers == 0 or gate is not None:
            self._gate = gate
            self._query = writer.trigger(processingTime=f"{spec.trigger_interval_seconds} seconds").start()
        else:
            # A DataStreamWriter can start a query again once its last one has ended.
            self._turn_query = lambda once: (writer.trigger(once=True) if once
                                             else writer.trigger(availableNow=True)).start()

    def _start_connect_query(self, prepared: Prepared, stream: "DataFrame", app_id: str, checkpoint: str) -> None:
        """Spark Connect: the batch function runs on the server, in SQL only
        (:mod:`lakemirror.sinks.connect_apply`), and records each batch's checkpoint row; the
        runner reads those rows back (:meth:`_collect_connect_batches`)."""
        spec = self.ctx.spec
        job = batch_job(target=self.ctx.catalog.locate(self.destination), plan=prepared.plan, app_id=app_id,
                        epoch=prepared.progress.epoch, pipeline_id=spec.pipeline_id, source_fqn=str(self.source),
                        dest_fqn=str(self.destination),
                        checkpoint_table=getattr(self.ctx.checkpoints, "location", None))
        batches = ConnectBatches(job)
        batches.skip_recorded(self.session)
        self._connect, self._connect_progress_id = batches, None
        writer = (stream.writeStream.queryName(f"lakemirror:{spec.pipeline_id}:{self.source}")
                  .option("checkpointLocation", checkpoint)
                  .foreachBatch(job.bound()))
        if spec.apply_workers == 0:
            self._query = writer.trigger(processingTime=f"{spec.trigger_interval_seconds} seconds").start()
        else:
            self._turn_query = lambda once: (writer.trigger(once=True) if once
                                             else writer.trigger(availableNow=True)).start()

    def _collect_connect_batches(self, query: "StreamingQuery | None" = None) -> None:
        """Report the batches the server applied since the last look (Spark Connect only). With an
        always-on query, the checkpoint table is read only once the query reports a new trigger."""
        batches = self._connect
        if batches is None:
            return
        if query is not None:
            progress = query.lastProgress
            batch_id = getattr(progress, "batchId", None) if progress else None
            if batch_id is None or batch_id == self._connect_progress_id:
                return
            self._connect_progress_id = batch_id
        for batch_id, outcome, started, ended in batches.new_outcomes(self.session):
            if outcome.stats.last_version is not None:
                self.applied_through = max(self.applied_through or -1, outcome.stats.last_version)
            self.last_batch_at = ended
            self._turn_proven = True
            self._emit(BatchReport(self.table, batch_id, outcome, ended - started, ended))
            self._emit(sm.BatchApplied())

    def _choose_apply(self, plan: MergePlan) -> tuple[ApplyChoice, int]:
        """MERGE, rewrite or the driver's MERGE (:mod:`lakemirror.sinks.apply_choice`), asked by the first batch: two
        Spark jobs on the replica that need not delay the table's start."""
        facts = snapshot_copy.replica_facts(self.session, self.ctx.catalog.locate(self.destination))
        choice = choose_apply(facts, plan.column_names, self.ctx.spec.rewrite_below_bytes,
                              driver_apply=self.ctx.spec.driver_apply,
                              driver_apply_below_bytes=self.ctx.spec.driver_apply_below_bytes,
                              key_types=[c.type for c in plan.columns if c.name in plan.keys])
        log.info("table %s: %s", self.source, choice.reason)
        return choice, facts.rows

    # -- turns (apply_workers > 0) --------------------------------------------------------------

    def ready_for_turn(self) -> bool:
        if self._draining:
            return False
        if self._gate is not None:
            return self._gate.ready
        return self._turn_query is not None

    def has_pending(self) -> bool | None:
        """Whether the source has a commit the replica has not applied; None: cannot tell cheaply.

        True until a turn has run since the launch: that turn proves the table healthy (a table
        retrying after failures is not running again before it), whether or not there is data."""
        if self._gate is not None and self._gate.waiting:
            return True  # Spark planned a batch already
        through = self.applied_through
        if not self._turn_proven:
            return True
        if through is None:
            return None
        log = self._commit_files(self.ctx.catalog.locate(self.source))
        return None if log is None else log.has_commit(through + 1)

    def _small_backlog(self) -> bool | None:
        """Whether fewer than ``ONE_BATCH_VERSIONS`` source versions are unapplied (one commit-file
        check); None when that cannot be told cheaply."""
        through = self.applied_through
        if through is None:
            return None
        log = self._commit_files(self.ctx.catalog.locate(self.source))
        if log is None:
            return None
        try:
            return not log.has_commit(through + turns.ONE_BATCH_VERSIONS)
        except Exception:  # noqa: BLE001 (an unreadable log: the turn splits as usual)
            return None

    def take_turn(self) -> None:
        """Apply everything the table's change feed holds at the start of the turn, then return.

        Called by the turn pool's threads. An always-on query's batch is let through its gate;
        otherwise the query runs once from its checkpoint. A failure is reported through
        :meth:`poll` like a failed always-on query, and the table waits for the supervisor to
        launch it again."""
        with self._turn_lock:
            gate, query = self._gate, self._query
            if gate is not None:
                if query is not None and not self._draining:
                    self._take_gated_turn(gate, query)
                return
            start = self._turn_query
            if start is None or self._draining:
                return
            spec = self.ctx.spec
            once = turns.one_batch_turn(rate_limited=bool(spec.max_files_per_trigger or spec.max_bytes_per_trigger),
                                        proven=self._turn_proven, small_backlog=self._small_backlog())
            self.last_trigger = "once" if once else "availableNow"
            try:
                query = start(once)
                self._query = query
                query.awaitTermination()
            except Exception as exc:
                self._query = None
                if self._draining:
                    return  # the drain refused the next batch (Drained): nothing was applied
                self._turn_query = None
                self._emit(self._failed(self._batch_error or classify(server_batch_cause(exc), table=str(self.source))))
                return
            self._query = None
            self._collect_connect_batches()
            if not self._turn_proven:
                self._turn_proven = True  # a turn that ran to its end (even with nothing new) proves the table
                self._emit(sm.BatchApplied())
            self._track_progress(query)

    def _take_gated_turn(self, gate: TurnGate, query: "StreamingQuery") -> None:
        """Let the table's held or waiting batch go, and wait until the turn's batch is applied.

        A query that failed meanwhile ends the turn; :meth:`poll` reports it. A turn in which no
        batch begins is withdrawn once Spark has committed the batch before it and the source has
        no commit beyond what is applied (or after ``GATE_SETTLE_SECONDS`` more, when the source
        has one or cannot tell): the query then looks for new commits by itself."""
        self.last_trigger = "gated"
        held = gate.held_batch
        since = gate.grant()
        committed_at: float | None = None if held is not None else time.monotonic()
        try:
            while not gate.wait_ended(since, GATE_POLL_SECONDS):
                if gate.applying:
                    continue  # a batch ends by leaving the gate, even when it fails
                if self._draining or not query.isActive:
                    gate.withdraw()
                    return
                if committed_at is None:
                    if not self._committed(query, held):
                        continue
                    committed_at = time.monotonic()
                    self._track_progress(query)
                    if self._nothing_new() and gate.withdraw():
                        return
                if time.monotonic() - committed_at > GATE_SETTLE_SECONDS and gate.withdraw():
                    return
        except Exception as exc:  # noqa: BLE001 (a query stopping under us: poll() reports a failure)
            log.debug("table %s: turn ended early: %s", self.source, exc)
            gate.withdraw()

    def _nothing_new(self) -> bool:
        try:
            return self.has_pending() is False
        except Exception:  # noqa: BLE001 (an unreadable log: give Spark its settle time)
            return False

    @staticmethod
    def _committed(query: "StreamingQuery", batch_id: int | None) -> bool:
        """Whether Spark has finished the trigger of ``batch_id`` (committed it)."""
        progress = query.lastProgress
        return bool(progress) and batch_id is not None and int(progress["batchId"]) >= batch_id

    def _apply_batch(self, sink: DeltaMergeSink, txn: TxnId, batch: "DataFrame", epoch: int,
                     source_table_id: str | None = None, read: ChangeReader | None = None) -> None:
        with self._batch_lock:
            if self._draining:
                raise Drained(f"{self.source}: draining; batch {txn.version} left for the next run")
            started = self.ctx.clock()
            try:
                self._check_same_source(source_table_id, batch)
                self.ctx.fault("before_merge")
                if self._recorded_txn is not None and txn.version <= self._recorded_txn:
                    # The replica's log holds this batch: nothing to read (its change files may be gone).
                    outcome = replica_record.replayed_outcome()
                else:
                    outcome = sink.apply(batch, txn, read)
                if outcome.replayed:
                    log.info("table %s: batch %d of %s was already committed to the replica (a restart "
                             "replays it); Delta skipped the write", self.source, txn.version, txn.app_id)
                if outcome.stats.rows_read:
                    self.ctx.fault("after_merge")
                    # After a fresh MERGE no earlier attempt can have written this batch's row.
                    self.ctx.checkpoints.append(self._checkpoint_row(txn, epoch, outcome, started),  # type: ignore[call-arg]
                                                batch.sparkSession, known_new=not outcome.replayed)
                    self.ctx.fault("before_commit_log")
            except Exception as exc:
                self._batch_error = classify(exc, table=str(self.source))
                self._record_event(str(self._batch_error), self.ctx.states.load(self.slug), degraded=True,
                                   batch_id=txn.version, txn_app_id=txn.app_id)
                raise
            ended = self.ctx.clock()
            if outcome.stats.last_version is not None:
                self.applied_through = max(self.applied_through or -1, outcome.stats.last_version)
            self.last_batch_at = ended
            self._turn_proven = True
            self._emit(BatchReport(self.table, txn.version, outcome, ended - started, ended))
            self._emit(sm.BatchApplied())

    def _check_same_source(self, expected: str | None, batch: "DataFrame") -> None:
        """Refuse a batch read from a different table than the replica mirrors.

        A source dropped and recreated under its name while the stream runs has new version
        numbers that the stream would silently continue from (skipping the new table's first
        versions). Spark planned this batch's files before calling us, so a table id still equal
        to the one bootstrapped from proves the batch came from that table.
        """
        if expected is None:
            return
        current = self._settled_source_table_id(batch.sparkSession)
        if current != expected:
            raise SourceReplaced(
                f"{self.source}: the source was dropped and recreated while streaming (table id {expected} "
                f"is now {current}); the batch was refused and the replica no longer follows it. "
                f"Resync the table.", table=str(self.source))

    #: Pauses between re-reads of an unreadable source's table id (7.5 s in all).
    SOURCE_ID_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)

    def _settled_source_table_id(self, spark: "SparkSession") -> str | None:
        """The source's table id, read again while the table cannot be described.

        A table being dropped and recreated under its name cannot be described for a moment
        (its log files vanish while Delta reads them). Taking that for an expired change window
        would misname the cause; once the new table is there its new id names it. An error that
        outlasts the retries is raised as it is (and still ends in a resync or a failed table).
        """
        location = self.ctx.catalog.locate(self.source)
        for delay in self.SOURCE_ID_RETRY_DELAYS:
            try:
                return table_id(spark, location)
            except Exception as exc:  # noqa: BLE001 (re-raised below if it persists)
                log.info("table %s: cannot describe the source (%s); reading its id again in %.1f s",
                         self.source, str(exc).splitlines()[0][:200], delay)
                self.ctx.sleep(delay)
        return table_id(spark, location)

    def _record_event(self, error: str, progress: TableProgress, *, degraded: bool, batch_id: int = -1,
                      txn_app_id: str = "") -> None:
        """A checkpoint row that records a failure or a resync (best effort: never masks the cause)."""
        now = datetime.fromtimestamp(self.ctx.clock(), tz=timezone.utc)
        row = CheckpointRow(
            pipeline_id=self.ctx.spec.pipeline_id, source_fqn=str(self.source), dest_fqn=str(self.destination),
            epoch=progress.epoch, batch_id=batch_id, txn_app_id=txn_app_id, first_version=None,
            last_version=None, last_committed_version=self.applied_through if degraded else progress.bootstrap_version,
            rows_read=0, rows_merged=0, rows_inserted=0, rows_updated=0, rows_deleted=0,
            lag_seconds=self.last_lag.lag_seconds if self.last_lag else None, error=error[:4000],
            degraded=degraded, started_at=now, ended_at=now)
        try:
            self.ctx.checkpoints.append(row, self.session)  # type: ignore[call-arg]
        except Exception as exc:
            log.warning("table %s: could not record %r in the checkpoint table: %s", self.source, error[:80], exc)

    def _checkpoint_row(self, txn: TxnId, epoch: int, outcome: MergeOutcome, started: float) -> CheckpointRow:
        lag = self.last_lag.lag_seconds if self.last_lag else None
        return CheckpointRow(
            pipeline_id=self.ctx.spec.pipeline_id, source_fqn=str(self.source), dest_fqn=str(self.destination),
            epoch=epoch, batch_id=txn.version, txn_app_id=txn.app_id,
            first_version=outcome.stats.first_version, last_version=outcome.stats.last_version,
            last_committed_version=outcome.stats.last_version, rows_read=outcome.stats.rows_read,
            rows_merged=outcome.counts.total, rows_inserted=outcome.counts.inserted,
            rows_updated=outcome.counts.updated, rows_deleted=outcome.counts.deleted,
            lag_seconds=lag, error=None, degraded=False,
            started_at=datetime.fromtimestamp(started, tz=timezone.utc),
            ended_at=datetime.fromtimestamp(self.ctx.clock(), tz=timezone.utc))

