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
from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.pipelines import PipelineHandle, PipelineRegistry
from lakemirror.daemon.subtask_app import SubtaskComposer
from lakemirror.daemon.worker import CommandWorker
from lakemirror.errors import ConfigError
from lakemirror.identifiers import TableName
from lakemirror.sources.catalog import Catalog, LocalCatalog, UnityCatalog
from lakemirror.supervisor import cdf_check
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
                             fault=crash_points_from_environment())

    def list_tables(self, spec: PipelineSpec | None = None) -> list[str]:
        spec = spec or self.spec
        if spec.tables is not None:
            return [t for t in spec.tables if t not in spec.exclude_tables]
        found = self.catalog.list_tables(self.spark, spec.source_catalog, spec.schema_name)
        return [t.table for t in found if t.table not in spec.exclude_tables]

    def _supervisor_for(self, settings: Settings, spec: PipelineSpec, ctx: Callable[[], RunnerContext],
                        metrics: Metrics) -> Supervisor:
        r = settings.restart
        return Supervisor(
            runner_factory=lambda table: TableRunner(table, ctx()),
            list_tables=lambda: self.list_tables(spec),
            policy=RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, 2.0, r.jitter),
            observer=metrics, lag_interval_seconds=settings.lag_interval_seconds,
            apply_workers=spec.apply_workers, min_turn_interval_seconds=spec.trigger_interval_seconds,
            discover_interval_seconds=settings.discover_interval_seconds if spec.tables is None else None)

    @cached_property
    def supervisor(self) -> Supervisor:
        return self._supervisor_for(self.settings, self.spec, lambda: self.runner_context, self.metrics)

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
                            fault=crash_points_from_environment())
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

    @cached_property
    def api(self) -> ContinuousSyncApi:
        databricks = None
        if self.settings.runtime.mode == "databricks":
            databricks = lambda: DatabricksPipelines(self.workspace, self.settings.databricks)  # noqa: E731
        return self._get("api", lambda: ContinuousSyncApi(  # type: ignore[no-any-return]
            mode=self.settings.runtime.mode, registry=self.pipelines, worker=self.worker,
            start_pipeline=self.start_pipeline, cdf_check=self.check_cdf, databricks=databricks,
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

    def run(self, stop: threading.Event, on_tick: Any = None) -> None:
        """Run until ``stop`` is set, then drain. Blocks; call from the main thread."""
        self.server.start()
        self.write_endpoint_file()
        log.info("pipeline %s: serving %s/metrics", self.spec.pipeline_id, self.server.url)
        sup, subtasks = self.supervisor, self.subtasks
        config_pipeline = PipelineHandle(self.settings, sup, "config")
        self.pipelines.add(config_pipeline)
        with config_pipeline.lock:
            sup.start()
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
            self.server.close()
            (self.pipeline_dir / "daemon.json").unlink(missing_ok=True)
