"""The composition root: every component of the daemon, of ``lakemirror replicate`` and of the
daemon's scheduled sub-tasks is built here, once, from validated settings.

A context is a set of factories, each a :func:`functools.cached_property`: the first access builds
the part from the settings and the parts it needs, later accesses return the same object, and a
part nobody asks for is never built (a daemon without schedules never opens the audit table).
Tests swap parts with :meth:`GlobalContext.replace` instead of patching modules::

    ctx = DaemonContext(settings).replace(spark=spark, metrics=Metrics("t", CollectorRegistry()))

:class:`GlobalContext` holds what every command needs (Spark, the catalog, the batch operations'
audit log, results and runner); :class:`ReplicateContext` adds the ``replicate`` command's run;
:class:`DaemonContext` adds the streaming pipeline, the control API, the HTTP server and the
scheduled sub-tasks, and runs the daemon.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import replace as dataclass_replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Self, Sequence, TextIO

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.audit import AuditLog, DeltaAuditLog
from lakemirror.checkpoints.lease import LeaseLost, LeaseRecord
from lakemirror.checkpoints.lease_store import generation_of
from lakemirror.checkpoints.pipeline_lease import PipelineLease
from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
from lakemirror.checkpoints.records import CheckpointStore
from lakemirror.checkpoints.state import FileStateStore
from lakemirror.checkpoints.commands import FileCommandJournal
from lakemirror.checkpoints.stream_dir import query_id
from lakemirror.daemon import http_token, preflight
from lakemirror.daemon.api import ContinuousSyncApi
from lakemirror.daemon.databricks_pipelines import DatabricksPipelines
from lakemirror.daemon.control_loop import ControlLoop
from lakemirror.daemon.dead_letter_api import DeadLetterApi, NoFeedLetters
from lakemirror.daemon.destinations import DEAD_LETTER_PREFIX as DEAD_LETTER_PREFIX
from lakemirror.daemon.destinations import Cycles, Destination, destination_for
from lakemirror.daemon.drain import EXIT_GRACE_SECONDS, LEASE_RELEASE_SECONDS, DrainOutcome, drain, release_lease, where
from lakemirror.daemon.exit_codes import EXIT_DRAIN_INCOMPLETE, EXIT_FAILED
from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.jars import JarsMissing
from lakemirror.daemon.lease import pipeline_lease
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.pipelines import PipelineHandle, PipelineRegistry
from lakemirror.daemon.settings import RuntimeSettings, Settings
from lakemirror.daemon.settings.replicate import ReplicateConfig
from lakemirror.daemon.settings.real_time import real_time_spark_conf
from lakemirror.daemon.settings.runtime_spec import (
    REPLICATE_NAMESPACE, cycle_mode, cycle_tables, destination_subtasks, event_stream_spec, jobs_for,
    maintenance_subtasks, mode_of, pipeline_spec, plan, shared_catalogs, subtask_of,
)
from lakemirror.daemon.dr_context import disaster_recovery_operations, logged_run, run_in_phases
from lakemirror.daemon.recovery import cut_json, recovery_points_of
from lakemirror.daemon.java_check import JavaMissing
from lakemirror.daemon.status import status_info
from lakemirror.daemon.worker import CommandWorker
from lakemirror.errors import ConfigError, LakemirrorError
from lakemirror.identifiers import TableName
from lakemirror.secrets import redact
from lakemirror.sinks.batch.incremental import IncrementalOperations, IncrementalSweep, WithIncremental
from lakemirror.sinks.batch.operations import Operations, SparkOperations
from lakemirror.sinks.batch.reconcile import DeltaReconciliationStore
from lakemirror.sinks.waits import ServerWait
from lakemirror.sources import cdf_check
from lakemirror.sources.catalog import Catalog, Discovery, LocalCatalog, SparkDiscovery, UnityCatalog
from lakemirror.sources.event_source import event_source_for
from lakemirror.supervisor.change_feed.dead_letters import FeedLetterDesk
from lakemirror.supervisor.change_feed.table_runner import FAULT_POINTS, RunnerContext, TableRunner
from lakemirror.supervisor.control.loop import Runner, Supervisor, TableView
from lakemirror.supervisor.control.observer import Observer
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec
from lakemirror.supervisor.control.table_state import RestartPolicy
from lakemirror.supervisor.events.status_record import recorded_entry, state_slug
from lakemirror.supervisor.events.stream_runner import EVENT_FAULT_POINTS, RUNNER_PREFIX, EventStreamRunner
from lakemirror.supervisor.offline.recorded_tables import read_pipeline, refreshed
from lakemirror.supervisor.subtasks.batch_runner import (
    BatchRunner, Progress, RunSummary, TableJob, TextProgress,
)
from lakemirror.supervisor.subtasks.cycle_tables import CycleTables
from lakemirror.supervisor.subtasks.service import SubtaskRun, SubtaskService
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: The torture harness (tests/torture) names crash points here, e.g. ``after_merge`` or
#: ``after_merge:3`` (the third time the point is reached); never set in production.
KILL_AT_ENV = "LAKEMIRROR_TEST_KILL_AT"

def crash_points_from_environment() -> Callable[[str], None]:
    """A fault hook that SIGKILLs this process at the armed point, or a no-op when none is armed."""
    armed = os.environ.get(KILL_AT_ENV, "").strip()
    if not armed:
        return lambda point: None
    name, _, nth = armed.partition(":")
    known = FAULT_POINTS + EVENT_FAULT_POINTS
    if name not in known:
        raise ConfigError([(KILL_AT_ENV, f"unknown crash point {name!r}; known: {', '.join(known)}")])
    remaining = [int(nth or 1)]

    def fault(point: str) -> None:
        if point == name:
            remaining[0] -= 1
            if remaining[0] <= 0:
                os.kill(os.getpid(), signal.SIGKILL)
    return fault


class GlobalContext:
    """What every command builds the same way: Spark, the catalog, and the batch operations' audit
    log, reconciliation results and runner. Subclasses name the runtime and the audit tables."""

    @property
    def runtime(self) -> RuntimeSettings:
        raise NotImplementedError

    @property
    def python_workers_stop(self) -> bool:
        """Whether queries with tasks in Python workers are stopped while they run (Real-Time Mode)."""
        return False

    def replace(self, **parts: Any) -> Self:
        """Use ``parts`` instead of building them (tests): each name is one of this context's
        factories; an unknown name raises, so a misspelt override cannot be silently ignored."""
        for name, value in parts.items():
            if not isinstance(getattr(type(self), name, None), cached_property):
                raise TypeError(f"{type(self).__name__} has no factory {name!r}")
            self.__dict__[name] = value
        return self

    @cached_property
    def spark(self) -> "SparkSession":
        from lakemirror.daemon.spark import create_session

        return create_session(self.runtime, python_workers_stop=self.python_workers_stop)

    @property
    def unity_catalog(self) -> bool:
        return self.runtime.mode == "databricks"

    @cached_property
    def catalog(self) -> Catalog:
        return UnityCatalog() if self.unity_catalog else LocalCatalog(self.runtime.warehouse)

    @cached_property
    def clock(self) -> Callable[[], float]:
        return time.time

    @cached_property
    def sleep(self) -> Callable[[float], None]:
        """How batch operations wait between attempts."""
        return time.sleep

    @cached_property
    def execution_user(self) -> str:
        """Who the audit rows name: the workspace user on Databricks, the OS user elsewhere."""
        if self.unity_catalog:
            return str(run_sql(self.spark, "SELECT current_user()").collect()[0][0])
        return getpass.getuser()

    def located(self, fqn: str) -> Any:
        """The table ``fqn``, its schema created if missing."""
        name = TableName.parse(fqn)
        self.catalog.ensure_schema(self.spark, name.catalog, name.schema)
        return self.catalog.locate(name)

    @property
    def audit_table(self) -> str:
        raise NotImplementedError

    @property
    def reconciliation_table(self) -> str:
        raise NotImplementedError

    @cached_property
    def audit(self) -> AuditLog:
        return DeltaAuditLog(self.spark, self.located(self.audit_table))

    @cached_property
    def results(self) -> Any:
        """Where reconciliations write their results (:class:`InMemoryReconciliationStore` is the twin)."""
        return DeltaReconciliationStore(self.spark, self.located(self.reconciliation_table))

    def spark_operations(self, run_id: str) -> SparkOperations:
        """Clone, reconcile and metadata on Spark, their reconciliations tagged with ``run_id``."""
        return SparkOperations(self.spark, self.catalog, self.results, unity_catalog=self.unity_catalog,
                               run_id=run_id)

    def incremental_sweep(self, checkpoint_volume: str, namespace: str) -> IncrementalSweep:
        """Incremental sweeps keeping state under ``<checkpoint_volume>/<namespace>/incremental``;
        ``namespace`` is also part of their transaction ids."""
        states = FileStateStore(layout.incremental_dir(checkpoint_volume, namespace))
        return IncrementalSweep(self.spark, self.catalog, states, checkpoint_volume, namespace)

    def batch_runner(self, operations: Operations, run_id: str, max_workers: int,
                     progress: Progress | None = None) -> BatchRunner:
        return BatchRunner(operations, self.audit, run_id=run_id, execution_user=self.execution_user,
                           max_workers=max_workers, progress=progress, clock=self.clock, sleep=self.sleep)


class ReplicateContext(GlobalContext):
    """``lakemirror replicate``: discovery, operations, the audit log and one batch run."""

    def __init__(self, config: ReplicateConfig, out: TextIO | None = None) -> None:
        self.config = config
        self.out = out if out is not None else sys.stdout

    @property
    def runtime(self) -> RuntimeSettings:
        return self.config.runtime

    @property
    def audit_table(self) -> str:
        return self.config.effective_audit_table

    @property
    def reconciliation_table(self) -> str:
        return self.config.effective_reconciliation_table

    @cached_property
    def run_id(self) -> str:
        return uuid.uuid4().hex

    @cached_property
    def discovery(self) -> Discovery:
        return SparkDiscovery(self.spark, self.catalog)

    @cached_property
    def operations(self) -> Operations:
        ops: Operations = self.spark_operations(self.run_id)
        if self.config.checkpoint_volume is not None:
            sweep = self.incremental_sweep(self.config.checkpoint_volume, REPLICATE_NAMESPACE)
            ops = WithIncremental(ops, IncrementalOperations(sweep))
        return disaster_recovery_operations(self, ops, self.config.checkpoint_volume)

    @cached_property
    def progress(self) -> Progress:
        return TextProgress(self.out)

    def plan(self) -> list[TableJob]:
        return plan(self.config, self.discovery, shared_catalogs(self.config))

    def run(self) -> RunSummary:
        with logged_run(self.config.execution_log, self.run_id):
            return run_in_phases(self)


class DaemonContext(GlobalContext):
    """The daemon: one streaming pipeline from the settings (more through the control API), its
    HTTP server and its scheduled sub-tasks."""

    def __init__(self, settings: Settings, config_file: str | None = None) -> None:
        self.settings = settings
        #: The configuration file the settings came from (named in the lease, for a refused daemon).
        self.config_file = config_file

    @property
    def runtime(self) -> RuntimeSettings:
        rt = self.settings.runtime
        if self.python_workers_stop:
            return rt.model_copy(update={"spark_conf": real_time_spark_conf(rt.spark_conf)})
        return rt

    @property
    def python_workers_stop(self) -> bool:
        """Real-Time Mode: its ``foreach`` writers run in Python workers (:mod:`lakemirror.daemon.jvm_stderr`)."""
        return self.settings.source is not None and self.settings.source.real_time is not None

    @property
    def audit_catalog(self) -> str:
        return self.settings.audit_catalog or self.settings.destination_catalog

    @property
    def audit_table(self) -> str:
        return f"{self.audit_catalog}.continuous_sync.audit_log"

    @property
    def reconciliation_table(self) -> str:
        return f"{self.audit_catalog}.continuous_sync.reconciliation"

    # -- the streaming pipeline -----------------------------------------------------------------

    @cached_property
    def spec(self) -> PipelineSpec:
        return pipeline_spec(self.settings)

    @cached_property
    def pipeline_dir(self) -> Path:
        return layout.pipeline_dir(self.settings.checkpoint_volume, self.spec.pipeline_id)

    @cached_property
    def states(self) -> FileStateStore:
        return FileStateStore(self.pipeline_dir)

    @cached_property
    def command_journal(self) -> FileCommandJournal:
        """Where the pipeline's accepted control commands wait for their effect (survives a kill)."""
        return FileCommandJournal(layout.commands_file(self.pipeline_dir))

    @cached_property
    def checkpoints(self) -> CheckpointStore:
        # Over Spark Connect the daemon appends the rows itself (the batch functions on the server no longer
        # do): with delta-rs where it reaches the table, an s3a one with runtime.spark_conf's s3a settings.
        s3a = {k[len("spark.hadoop."):]: v for k, v in self.settings.runtime.spark_conf.items()
               if k.startswith("spark.hadoop.fs.s3a.")}
        store = DeltaCheckpointStore(self.spark, self.located(self.settings.effective_checkpoint_table), hadoop_conf=s3a)
        started = time.monotonic()
        store.ensure()
        log.info("checkpoint table %s ready in %.1fs", store.location.name, time.monotonic() - started)
        return store

    @cached_property
    def recovery_points(self) -> Any:
        """Recovery points across the pipeline's tables (lakemirror.daemon.recovery)."""
        return recovery_points_of(self)

    @cached_property
    def metrics(self) -> Metrics:
        return Metrics(self.spec.pipeline_id)

    @cached_property
    def observer(self) -> Observer:
        """What the supervisors report to: the metrics (``lakemirror run`` on a terminal adds the
        bootstrap's progress bar)."""
        return self.metrics

    @cached_property
    def fault(self) -> Callable[[str], None]:
        """The crash-test hook of the runners (a no-op unless the torture harness arms it)."""
        return crash_points_from_environment()

    @cached_property
    def runner_context(self) -> RunnerContext:
        """What every table runner shares, with the destination's factories of change sources and replicas."""
        d = self.destination
        return RunnerContext(self.spark, self.catalog, self.states, self.checkpoints, self.spec,
                             fault=self.fault, replica_for=d.replica_for, source_for=d.source_for,
                             feed_letters=self.feed_letters if d.feed_letter_store is not None else None)

    @cached_property
    def feed_letters(self) -> FeedLetterDesk:
        """The change-feed tables' dead letters (the destination's store: ``_lakemirror_dead_letters`` in the
        destination schema): counted for status and metrics, listed, skipped and replayed
        (:mod:`lakemirror.supervisor.change_feed.dead_letters`)."""
        from lakemirror.tables import own_session

        make = self.destination.feed_letter_store
        if make is None:
            raise ValueError(f"pipeline {self.spec.pipeline_id} writes {self.destination.letters_elsewhere}")
        desk = FeedLetterDesk(make(), lambda: {name: runner for name, runner in self.supervisor.runners().items()
                                               if isinstance(runner, TableRunner)},
                              lambda: own_session(self.spark), clock=self.clock)
        self.metrics.watch_feed_letters(desk.pending, desk.recorded_counts)
        return desk

    def feed_letter_desk(self) -> FeedLetterDesk | NoFeedLetters:
        """The change-feed routes' desk, or why the pipeline has none (``/api/change-feed/dead-letters``)."""
        if self.settings.source is not None:
            return NoFeedLetters(404, f"pipeline {self.spec.pipeline_id} replicates event source "
                                      f"{self.settings.source.name!r}, not change feeds: its dead letters are at "
                                      f"/api/events/{self.settings.source.name}/dead-letters")
        if self.destination.feed_letter_store is None:
            return NoFeedLetters(409, f"pipeline {self.spec.pipeline_id} writes {self.destination.letters_elsewhere}")
        return self.feed_letters

    @cached_property
    def restart_policy(self) -> RestartPolicy:
        r = self.settings.restart
        return RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, 2.0, r.jitter)

    def all_tables(self) -> list[str]:
        """The pipeline's tables, whatever their destination mode."""
        spec = self.spec
        if spec.tables is not None:
            return [t for t in spec.tables if t not in spec.exclude_tables]
        found = self.catalog.list_tables(self.spark, spec.source_catalog, spec.schema_name)
        return [t.table for t in found if t.table not in spec.exclude_tables]

    def list_tables(self) -> list[str]:
        """The tables the stream replicates: those whose destination mode is continuous (triggered and
        snapshot replicas are kept by the cycles of :attr:`subtasks`)."""
        return [t for t in self.all_tables() if mode_of(self.settings, t) == "continuous"]

    @cached_property
    def supervisor(self) -> Supervisor:
        if self.settings.source is not None:  # an event stream feeds the replicas instead of the change feed
            return self.event_source_supervisor
        spec, s = self.spec, self.settings
        checkpoint_table = self.catalog.locate(TableName.parse(s.effective_checkpoint_table))
        recorded = lambda: {  # noqa: E731 (no Spark: shown while the JVM starts; streamed tables only)
            name: known for name, known in read_pipeline(
                spec, locate=self.catalog.locate, states=FileStateStore(self.pipeline_dir),
                state_dir=layout.state_dir(self.pipeline_dir), checkpoint_table=checkpoint_table).items()
            if mode_of(s, name) == "continuous"}
        return Supervisor(
            runner_factory=lambda table: TableRunner(table, self.runner_context),
            list_tables=self.list_tables, policy=self.restart_policy, observer=self.observer,
            lag_interval_seconds=s.lag_interval_seconds, apply_workers=spec.apply_workers,
            min_turn_interval_seconds=s.effective_turn_interval_seconds,
            # Listed tables too: the discovery loop starts a listed table that failed as missing once it exists.
            discover_interval_seconds=s.discover_interval_seconds, recorded=recorded,
            refresh_recorded=lambda known: refreshed(known, spec, self.catalog.locate),
            journal=self.command_journal, epochs=lambda table: str(self.states.load(spec.source(table).slug).epoch))

    @cached_property
    def destination(self) -> Destination:
        """The pipeline's destination, looked up once by its kind: the factories the runners are handed."""
        return destination_for(self)

    @cached_property
    def event_source_supervisor(self) -> Supervisor:
        """A supervisor with one entry, ``events:<name>``, whose runner is the event source's single
        query; restarts, backoff, drain and metrics are the supervisor's as for any table."""
        source, spec = self.settings.source, self.spec
        if source is None:
            raise ValueError("the settings name no event source")
        stream = event_stream_spec(source, self.settings)
        folder = layout.event_source_dir(layout.pipeline_dir(spec.checkpoint_root, spec.pipeline_id), source.name)
        # A resync sets the query's checkpoint aside: a new checkpoint (a new query id) means it took effect.
        journal, epochs = self.command_journal, lambda _: query_id(layout.event_checkpoint(folder))
        recorded = lambda: {RUNNER_PREFIX + source.name: recorded_entry(  # noqa: E731 (listed while the JVM starts)
            folder, source.name, source.kind, self.states.load(state_slug(source.name)).paused)}

        def runner(_: str) -> Runner:
            events = event_source_for(stream)
            return EventStreamRunner(stream, self.spark, folder, self.destination.event_sink_for(stream, events.decoder),
                                     clock=self.clock, source=events, states=self.states)

        return Supervisor(runner_factory=runner, list_tables=lambda: [RUNNER_PREFIX + source.name],
                          policy=self.restart_policy, observer=self.observer,
                          lag_interval_seconds=self.settings.lag_interval_seconds, apply_workers=0,
                          recorded=recorded, journal=journal, epochs=epochs)

    # -- the scheduled sub-tasks ----------------------------------------------------------------

    @cached_property
    def sweep(self) -> IncrementalSweep:
        """Incremental sweeps of the sub-tasks: state under ``<checkpoint_volume>/<pipeline>/incremental``,
        the pipeline id in their transaction ids."""
        return self.incremental_sweep(self.settings.checkpoint_volume, self.spec.pipeline_id)

    @cached_property
    def _subtask_lock(self) -> threading.Lock:
        return threading.Lock()

    def run_subtask(self, run_id: str, jobs: Sequence[TableJob]) -> SubtaskRun:
        """One sub-task run: its own run id and operations, one table at a time, writing the same
        audit rows as ``lakemirror replicate``."""
        with self._subtask_lock:  # the lazy parts are built once, whichever sub-task runs first
            sweep = self.sweep
            _ = self.audit, self.results, self.execution_user, self.cycles
        ops = self.spark_operations(run_id)
        operations: Operations = WithIncremental(ops, IncrementalOperations(sweep))
        if self.cycles is not None:
            operations = self.cycles.around(operations)
        summary = self.batch_runner(operations, run_id, 1).run(jobs)
        reconciled = {TableName.parse(k).table: v for k, v in ops.latest_results.items()}
        return SubtaskRun(summary, reconciled)

    @cached_property
    def spawn(self) -> Callable[[Callable[[], None], str], threading.Thread]:
        """How sub-task runs get their threads."""
        def daemon_thread(target: Callable[[], None], name: str) -> threading.Thread:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            return thread
        return daemon_thread

    @cached_property
    def cycles(self) -> Cycles | None:
        """The destination's cycles (triggered and snapshot PostgreSQL replicas); None: it has none."""
        make = self.destination.cycles
        return make() if make is not None else None

    def tables_of(self, task: Any) -> Callable[[], list[str]]:
        """The tables a sub-task without its own list takes: the streamed ones, or for a cycle
        sub-task the tables in its mode."""
        mode = cycle_mode(self.settings, task)
        if mode is None:
            return self.list_tables
        return lambda: [t for t in self.all_tables() if mode_of(self.settings, t) == mode]

    @cached_property
    def subtasks(self) -> SubtaskService:
        """The scheduled sub-tasks (``schedules``, and the cycles of triggered and snapshot Postgres
        replicas); Spark-side parts are built on their first run."""
        tasks = [subtask_of(s, self.spec.pipeline_id) for s in self.settings.schedules]
        tasks += destination_subtasks(self.settings)
        tasks += maintenance_subtasks(self.settings)
        return SubtaskService(tasks, jobs=lambda t: jobs_for(t, self.spec, self.tables_of(t)),
                              run=self.run_subtask, observer=self.metrics, clock=self.clock, spawn=self.spawn,
                              on_run=self.cycle_tables.record_run)

    @cached_property
    def cycle_tables(self) -> CycleTables:
        """The triggered and snapshot PostgreSQL replicas, as tables of ``/status``."""
        def waits(table: str) -> ServerWait | None:
            cycles = self.__dict__.get("cycles")  # built by the first cycle run; no wait before it
            return cycles.wait_of(table) if cycles is not None else None

        return cycle_tables(self.settings, self.spec, lambda: self.subtasks.views(), self.states, self.clock, waits)

    def table_views(self) -> list[TableView]:
        """Every table of ``/status``: the streamed ones (the supervisor's), then the cycled ones."""
        return [*self.supervisor.views(), *self.cycle_tables.views()]

    # -- the control API: more pipelines in this daemon, or Databricks jobs ---------------------

    @cached_property
    def pipelines(self) -> PipelineRegistry:
        return PipelineRegistry()

    @cached_property
    def worker(self) -> CommandWorker:
        """The one thread that makes the API's Spark calls (HTTP threads never do)."""
        return CommandWorker()

    @cached_property
    def workspace(self) -> "WorkspaceClient":
        """Databricks mode: the workspace of the job this daemon runs in (ambient authentication)."""
        from databricks.sdk import WorkspaceClient

        return WorkspaceClient()

    @cached_property
    def workspace_as(self) -> Callable[[str, str], "WorkspaceClient"]:
        """Databricks mode: the workspace a request names with X-Databricks-Host / -Token (a PAT;
        nothing read from the environment or a profile; retries bounded below the API timeout)."""
        def connect(host: str, token: str) -> "WorkspaceClient":
            from databricks.sdk import WorkspaceClient
            from databricks.sdk.core import Config

            return WorkspaceClient(config=Config(host=host, token=token, auth_type="pat", retry_timeout_seconds=20,
                                                 http_timeout_seconds=20))
        return connect

    def for_pipeline(self, settings: Settings) -> "DaemonContext":
        """The context of a pipeline posted to the API: its own spec, state and supervisor, this
        daemon's Spark session, catalog and metrics registry (labelled with its id)."""
        child = DaemonContext(settings).replace(spark=self.spark, catalog=self.catalog, fault=self.fault,
                                                clock=self.clock)
        if settings.effective_checkpoint_table == self.settings.effective_checkpoint_table:
            child.replace(checkpoints=self.checkpoints)
        return child.replace(metrics=self.metrics.for_pipeline(child.spec.pipeline_id))

    def start_pipeline(self, settings: Settings) -> PipelineHandle:
        """Build, register and start a pipeline posted to the API. Runs on the worker thread."""
        child = self.for_pipeline(settings)
        child.lease.acquire()  # LeaseHeld: another daemon runs this pipeline (the request's 409)
        try:
            if settings.source is None:
                child.runner_context  # opens its checkpoint table now: a failure is the request's
            handle = PipelineHandle(settings, child.supervisor, "api", on_stopped=child.posted_pipeline_stopped)
            self.pipelines.add(handle)
        except BaseException:
            child.lease.release()
            raise
        child.lease.on_lost = lambda reason: self._stop_lost_pipeline(handle)
        child.lease.start()
        with handle.lock:
            handle.supervisor.start()
        return handle

    def posted_pipeline_stopped(self) -> None:
        """A pipeline posted to the API has stopped: give its lease back and take its series off
        ``/metrics`` (its lag would otherwise go on ageing there)."""
        try:
            self.lease.release()
        finally:
            self.metrics.pipeline_removed()

    def _stop_lost_pipeline(self, handle: PipelineHandle) -> None:
        """A pipeline posted to the API lost its lease: stop it (on the worker) and forget it."""
        def stop() -> None:
            handle.stop(self.settings.drain_timeout_seconds)
            self.pipelines.remove(handle.pipeline_id)
        try:
            self.worker.submit(f"stop pipeline {handle.pipeline_id} (lease lost)", stop)
        except Exception as exc:  # noqa: BLE001 (the daemon is shutting down: it stops anyway)
            log.debug("pipeline %s: %s", handle.pipeline_id, exc)

    def check_cdf(self, catalog: str, schema: str) -> list[cdf_check.Readiness]:
        """Describe every table of ``catalog.schema`` and judge it. Runs on the worker thread."""
        out = []
        declaration: cdf_check.KeyDeclaration = "constraint" if self.unity_catalog else "property"
        for name in self.catalog.list_tables(self.spark, catalog, schema):
            try:
                info = self.catalog.describe(self.spark, name)
            except Exception as exc:  # one unreadable table is a verdict, not a failed request
                out.append(cdf_check.unreadable(str(name), str(exc)))
                continue
            out.append(cdf_check.assess(info, key_declaration=declaration,
                                        retention_warning_seconds=self.settings.retention_warning_seconds))
        return out

    @cached_property
    def api(self) -> ContinuousSyncApi:
        databricks: Callable[[], DatabricksPipelines] | None = None
        databricks_as: Callable[[str, str], DatabricksPipelines] | None = None
        if self.unity_catalog:
            settings = self.settings.databricks

            def databricks() -> DatabricksPipelines:
                return DatabricksPipelines(self.workspace, settings)

            def databricks_as(host: str, token: str) -> DatabricksPipelines:
                return DatabricksPipelines(self.workspace_as(host, token), settings)
        return ContinuousSyncApi(
            mode=self.settings.runtime.mode, registry=self.pipelines, worker=self.worker,
            start_pipeline=self.start_pipeline, cdf_check=self.check_cdf, databricks=databricks,
            recovery_point=lambda at, anchor, only: cut_json(self, at, anchor, only),
            databricks_as=databricks_as,
            default_checkpoint_volume=layout.api_checkpoint_volume(self.settings.checkpoint_volume), daemon=self.settings,
            drain_timeout_seconds=self.settings.drain_timeout_seconds)

    @cached_property
    def server(self) -> ControlServer:
        h = self.settings.http
        info = status_info(self.spec)

        def event_source(name: str) -> EventStreamRunner | None:
            runner = self.supervisor.runner_of(RUNNER_PREFIX + name)
            return runner if isinstance(runner, EventStreamRunner) else None

        letters = DeadLetterApi(event_source, feed=self.feed_letter_desk)
        return ControlServer(h.host, h.port, self.metrics.registry, self.table_views, info,
                             lag_slo_seconds=self.settings.lag_slo_seconds,
                             commands=self.supervisor.command, auth_token=self.http_token, api=self.api,
                             subtasks=self.subtasks.status, allowed_hosts=h.allowed_hosts,
                             dead_letters=letters.handle)

    @cached_property
    def http_token(self) -> str | None:
        """The control API's bearer token: ``http.auth_token``; else, with ``http.auth: token``, one
        generated for this run and written to ``daemon.token`` (:mod:`lakemirror.daemon.http_token`)."""
        h = self.settings.http
        if h.auth_token is not None:
            return h.auth_token.get_secret_value()
        return http_token.generate() if h.auth == "token" else None

    # -- running --------------------------------------------------------------------------------

    @cached_property
    def mode_check(self) -> Callable[[RuntimeSettings], None]:
        """What the runtime mode needs (Java, Delta's jars, a reachable Connect server)."""
        return preflight.check_mode

    @cached_property
    def lease_lost(self) -> threading.Event:
        """Set when the daemon loses its pipeline's lease: the main loop then drains and stops."""
        return threading.Event()

    @cached_property
    def lease(self) -> PipelineLease:
        """The pipeline's lease (:mod:`lakemirror.daemon.lease`): taken before anything starts."""
        return pipeline_lease(self.settings, self.pipeline_dir, config=self.config_file,
                              on_lost=lambda reason: self.lease_lost.set(), clock=self.clock)

    def write_endpoint_file(self) -> None:
        """Tell `lakemirror status` where the running daemon listens (only the lease's holder does)."""
        self.pipeline_dir.mkdir(parents=True, exist_ok=True)
        token_file = None
        if self.settings.http.auth_token is None and self.http_token is not None:
            token_file = str(http_token.write(self.pipeline_dir, self.http_token))
            log.info("control API: its bearer token is in %s (readable by this user only)", token_file)
        tmp = layout.daemon_file_tmp(self.pipeline_dir, os.getpid())
        tmp.write_text(json.dumps({"url": self.server.url, "pid": os.getpid(), "started_at": time.time(),
                                   "token_file": token_file, "lease": self.lease.me.token}))
        os.replace(tmp, layout.daemon_file(self.pipeline_dir))

    def remove_endpoint_file(self) -> None:
        """Remove ``daemon.json`` if it is this daemon's (never another's, whatever happened to the lease)."""
        path = layout.daemon_file(self.pipeline_dir)
        try:
            mine = json.loads(path.read_text()).get("lease") == self.lease.me.token
        except (OSError, ValueError, AttributeError):
            return
        if mine:
            path.unlink(missing_ok=True)
            http_token.remove(self.pipeline_dir)

    def preflight(self) -> None:
        """What the runtime mode needs, checked before anything is bound, written or started:
        raise :class:`StartupError` (one line: the cause and the fix)."""
        self.mode_check(self.settings.runtime)

    def bind(self, port_setting: str | None = None) -> ControlServer:
        """Bind the HTTP port (the first thing that can clash with another process); a failure names
        how to choose another port (``port_setting``; default the ``http.port`` setting)."""
        h = self.settings.http
        try:
            return self.server
        except OSError as exc:
            raise preflight.bind_failure(h.host, h.port, exc, port_setting or preflight.PORT_SETTING) from None

    def start_spark(self) -> None:
        """Start the session and open the checkpoint table if the supervisor's start did not need them
        yet (every table is discovered), so that a Spark that cannot start is a failure to start (one
        line, nothing left behind) rather than a daemon running on without tables."""
        self.checkpoints

    def start_supervisor(self, sup: Supervisor, handle: PipelineHandle) -> None:
        """The supervisor's start (tables known from the records are listed at once, then the runners
        start Spark), then :meth:`start_spark`; a failure of either is a :class:`StartupError`."""
        try:
            with handle.lock:
                sup.start()
            self.start_spark()
        except (LakemirrorError, JarsMissing, JavaMissing):
            raise
        except Exception as exc:
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise preflight.StartupError(f"Spark did not start in {self.settings.runtime.mode} mode: "
                                         f"{redact(first.strip())[:300]}") from exc

    def run(self, stop: threading.Event, on_tick: Callable[[Any], None] | None = None) -> DrainOutcome | None:
        """Run until ``stop`` is set, then drain (:mod:`lakemirror.daemon.drain`) and return what the
        drain finished. Blocks; call from the main thread: the control loop ticks on a thread of its
        own, and the drain returns within ``drain_timeout_seconds`` whatever it waits on.

        Start-up runs cheapest first: the mode's prerequisites, the pipeline's lease (a second
        daemon of the pipeline is refused here, :class:`~lakemirror.checkpoints.lease.LeaseHeld`),
        then the port, and only then are files written and Spark started. A failure at any step
        raises with nothing left behind: no ``daemon.json``, no lease and no folder this start
        created. A daemon that loses its lease while running drains and raises
        :class:`~lakemirror.checkpoints.lease.LeaseLost`."""
        self.preflight()
        created = _missing_ancestor(self.pipeline_dir)
        lease = self.lease
        try:
            lease.acquire()
            server = self.bind()
        except BaseException:
            lease.release()
            _remove_lease_if_released(layout.lease_dir(self.pipeline_dir), created, lease.me.token)
            _remove_if_empty(self.pipeline_dir, created)
            raise
        started = False
        try:
            server.start()
            lease.renew(url=server.url)
            lease.start()
            self.write_endpoint_file()
            log.info("pipeline %s: serving %s/metrics", self.spec.pipeline_id, server.url)
            sup, subtasks = self.supervisor, self.subtasks
            config_pipeline = PipelineHandle(self.settings, sup, "config")
            self.pipelines.add(config_pipeline)
            self.start_supervisor(sup, config_pipeline)
            started = True
        finally:
            if not started:
                self.worker.close(wait=False)
                server.close()
                self.remove_endpoint_file()
                lease.release()
                _remove_lease_if_released(layout.lease_dir(self.pipeline_dir), created, lease.me.token)
                _remove_if_empty(self.pipeline_dir, created)
        control = ControlLoop(self.pipelines, subtasks, lambda: stop.is_set() or self.lease_lost.is_set(),
                               (lambda: on_tick(sup.views())) if on_tick is not None else None)
        try:
            control.wait()
        finally:
            timeout = self.settings.drain_timeout_seconds
            log.info("draining: letting batches in flight finish (up to %.0fs)", timeout)
            outcome = None
            try:
                control.stop()
                self.worker.close(wait=False)
                desk = self.__dict__.get("feed_letters")
                # A dead-letter replay in flight ends after the tables (it is the replicas' write), within the deadline.
                closing = {"the change feed's dead-letter replay": desk.close} if desk is not None else {}
                outcome = drain(self.pipelines, subtasks, timeout, closing)
                log.log(logging.INFO if outcome.complete else logging.WARNING, "%s", outcome.line())
            finally:  # a drain that fails still leaves no endpoint file pointing at a dead daemon
                server.close()
                self.remove_endpoint_file()
                release_lease(lease)
        if lease.lost is not None:
            raise LeaseLost(f"pipeline {self.spec.pipeline_id} stopped: it lost its lease ({lease.lost})")
        control.raise_failure()
        return outcome

    def abandon(self) -> int:
        """The exit guard's clean-up (:class:`~lakemirror.daemon.drain.ExitGuard`), for a daemon still
        running long after its stop was asked for: say where it is stuck, remove ``daemon.json``,
        release the lease, and return the exit code."""
        log.error("pipeline %s: still running %.0fs after the stop was asked for (drain_timeout_seconds %gs): the "
                  "main thread is at %s; exiting without finishing: what did not finish is replayed at the next "
                  "start", self.spec.pipeline_id, self.settings.drain_timeout_seconds + EXIT_GRACE_SECONDS,
                  self.settings.drain_timeout_seconds, where(threading.main_thread()))
        try:
            self.remove_endpoint_file()
        finally:
            release_lease(self.lease, min(LEASE_RELEASE_SECONDS, EXIT_GRACE_SECONDS / 2))
        return EXIT_FAILED if self.lease.lost is not None else EXIT_DRAIN_INCOMPLETE


def _missing_ancestor(path: Path) -> Path | None:
    """The outermost folder of ``path`` (itself included) that does not exist yet, or None."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def _remove_lease_if_released(folder: Path, created: Path | None, token: str) -> None:
    """After a failed first start (the pipeline's folder did not exist before it): the lease this
    daemon took and released (its ``token``), so that the folder can go too. Any other record is
    kept: another daemon that started at the same moment may hold the lease."""
    if created is None or not folder.is_dir():
        return
    for name in os.listdir(folder):
        generation = generation_of(name)
        if generation is None:
            continue
        try:
            record = LeaseRecord.decode(generation, (folder / name).read_bytes())
        except OSError:
            continue
        if record is not None and record.released and record.holder.token == token:
            (folder / name).unlink(missing_ok=True)
    _remove_if_empty(folder, created)


def _remove_if_empty(path: Path, up_to: Path | None) -> None:
    """Remove ``path`` and its parents up to ``up_to`` while they are empty (what a failed start made)."""
    if up_to is None:
        return
    for folder in (path, *path.parents):
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == up_to:
            return
