"""The per-table runner: prepares a table (key, plan, bootstrap) and runs its streaming query.

One runner per table, each with its own Spark session (``newSession``), so Delta's session-wide
transaction confs never race between tables. ``launch`` works in a background thread (a bootstrap
may take long and must not hold up other tables); everything the supervisor needs to know comes
back through :meth:`TableRunner.poll` as state-machine events and :class:`BatchReport` values.

The runner coordinates; its parts do the work, each in a module of its own:

- :mod:`.prepare` and :mod:`.bootstrap`: key, merge plan, checks, the epoch's snapshot, schema;
- :mod:`.stream_wiring`: the change stream, checkpoint, batch function and trigger of the query;
- :mod:`.batch_apply`: one micro-batch applied exactly once and recorded (every way of running
  the query applies its batches through it, with the same transaction ids);
- :mod:`.turn_taker`: turns on the apply workers (``apply_workers > 0``, :mod:`..apply_workers.worker_pool`);
- :mod:`.lag_probe`: the lag of the replica and the change window left;
- :mod:`.shared_state`: the live state those parts share.

Where the changes come from and where they go are seams: a
:class:`~lakemirror.sources.contract.TableChangeSource` (the Delta change feed) and a
:class:`~lakemirror.sinks.contract.TableReplica` (a Delta table, a PostgreSQL table, an in-memory
twin), each made by a factory of the pipeline's destination (:mod:`.table_factories`); the runner
never asks which kind it holds.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

from lakemirror import tables
from lakemirror.bounded import call_within
from lakemirror.checkpoints.bootstrap_state import BootstrapStore, bootstrap_store_for
from lakemirror.checkpoints.descriptions import DescriptionStore, FileDescriptionStore
from lakemirror.checkpoints.records import CheckpointStore
from lakemirror.checkpoints.round_rows import RoundRows
from lakemirror.checkpoints.state import StateStore, TableProgress
from lakemirror.delta_log.commit_files import LocalCommitFiles
from lakemirror.delta_log.stream_offsets import applied_through_from_offset
from lakemirror.errors import LakemirrorError
from lakemirror.sinks.accelerator.batch_feed import BatchFeed
from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.sinks.batch.chunked_bootstrap import BootstrapInterrupted, ChunkedCopy
from lakemirror.sinks.merge.connect_batches import ConnectBatches, server_batch_cause
from lakemirror.sinks.contract import ReplicaFactory, TableReplica
from lakemirror.sinks.waits import LockWait, ServerWait
from lakemirror.sinks.merge.feed_replay import ReplayTarget
from lakemirror.sources.catalog import Catalog
from lakemirror.sources.contract import TableChangeSource
from lakemirror.supervisor.change_feed.batch_apply import BatchApply, Drained, RowWriter
from lakemirror.supervisor.change_feed.bootstrap import Bootstrap
from lakemirror.supervisor.change_feed.dead_letters import FeedLetterDesk, server_batches_held_off
from lakemirror.supervisor.change_feed.lag_probe import LagProbe
from lakemirror.supervisor.change_feed.launch_slots import LaunchSlots, default_launch_slots
from lakemirror.supervisor.change_feed.launch_timing import LaunchTimer, first_batch_line
from lakemirror.supervisor.change_feed.prepare import Preparation, Prepared
from lakemirror.supervisor.change_feed.server_batches import report_server_batches
from lakemirror.supervisor.change_feed.shared_state import BatchReport, StreamLatency, TableLive
from lakemirror.supervisor.change_feed.source_description import SourceDescription
from lakemirror.supervisor.change_feed.stream_wiring import apply_detail, wire_stream
from lakemirror.supervisor.change_feed.table_factories import SourceFactory, delta_change_feeds, delta_table_replicas
from lakemirror.supervisor.change_feed.turn_taker import TableTurns
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.classify_errors import classify
from lakemirror.supervisor.control.destination_waits import WaitReport
from lakemirror.supervisor.control.failure_policy import failed_event
from lakemirror.supervisor.control.lag import LagReading
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec
from lakemirror.supervisor.offline import replica_transactions
from lakemirror.sinks.txn import txn_app_id
from lakemirror.tables import has_own_jvm, is_local_path, own_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["FAULT_POINTS", "BatchReport", "Drained", "Prepared", "RunnerContext", "StreamLatency", "TableRunner"]

log = logging.getLogger(__name__)


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
    #: Where each table's source description is kept between runs (default: in the pipeline's
    #: checkpoint folder when it is on the driver's file system; None: every launch describes by Spark).
    descriptions: DescriptionStore | None = None
    #: How many tables launch at once (default: :func:`~.launch_slots.default_launch_slots`).
    launch_slots: LaunchSlots | None = None

    #: Each table's replica, ``replica_for(table, session)`` (None: a Delta table in the destination schema).
    replica_for: ReplicaFactory | None = None
    #: Each table's change source, ``source_for(table, session)`` (None: the source table's Delta change feed).
    source_for: SourceFactory | None = None
    #: Appends the checkpoint rows of batches applied on a Spark Connect server, and of those the daemon
    #: planned from commit files, a round at a time (made from ``checkpoints`` if None; its thread
    #: starts with the first row).
    round_rows: RoundRows | None = None
    #: The pipeline's change-feed dead letters (counts, skip, replay); None: not counted.
    feed_letters: FeedLetterDesk | None = None

    def __post_init__(self) -> None:
        if self.round_rows is None:
            self.round_rows = RoundRows(self.checkpoints, fault=self.fault)
        if self.bootstrap_slots is None:
            self.bootstrap_slots = threading.BoundedSemaphore(max(1, self.spec.bootstrap.parallel_chunks))
        if self.bootstraps is None:
            self.bootstraps = bootstrap_store_for(self.states)
        if self.launch_slots is None:
            self.launch_slots = LaunchSlots(default_launch_slots())
        if self.descriptions is None and is_local_path(self.spec.checkpoint_root):
            self.descriptions = FileDescriptionStore(Path(self.spec.checkpoint_root) / self.spec.pipeline_id)
        if self.replica_for is None:
            letters = self.feed_letters
            self.replica_for = delta_table_replicas(self.catalog, self.spec, self.fault,
                                                    letters.recorded if letters is not None else lambda found: None)
        if self.source_for is None:
            self.source_for = delta_change_feeds(self.catalog, self.spec)


#: Where the torture harness may kill the daemon (tests/torture): each is a moment at which a
#: crash must lose nothing and apply nothing twice.
FAULT_POINTS = (
    "bootstrap_before_snapshot",   # the new epoch is saved, the snapshot not yet written
    "bootstrap_inside_chunk",      # a chunk's rows are read, its commit not yet written
    "bootstrap_between_chunks",    # a chunk is committed, the next not yet begun
    "bootstrap_after_capture",     # a capture's change rows are committed, the bootstrap's plan does not say so
    "bootstrap_after_snapshot",    # the snapshot is committed, the state does not say so yet
    "schema_change",               # the replica gained columns, the stream not restarted yet
    "before_merge",                # a micro-batch is planned (offsets logged), nothing written
    "after_merge",                 # the MERGE is committed, its checkpoint row is not
    "after_driver_commit",         # the driver's delta-rs commit (local or on S3) is durable, nothing after it
    "before_commit_log",           # the checkpoint row is written, Spark's commit log is not
    # Spark Connect (checkpoints/round_rows.py): batches the server applied and reported in outcome files,
    "connect_before_rows",         # ... reported by the daemon, their rows not yet appended
    "connect_after_rows",          # ... their rows appended, the outcome files not yet forgotten
    # A Postgres replica's batch (sinks/postgres/executor.py), inside its one transaction:
    "postgres_after_copy",         # the winners are COPYed into staging, nothing upserted
    "postgres_before_commit",      # upsert, tombstones and progress row written, not committed
)


class _ReplicaWaits:
    """The replica's waits on its server, as :class:`~..control.destination_waits.WaitReport` asks for them (none
    before the replica is made)."""

    def __init__(self, runner: "TableRunner") -> None:
        self.runner = runner

    def wait(self, look_up: Callable[[int], LockWait | None] | None = None) -> ServerWait | None:
        replica = self.runner.__dict__.get("replica")
        return replica.server_wait() if replica is not None else None


class TableRunner:
    """Runs one table: launch, poll, turns, lag, halt (see the module docstring)."""

    def __init__(self, table: str, ctx: RunnerContext) -> None:
        self.table = table
        self.ctx = ctx
        self.source = ctx.spec.source(table)
        self.destination = ctx.spec.destination(table)
        self.slug = self.source.slug
        self.live = TableLive(table)
        #: The replica's waits on its server, shown as the table's state (a replica with a server).
        self.waits = WaitReport(_ReplicaWaits(self), self.live.emit)
        self._healthy_query: "StreamingQuery | None" = None
        #: The driver path's delta-rs read of this launch's batches (None: Spark reads every batch).
        self.batch_feed: BatchFeed | None = None
        #: The batch sink of this launch's query (its apply path, for status); None over Spark Connect.
        self._sink: Any = None
        #: Spark Connect: the batches the server-side batch function recorded (None: a local session).
        self._connect: ConnectBatches | None = None
        self._connect_epoch = 0
        #: The session the table's query is started in: :attr:`session`, or one of the query's own
        #: (``kernel_change_feed``: :func:`lakemirror.sources.change_feed.kernel_stream`).
        self.stream_session: SparkSession | None = None
        self._thread: threading.Thread | None = None
        self._session: SparkSession | None = None
        self._resync_reason: str | None = None
        self._resynced_from_table_id: str | None = None
        self.prepared: Prepared | None = None
        #: The latest launch's timing (logged once its stream starts, and with its first batch).
        self._timer: LaunchTimer | None = None
        self._stream_started_at: float | None = None
        self._first_batch_logged = False
        self._launches = 0
        #: What a halt in progress waits for; after a halt, what it left unfinished at its deadline (None:
        #: nothing). A drain names it for a table it abandons.
        self.halting: str | None = None
        self.rows = RowWriter(ctx.spec.pipeline_id, str(self.source), str(self.destination), ctx.checkpoints,
                              ctx.clock, lambda: self.session)
        self.apply_batch = BatchApply(
            self.live, lambda batch: self.change_source.identity(batch), self.rows,
            load_progress=lambda: ctx.states.load(self.slug), lag_seconds=self._lag_seconds,
            clock=ctx.clock, sleep=ctx.sleep, fault=ctx.fault)
        self.turns = TableTurns(self.live, ctx.spec, str(self.source), commit_files=lambda: self.lag.commit_files(),
                                failed=self._failed, collect=self._collect_connect_batches, track=self._track_progress,
                                on_server=self._on_server)

    # -- the parts that need the table's session, made on first use --------------------------------

    @property
    def session(self) -> "SparkSession":
        if self._session is None:
            self._session = own_session(self.ctx.spark)
        return self._session

    @cached_property
    def change_source(self) -> TableChangeSource[Any]:
        """Where the table's changes come from (the pipeline's ``source_for``: its Delta change feed)."""
        assert self.ctx.source_for is not None
        return self.ctx.source_for(self.table, self.session)

    @cached_property
    def replica(self) -> TableReplica[Any]:
        """Where the table's changes go (the pipeline's ``replica_for``: a Delta, PostgreSQL or twin table)."""
        assert self.ctx.replica_for is not None
        return self.ctx.replica_for(self.table, self.session)

    def _on_server(self) -> bool:
        """Whether the replica's work is on its server now (a turn's worker is then let go)."""
        replica = self.__dict__.get("replica")  # made at launch; never made here, on a turn's thread
        return replica is not None and replica.on_server()

    @cached_property
    def description(self) -> SourceDescription:
        """The source's description for a launch, reused from an earlier one while it holds."""
        location = self.ctx.catalog.locate(self.source)
        return SourceDescription(self.change_source, location, LocalCommitFiles.for_table(location),
                                 self.ctx.descriptions, self.slug, str(self.source))

    @cached_property
    def lag(self) -> LagProbe:
        return LagProbe(self.change_source, str(self.source), self.ctx.spec.retention_warning_seconds)

    # -- what the supervisor reads ----------------------------------------------------------------

    @property
    def applied_through(self) -> int | None:
        return self.live.applied_through

    @applied_through.setter
    def applied_through(self, version: int | None) -> None:
        self.live.applied_through = version

    @property
    def last_batch_at(self) -> float | None:
        return self.live.last_batch_at

    @property
    def last_lag(self) -> LagReading | None:
        return self.lag.last if "lag" in self.__dict__ else None

    @property
    def last_trigger(self) -> str | None:
        """How the table's latest turn ran: gated, once or availableNow."""
        return self.turns.last_trigger

    @property
    def _query(self) -> "StreamingQuery | None":
        return self.live.query

    @_query.setter
    def _query(self, query: "StreamingQuery | None") -> None:
        self.live.query = query

    @property
    def query_running(self) -> bool:
        """Whether the table's always-on query is up (observability and tests)."""
        query = self.live.query
        return query is not None and bool(query.isActive)

    def describe(self) -> dict[str, Any] | None:
        """The table's own status (``detail`` of ``/status``): how its batches reach the replica, and
        its dead letters waiting for the operator."""
        detail = apply_detail(self._sink, self.batch_feed, self.turns.feed)
        out: dict[str, Any] = {} if detail is None else {"apply": detail}
        letters = self.ctx.feed_letters
        pending = letters.pending().get(self.table, 0) if letters is not None else 0
        if pending:
            out["dead_letters_pending"] = pending
        return out or None

    def _lag_seconds(self) -> float | None:
        last = self.last_lag
        return last.lag_seconds if last else None

    # -- lifecycle ------------------------------------------------------------------------------

    def launch(self) -> None:
        """Prepare and start the stream in the background; outcome arrives through ``poll``."""
        if self._thread is not None and self._thread.is_alive():
            return
        self.live.draining = False
        self.live.batch_error = None
        self.live.turn_proven = False
        self.turns.reset()
        self._thread = threading.Thread(target=self._launch, name=f"launch:{self.table}", daemon=True)
        self._thread.start()

    def halt(self, timeout: float = 60.0) -> None:
        """Stop the stream after the batch in flight (if any) has finished; returns within ``timeout``.

        Every wait shares that one deadline, the query's ``stop()`` included: a stop that does not
        return in time (over a Spark Connect server that is gone its client retries for minutes) is
        left to finish on a thread of its own. :attr:`halting` says what the halt waits for, and
        once it has returned, what it left unfinished at its deadline (None: nothing)."""
        deadline = time.monotonic() + timeout
        left: list[str] = []

        def step(what: str, finished: bool) -> None:
            if not finished and not left:
                left.append(what)

        self.live.draining = True
        self.turns.turn_query = None
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self.halting = "waiting for its launch"
            thread.join(max(0.0, deadline - time.monotonic()))
            step("waiting for its launch", not thread.is_alive())
        if self.turns.gate is not None:
            # After the launch has ended, so a query it was starting is covered too: a query
            # held in its batch function could not be stopped.
            self.turns.gate.open()
        query = self.live.query
        if query is not None:
            # Wait for the batch in flight, then stop. The lock is not held across stop(): a batch
            # that begins meanwhile must reach its Drained check, not block on the lock while
            # stop() waits for the very thread that runs it (that deadlocked a drain).
            self.halting = "waiting for its batch in flight"
            step(self.halting, self.apply_batch.wait_idle(deadline - time.monotonic()))
            self.halting = "stopping its query"
            try:
                stopped = call_within(query.stop, deadline - time.monotonic(), f"stop:{self.table}")
                step(self.halting, stopped)
                if not stopped:
                    log.warning("table %s: its query did not stop within %.0fs; it is left stopping (a batch "
                                "it did not commit is replayed when the table starts again)", self.source, timeout)
            except Exception as exc:  # a query that already died cannot be stopped: nothing to do
                log.debug("stopping %s: %s", self.table, exc)
            finally:
                self.live.query = None
        # A turn that started before the drain ends by itself: its next batch is refused (Drained).
        self.halting = "waiting for its turn in flight"
        step(self.halting, self.turns.wait_idle(deadline - time.monotonic()))
        feed = self.turns.feed
        if feed is not None:
            # The last batch's checkpoint row, appended by the pipeline's row writer, then its commit
            # in the query's log (one not written by the deadline is replayed at the next start).
            self.halting = "recording its last batch"
            step(self.halting, feed.wait_settled(deadline - time.monotonic()))
        if self._connect is not None:
            # Spark Connect: the batches the server applied last are reported and their rows written
            # now (those not written by the deadline are recorded at the next start, from their files).
            self.halting = "recording its last batches"
            try:
                self._collect_connect_batches()
            except Exception as exc:  # noqa: BLE001 (the outcome files remain for the next start)
                log.debug("table %s: reading the last batches' outcomes: %s", self.table, exc)
            assert self.ctx.round_rows is not None
            step(self.halting, self.ctx.round_rows.flush(max(0.0, deadline - time.monotonic())))
        self.halting = left[0] if left else None

    def persisted_pause(self) -> bool:
        return self.ctx.states.load(self.slug).paused

    def pause_persisted(self, paused: bool) -> None:
        progress = self.ctx.states.load(self.slug)
        self.ctx.states.save(self.slug, replace(progress, paused=paused))

    def source_exists(self) -> bool:
        """Whether the source table exists now (the discovery loop's check of a missing table)."""
        return bool(tables.exists(self.session, self.ctx.catalog.locate(self.source)))

    def resync(self, reason: str) -> None:
        """Forget the replica's progress so the next launch bootstraps a new epoch.

        Persisted at once (a crash before the bootstrap still resyncs); the old checkpoint and
        transaction ids belong to the old epoch and are never reused."""
        progress = self.ctx.states.load(self.slug)
        self.ctx.states.save(self.slug, replace(progress, bootstrapped=False, bootstrap_version=None,
                                                source_table_id=None))
        self.live.applied_through = None
        self.prepared = None
        if "lag" in self.__dict__:
            self.lag.reset()
        self.apply_batch.record = None
        self._resync_reason = reason
        self._resynced_from_table_id = progress.source_table_id
        log.warning("table %s: resync (%s)", self.source, reason)

    # -- events ---------------------------------------------------------------------------------

    def poll(self) -> list["sm.Event | BatchReport | BootstrapProgress"]:
        """Events since the last poll, plus a failure event if the query died."""
        live, gate = self.live, self.turns.gate
        # Started-per-turn queries report their own end; always-on ones (gated or not) end only by failing.
        query = live.query if self.ctx.spec.apply_workers == 0 or gate is not None else None
        if query is not None and not query.isActive and not live.draining:
            live.query = None
            exc = query.exception()
            error = live.batch_error or classify(server_batch_cause(exc or RuntimeError("the stream stopped")),
                                                 table=str(self.source))
            live.emit(self._failed(error))
        elif query is not None and (gate is None or not live.turn_proven):
            self._track_progress(query)
        if self._connect is not None:
            # Spark Connect: the batches the server applied (their outcome files; a folder listing).
            heartbeat = getattr(gate, "heartbeat", None)
            if heartbeat is not None:
                heartbeat()  # the server's waiting batch functions see the daemon alive
            self._collect_connect_batches()
        self.waits.check()
        events = live.take_events()
        if not self._first_batch_logged:
            self._log_first_batch(events)
        return events

    def _log_first_batch(self, events: list["sm.Event | BatchReport | BootstrapProgress"]) -> None:
        """Say how long after its launch began the table applied its first batch (once a launch)."""
        report = next((e for e in events if isinstance(e, BatchReport)), None)
        if report is None or self._timer is None:
            return
        self._first_batch_logged = True
        log.info(first_batch_line(str(self.source), report.batch_id, launch_began=self._timer.started,
                                  stream_started=self._stream_started_at,
                                  apply_began=report.ended_at - report.duration_seconds, ended=report.ended_at))

    def _failed(self, error: LakemirrorError) -> sm.Failed:
        spec = self.ctx.spec
        return failed_event(error, table=self.table, allow_schema_evolution=spec.allow_schema_evolution,
                            change_window_policy=spec.change_window_policy, rand=random.random())

    def _track_progress(self, query: "StreamingQuery") -> None:
        progress = query.lastProgress
        if not progress:
            return
        if query is not self._healthy_query and self.turns.turn_query is None:
            # A completed trigger of this always-on query (even one with no data) proves it healthy.
            self._healthy_query = query
            self.live.turn_proven = True
            self.live.emit(sm.BatchApplied())
        try:
            payload = json.loads(progress.json) if hasattr(progress, "json") else progress
            through = applied_through_from_offset(payload["sources"][0].get("endOffset"))
        except (KeyError, IndexError, TypeError, ValueError):
            return
        self.live.advance(through)

    def _collect_connect_batches(self, query: "StreamingQuery | None" = None) -> None:
        """Report the batches the server applied since the last look, and hand their checkpoint rows
        to the round writer (Spark Connect only): the outcome files' folder is listed, no Spark job."""
        if self._connect is not None:
            assert self.ctx.round_rows is not None
            letters = self.ctx.feed_letters
            report_server_batches(self._connect, self.ctx.round_rows, self.rows, self.live, self._connect_epoch,
                                  self._lag_seconds(), letters.recorded if letters is not None else lambda found: None)

    # -- lag ------------------------------------------------------------------------------------

    def committed_at(self, version: int) -> float | None:
        """When source ``version`` was committed, if it is: what a caught-up reading asks of the next
        version (:meth:`LagProbe.committed_at`: a ``stat`` of its commit file on the driver's file
        system; on an object store only a version another look has found, else None)."""
        return self.lag.committed_at(version) if "lag" in self.__dict__ else None

    def probe_lag(self, now: float) -> LagReading | None:
        # One reading of the applied version for the whole probe: batches advance it on the
        # stream's thread meanwhile, and commit times read for one version cannot price another
        # (that mix once reported a 0 s change window and a lag off by whole batches).
        through, prepared = self.live.applied_through, self.prepared
        if through is None:
            return None
        return self.lag.probe(through, None if prepared is None else prepared.retention, now)

    # -- preparation and the stream -------------------------------------------------------------

    def _adopt_record(self) -> None:
        """Take the applied version from the replica's own record before anything else: a table
        that fails to start reports what its replica holds, not its epoch's bootstrap version."""
        spec = self.ctx.spec
        try:
            replica, source = self.ctx.catalog.locate(self.destination).path, self.ctx.catalog.locate(self.source).path
            record = replica_transactions.read_record(
                self.ctx.states.load(self.slug), checkpoint_root=spec.checkpoint_root, pipeline_id=spec.pipeline_id,
                table_slug=self.slug, replica_path=replica, source_path=source,
                replica_target=replica_transactions.remote_target(self.session, replica) if self.replica.delta_log else None,
                source_target=replica_transactions.remote_target(self.session, source))
        except Exception as exc:  # noqa: BLE001 (the stream's own progress remains)
            log.info("table %s: cannot read the replica's transaction record: %s", self.source, exc)
            record = None
        self.apply_batch.record = record
        if record is not None:
            self.live.advance(record.applied_through)

    def _launch(self) -> None:
        self._launches += 1
        timer = self._timer = LaunchTimer(self.ctx.clock)
        self._stream_started_at, self._first_batch_logged = None, False
        slots = self.ctx.launch_slots
        assert slots is not None
        try:
            self._adopt_record()
            timer.mark("record")
            with slots.held():
                timer.mark("slot")
                if self.live.draining:
                    return
                prepared = self.prepare(timer.mark, slots.given_back)
                if self.live.draining:
                    return
                self.prepared = prepared
                if self._resync_reason is not None:
                    self._record_event(f"resync: {self._resync_reason}{self._replacement_note(prepared.progress)}",
                                       prepared.progress, degraded=False)
                    self._resync_reason = None
                if self.live.applied_through is None:
                    self.live.applied_through = prepared.progress.bootstrap_version
                self._start_stream(prepared, timer.mark)
                timer.mark("stream")
            self._stream_started_at = timer.last_mark
            log.info("table %s: stream started %s after the launch began", self.source, timer.describe())
            if self.ctx.feed_letters is not None:
                self.ctx.feed_letters.seed()  # the dead letters a restart carries over, counted once
            self.live.emit(sm.StreamStarted())
        except BootstrapInterrupted as exc:  # a drain stopped the bootstrap between chunks: not a failure
            log.info("table %s: %s", self.source, exc)
        except Exception as exc:  # every failure becomes a visible state, never a dead thread
            log.warning("table %s failed to start: %s", self.source, exc)
            error = classify(exc, table=str(self.source))
            self._record_event(str(error), self.ctx.states.load(self.slug), degraded=True)
            self.live.emit(self._failed(error))

    def _record_event(self, error: str, progress: TableProgress, *, degraded: bool) -> None:
        self.rows.record_event(error, progress, degraded=degraded, applied_through=self.live.applied_through,
                               lag_seconds=self._lag_seconds())

    def _replacement_note(self, progress: TableProgress) -> str:
        """Name a replaced source in the resync record, whichever error first noticed it: the
        stream's reader can fail on the vanished log of the old table (reported as an expired
        window) before any batch sees the new table id."""
        before, after = self._resynced_from_table_id, progress.source_table_id
        if before and after and before != after:
            return f" The source was dropped and recreated (table id {before} is now {after})."
        return ""

    def prepare(self, mark: Callable[[str], None] = lambda step: None,
                while_bootstrapping: Callable[[], ContextManager[None]] = nullcontext) -> Prepared:
        """Key, plan, checks, bootstrap and schema of the table (:mod:`.prepare`); ``mark`` is told
        as each step ends, ``while_bootstrapping`` wraps the bootstrap."""
        ctx, label = self.ctx, str(self.source)
        bootstrap = Bootstrap(self.change_source, self.replica, ctx.states, self.slug, label, str(self.destination),
                              ctx.fault, self.live.emit, self._chunked_copy(),
                              describe=lambda: self.description.describe(True))
        reuse = self._launches == 1  # a relaunch (a retry, a resume, a resync) describes the table afresh
        return Preparation(self.change_source, self.replica, ctx.states, self.slug, label,
                           ctx.spec.options_for(self.table), ctx.spec.allow_schema_evolution, bootstrap,
                           ctx.fault, ctx.spec.enable_change_data_feed, mark,
                           lambda: self.description.describe(reuse), while_bootstrapping).run()

    def _chunked_copy(self) -> ChunkedCopy | None:
        """A Delta replica bootstraps in chunks (one when the table is small); other replicas
        (PostgreSQL, the in-memory twin) take the snapshot in one copy."""
        if not self.replica.delta_log:
            return None
        ctx, spec = self.ctx, self.ctx.spec
        assert ctx.bootstraps is not None and ctx.bootstrap_slots is not None
        return ChunkedCopy(
            self.session, label=str(self.source), slug=self.slug, source=ctx.catalog.locate(self.source),
            replica=ctx.catalog.locate(self.destination),
            ensure_schema=lambda: ctx.catalog.ensure_schema(self.session, self.destination.catalog,
                                                            self.destination.schema),
            pipeline_id=spec.pipeline_id, checkpoint_root=spec.checkpoint_root,
            replica_properties=spec.replica_properties, policy=spec.bootstrap, store=ctx.bootstraps,
            slots=ctx.bootstrap_slots, clock=ctx.clock, fault=ctx.fault, on_progress=self.live.emit,
            stopping=lambda: self.live.draining)

    def _start_stream(self, prepared: Prepared, mark: Callable[[str], None] = lambda step: None) -> None:
        wiring = wire_stream(self.session, self.ctx.spec, self.slug, self.change_source, self.replica,
                             self.ctx.catalog.locate(self.destination), prepared, self.apply_batch,
                             self.ctx.checkpoints.last_batch, mark, self.ctx.round_rows)
        self._connect, self._connect_epoch = wiring.connect, prepared.progress.epoch
        self.batch_feed, self.stream_session, self._sink = wiring.batch_feed, wiring.stream_session, wiring.sink
        self.turns.gate, self.turns.turn_query, self.turns.feed = wiring.gate, wiring.turn_query, wiring.feed_batches
        self.live.query = wiring.query

    # -- turns (apply_workers > 0) --------------------------------------------------------------

    def ready_for_turn(self) -> bool:
        return self.turns.ready()

    def has_pending(self) -> bool | None:
        """Whether the source has a commit the replica has not applied; None: cannot tell cheaply."""
        return self.turns.has_pending()

    def take_turn(self) -> None:
        """Apply everything the table's change feed holds at the start of the turn, then return.

        Called by the turn pool's threads (:meth:`.turn_taker.TableTurns.take`)."""
        self.turns.take()

    # -- dead letters (the operator's replay) ----------------------------------------------------

    @property
    def letter_label(self) -> str:
        """How the table's dead letters name it: its source table."""
        return str(self.source)

    @contextmanager
    def between_batches(self) -> Iterator["ReplayTarget | str"]:
        """Hold the table's batches off (the lock each batch's apply takes; over Spark Connect the lock
        of its turns, without which no batch can begin on the server) and yield what a replay of its
        dead letters needs, or why it cannot run now (:mod:`.dead_letters`). A paused or stopping
        table replays too: no batch runs, and its replica holds exactly its applied version."""
        with self.turns.lock if not has_own_jvm(self.session) else nullcontext(), self.apply_batch.lock:
            yield self._replay_target()

    def _replay_target(self) -> "ReplayTarget | str":
        prepared, through = self.prepared, self.live.applied_through
        if not self.replica.delta_log:
            return "the replica is not a Delta table: its destination keeps its dead letters, and a replay writes Delta"
        if prepared is None or through is None or prepared.progress.bootstrap_version is None:
            return (f"table {self.table} is not streaming (its replica is being prepared or bootstrapped, or it "
                    f"failed to start); replay it once `lakemirror status` shows it running")
        if not has_own_jvm(self.session):
            refusal = server_batches_held_off(self.turns.gate, self.live.query is not None)
            if refusal is not None:
                return refusal
        spec = self.ctx.spec
        checkpoint = replica_transactions.stream_checkpoint(spec.checkpoint_root, spec.pipeline_id, self.slug,
                                                      prepared.progress.epoch)
        written = replica_transactions.touched_through(checkpoint)
        # Spark Connect: a batch the server applied is committed by Spark only at the table's next
        # turn, and may not be reported yet: its outcome file says what the replica holds. The files
        # are read before the applied version, which a file's batch has moved before it goes.
        on_server = self._connect.files_through() if self._connect is not None else None
        through = self.live.applied_through
        return ReplayTarget(str(self.source), self.ctx.catalog.locate(self.source),
                            self.ctx.catalog.locate(self.destination), prepared.plan,
                            max(v for v in (through, written, on_server) if v is not None),
                            txn_app_id(spec.pipeline_id, self.slug, prepared.progress.epoch))

    def _apply_batch(self, sink: Any, txn: Any, batch: Any, epoch: int, source_table_id: str | None = None,
                     read: Any = None) -> None:
        """One micro-batch through :class:`~.batch_apply.BatchApply` (what the batch function calls)."""
        self.apply_batch(sink, txn, batch, epoch, source_table_id, read)
