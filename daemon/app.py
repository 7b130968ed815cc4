"""The composition root: builds every component from :class:`Settings`, once.

Factories are cached properties; tests replace parts with ``Application.replace(**parts)``
instead of patching modules.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lakemirror import __version__
from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
from lakemirror.checkpoints.state import FileStateStore
from lakemirror.daemon.api import ContinuousSyncApi
from lakemirror.daemon.config import Settings
from lakemirror.daemon.databricks_pipelines import DatabricksPipelines
from lakemirror.daemon.destination_config import PostgresDestination
from lakemirror.daemon.event_source_app import event_source_supervisor
from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.pipelines import PipelineHandle, PipelineRegistry
from lakemirror.daemon.subtask_app import SubtaskComposer
from lakemirror.daemon.worker import CommandWorker
from lakemirror.daemon import preflight
from lakemirror.daemon.jars import JarsMissing
from lakemirror.daemon.spark import JavaMissing
from lakemirror.errors import ConfigError, LakemirrorError
from lakemirror.secrets import redact
from lakemirror.identifiers import TableName
from lakemirror.sinks.choose import choose_sink
from lakemirror.sinks.postgres.executor import Connector
from lakemirror.sources.catalog import Catalog, LocalCatalog, UnityCatalog
from lakemirror.supervisor import cdf_check
from lakemirror.supervisor.recorded import read_pipeline
from lakemirror.supervisor.runner import FAULT_POINTS, RunnerContext, TableRunner
from lakemirror.supervisor.spec import PipelineSpec, TableOptions
from lakemirror.supervisor.state import RestartPolicy
from lakemirror.supervisor.subtasks import SubtaskService
from lakemirror.supervisor.supervisor import Supervisor

if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def pipeline_spec(s: Settings) -> PipelineSpec:
    return PipelineSpec(
        pipeline_id=s.effective_pipeline_id, source_catalog=s.source_catalog,
        destination_catalog=s.destination_catalog, schema_name=s.schema_name,
        destination_schema=s.destination_schema or s.schema_name,
        checkpoint_root=s.checkpoint_volume,
        tables=tuple(s.tables) if s.tables is not None else None,
        exclude_tables=tuple(s.exclude_tables),
        options={t: TableOptions(tuple(o.keys), tuple(o.include_columns), tuple(o.exclude_columns))
                 for t, o in s.table_overrides.items()},
        trigger_interval_seconds=s.trigger_interval_seconds, apply_workers=s.apply_workers,
        allow_schema_evolution=s.allow_schema_evolution,
        max_files_per_trigger=s.max_files_per_trigger, max_bytes_per_trigger=s.max_bytes_per_trigger,
        replica_properties=dict(s.replica_properties),
        change_window_policy=s.change_window_policy, retention_warning_seconds=s.retention_warning_seconds,
        rewrite_below_bytes=s.rewrite_below_bytes, driver_apply=s.driver_apply,
        driver_apply_below_bytes=s.driver_apply_below_bytes, kernel_change_feed=s.kernel_change_feed,
        bootstrap=s.bootstrap.policy())


def postgres_connector(s: Settings) -> Connector | None:
    """The connections of a pipeline whose replicas are in Postgres (shared by its tables), else None."""
    d = s.destination
    choice = choose_sink(d.kind, d.target() if isinstance(d, PostgresDestination) else None)
    log.info("pipeline %s: %s", s.effective_pipeline_id, choice.reason)
    return Connector(choice.postgres) if choice.postgres is not None else None


#: The torture harness (tests/torture) names crash points here, e.g. ``after_merge`` or
#: ``after_merge:3`` (the third time the point is reached); never set in production.
KILL_AT_ENV = "LAKEMIRROR_TEST_KILL_AT"


def crash_points_from_environment() -> Callable[[str], None]:
    """A fault hook that SIGKILLs this process at the armed point, or a no-op when none is armed."""
    armed = os.environ.get(KILL_AT_ENV, "").strip()
    if not armed:
        return lambda point: None
    name, _, nth = armed.partition(":")
    if name not in FAULT_POINTS:
        raise ConfigError([(KILL_AT_ENV, f"unknown crash point {name!r}; known: {', '.join(FAULT_POINTS)}")])
    remaining = [int(nth or 1)]

    def fault(point: str) -> None:
        if point == name:
            remaining[0] -= 1
            if remaining[0] <= 0:
                os.kill(os.getpid(), signal.SIGKILL)
    return fault


@dataclass
class Application:
    settings: Settings
    overrides: dict[str, Any] = field(default_factory=dict)

    def replace(self, **parts: Any) -> "Application":
        return Application(self.settings, {**self.overrides, **parts})

    def _get(self, name: str, build: Any) -> Any:
        return self.overrides[name] if name in self.overrides else build()

    @cached_property
    def spark(self) -> "SparkSession":
        from lakemirror.daemon.spark import create_session

        return self._get("spark", lambda: create_session(self.settings.runtime))  # type: ignore[no-any-return]

    @cached_property
    def spec(self) -> PipelineSpec:
        return self._get("spec", lambda: pipeline_spec(self.settings))  # type: ignore[no-any-return]

    @cached_property
    def catalog(self) -> Catalog:
        def build() -> Catalog:
            if self.settings.runtime.mode == "databricks":
                return UnityCatalog()
            return LocalCatalog(self.settings.runtime.warehouse)

        return self._get("catalog", build)  # type: ignore[no-any-return]

    @cached_property
    def pipeline_dir(self) -> Path:
        return Path(self.settings.checkpoint_volume) / self.spec.pipeline_id

    @cached_property
    def states(self) -> FileStateStore:
        return self._get("states", lambda: FileStateStore(self.pipeline_dir))  # type: ignore[no-any-return]

    @cached_property
    def checkpoints(self) -> DeltaCheckpointStore:
        def build() -> DeltaCheckpointStore:
            name = TableName.parse(self.settings.effective_checkpoint_table)
            store = DeltaCheckpointStore(self.spark, self.catalog.locate(name))
            self.catalog.ensure_schema(self.spark, name.catalog, name.schema)
            store.ensure()
            return store

        return self._get("checkpoints", build)  # type: ignore[no-any-return]

    @cached_property
    def metrics(self) -> Metrics:
        return self._get("metrics", lambda: Metrics(self.spec.pipeline_id))  # type: ignore[no-any-return]

    @cached_property
    def runner_context(self) -> RunnerContext:
        return RunnerContext(self.spark, self.catalog, self.states, self.checkpoints, self.spec,
                             fault=crash_points_from_environment(), postgres=postgres_connector(self.settings))

    def list_tables(self, spec: PipelineSpec | None = None) -> list[str]:
        spec = spec or self.spec
        if spec.tables is not None:
            return [t for t in spec.tables if t not in spec.exclude_tables]
        found = self.catalog.list_tables(self.spark, spec.source_catalog, spec.schema_name)
        return [t.table for t in found if t.table not in spec.exclude_tables]

    def _supervisor_for(self, settings: Settings, spec: PipelineSpec, ctx: Callable[[], RunnerContext],
                        metrics: Metrics) -> Supervisor:
        if settings.source is not None:  # an event stream feeds the replicas instead of the change feed
            return event_source_supervisor(settings, spec, lambda: self.spark, self.catalog, metrics)
        r = settings.restart
        checkpoint_table = self.catalog.locate(TableName.parse(settings.effective_checkpoint_table))
        pipeline_dir = Path(settings.checkpoint_volume) / spec.pipeline_id
        recorded = lambda: read_pipeline(  # noqa: E731 (no Spark: shown while the JVM starts)
            spec, locate=self.catalog.locate, states=FileStateStore(pipeline_dir), state_dir=pipeline_dir / "state",
            checkpoint_table=checkpoint_table)
        return Supervisor(
            runner_factory=lambda table: TableRunner(table, ctx()),
            list_tables=lambda: self.list_tables(spec),
            policy=RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, 2.0, r.jitter),
            observer=metrics, lag_interval_seconds=settings.lag_interval_seconds,
            apply_workers=spec.apply_workers, min_turn_interval_seconds=spec.trigger_interval_seconds,
            # Listed tables too: the discovery loop starts a listed table that failed as missing once it exists.
            discover_interval_seconds=settings.discover_interval_seconds, recorded=recorded)

    @cached_property
    def supervisor(self) -> Supervisor:
        return self._get("supervisor", lambda: self._supervisor_for(  # type: ignore[no-any-return]
            self.settings, self.spec, lambda: self.runner_context, self.metrics))

    # -- the control API: more pipelines in this daemon, or Databricks jobs ---------------------

    @cached_property
    def pipelines(self) -> PipelineRegistry:
        return self._get("pipelines", PipelineRegistry)  # type: ignore[no-any-return]

    @cached_property
    def worker(self) -> CommandWorker:
        """The one thread that makes the API's Spark calls (HTTP threads never do)."""
        return self._get("worker", CommandWorker)  # type: ignore[no-any-return]

    @cached_property
    def workspace(self) -> "WorkspaceClient":
        """Databricks mode: the workspace of the job this daemon runs in (ambient authentication)."""
        def build() -> "WorkspaceClient":
            from databricks.sdk import WorkspaceClient

            return WorkspaceClient()
        return self._get("workspace", build)  # type: ignore[no-any-return]

    def start_pipeline(self, settings: Settings) -> PipelineHandle:
        """Build, register and start a pipeline posted to the API. Runs on the worker thread."""
        spec = pipeline_spec(settings)
        if settings.effective_checkpoint_table == self.settings.effective_checkpoint_table:
            checkpoints = self.checkpoints
        else:
            name = TableName.parse(settings.effective_checkpoint_table)
            checkpoints = DeltaCheckpointStore(self.spark, self.catalog.locate(name))
            self.catalog.ensure_schema(self.spark, name.catalog, name.schema)
            checkpoints.ensure()
        states = FileStateStore(Path(settings.checkpoint_volume) / spec.pipeline_id)
        ctx = RunnerContext(self.spark, self.catalog, states, checkpoints, spec,
                            fault=crash_points_from_environment(), postgres=postgres_connector(settings))
        # The same collectors, labelled with this pipeline's id (one registry per process).
        metrics = copy.copy(self.metrics)
        metrics.pipeline = spec.pipeline_id
        handle = PipelineHandle(settings, self._supervisor_for(settings, spec, lambda: ctx, metrics), "api")
        self.pipelines.add(handle)
        with handle.lock:
            handle.supervisor.start()
        return handle

    def check_cdf(self, catalog: str, schema: str) -> list[cdf_check.Readiness]:
        """Describe every table of ``catalog.schema`` and judge it. Runs on the worker thread."""
        out = []
        declaration: cdf_check.KeyDeclaration = "constraint" if self.settings.runtime.mode == "databricks" \
            else "property"
        for name in self.catalog.list_tables(self.spark, catalog, schema):
            try:
                info = self.catalog.describe(self.spark, name)
            except Exception as exc:  # one unreadable table is a verdict, not a failed request
                out.append(cdf_check.unreadable(str(name), str(exc)))
                continue
            out.append(cdf_check.assess(info, key_declaration=declaration,
                                        retention_warning_seconds=self.settings.retention_warning_seconds))
        return out

    def workspace_as(self, host: str, token: str) -> "WorkspaceClient":
        """Databricks mode: the workspace a request names with X-Databricks-Host / -Token (a PAT;
        nothing read from the environment or a profile; retries bounded below the API timeout)."""
        from databricks.sdk import WorkspaceClient
        from databricks.sdk.core import Config

        return WorkspaceClient(config=Config(host=host, token=token, auth_type="pat", retry_timeout_seconds=20,
                                             http_timeout_seconds=20))

    @cached_property
    def api(self) -> ContinuousSyncApi:
        databricks = databricks_as = None
        if self.settings.runtime.mode == "databricks":
            databricks = lambda: DatabricksPipelines(self.workspace, self.settings.databricks)  # noqa: E731
            databricks_as = lambda host, token: DatabricksPipelines(  # noqa: E731
                self._get("workspace_as", lambda: self.workspace_as)(host, token), self.settings.databricks)
        return self._get("api", lambda: ContinuousSyncApi(  # type: ignore[no-any-return]
            mode=self.settings.runtime.mode, registry=self.pipelines, worker=self.worker,
            start_pipeline=self.start_pipeline, cdf_check=self.check_cdf, databricks=databricks,
            databricks_as=databricks_as,
            default_checkpoint_volume=self.settings.checkpoint_volume.rstrip("/") + "/api",
            drain_timeout_seconds=self.settings.drain_timeout_seconds))

    @cached_property
    def subtasks(self) -> SubtaskService:
        """The scheduled sub-tasks (``schedules``); runs them on worker threads of their own."""
        def build() -> SubtaskService:
            composer = SubtaskComposer(self.settings, self.spec, lambda: self.spark, self.catalog, self.list_tables,
                                       self.metrics, self._get("subtask_parts", dict))
            return composer.service()

        return self._get("subtasks", build)  # type: ignore[no-any-return]

    @cached_property
    def server(self) -> ControlServer:
        h = self.settings.http
        info = {"pipeline_id": self.spec.pipeline_id, "version": __version__,
                "source": f"{self.spec.source_catalog}.{self.spec.schema_name}",
                "destination": f"{self.spec.destination_catalog}.{self.spec.destination_schema}"}
        token = h.auth_token.get_secret_value() if h.auth_token is not None else None
        return ControlServer(h.host, h.port, self.metrics.registry, self.supervisor.views, info,
                             lag_slo_seconds=self.settings.lag_slo_seconds,
                             commands=self.supervisor.command, auth_token=token, api=self.api,
                             subtasks=self.subtasks.status)

    # -- running --------------------------------------------------------------------------------

    def write_endpoint_file(self) -> None:
        """Tell `lakemirror status` where the running daemon listens."""
        self.pipeline_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.pipeline_dir / ".daemon.json.tmp"
        tmp.write_text(json.dumps({"url": self.server.url, "pid": os.getpid(), "started_at": time.time()}))
        os.replace(tmp, self.pipeline_dir / "daemon.json")

    def preflight(self) -> None:
        """What the runtime mode needs, checked before anything is bound, written or started:
        raise :class:`StartupError` (one line: the cause and the fix)."""
        check = self._get("preflight", lambda: preflight.check_mode)
        check(self.settings.runtime)

    def bind(self) -> ControlServer:
        """Bind the HTTP port (the first thing that can clash with another process)."""
        h = self.settings.http
        try:
            return self.server
        except OSError as exc:
            raise preflight.bind_failure(h.host, h.port, exc) from None

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

    def run(self, stop: threading.Event, on_tick: Any = None) -> None:
        """Run until ``stop`` is set, then drain. Blocks; call from the main thread.

        Start-up runs cheapest first: the mode's prerequisites, then the port, and only then are
        files written and Spark started. A failure at any step raises with nothing left behind:
        no ``daemon.json`` and no folder this start created."""
        self.preflight()
        server = self.bind()
        created = _missing_ancestor(self.pipeline_dir)
        started = False
        try:
            server.start()
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
                (self.pipeline_dir / "daemon.json").unlink(missing_ok=True)
                _remove_if_empty(self.pipeline_dir, created)
        try:
            while not stop.is_set():
                self.pipelines.tick_all()
                subtasks.tick()  # starts due sub-tasks on their own threads; never blocks
                if on_tick is not None:
                    on_tick(sup.views())
                stop.wait(0.5)
        finally:
            log.info("draining: letting batches in flight finish (up to %.0fs)", self.settings.drain_timeout_seconds)
            deadline = time.monotonic() + self.settings.drain_timeout_seconds
            self.worker.close(wait=False)
            self.pipelines.shutdown_all(self.settings.drain_timeout_seconds)
            subtasks.shutdown(max(0.0, deadline - time.monotonic()))
            server.close()
            (self.pipeline_dir / "daemon.json").unlink(missing_ok=True)


def _missing_ancestor(path: Path) -> Path | None:
    """The outermost folder of ``path`` (itself included) that does not exist yet, or None."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


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
