"""The daemon's scheduled sub-tasks, composed: from the ``schedules`` settings to a running
:class:`~lakemirror.supervisor.subtasks.SubtaskService` on the real operations.

Owned by the composition root (:class:`lakemirror.daemon.app.Application`, which passes the parts
it already built). Each run gets its own run id, its own :class:`SparkOperations` (whose
reconciliations are tagged with that run id) and one ``BatchRunner`` run over the sub-task's
tables, one table at a time, writing the same audit rows as ``lakemirror replicate`` to
``<audit_catalog>.continuous_sync.audit_log`` (reconciliation results to
``….continuous_sync.reconciliation``). Incremental sweeps keep their state and checkpoints under
``<checkpoint_volume>/<pipeline>/incremental`` and use the pipeline id in their transaction ids.
"""

from __future__ import annotations

import getpass
import threading
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lakemirror.checkpoints.audit import AuditLog, DeltaAuditLog
from lakemirror.checkpoints.state import FileStateStore
from lakemirror.daemon.config import Settings
from lakemirror.daemon.schedule_config import ScheduleSettings
from lakemirror.identifiers import TableName
from lakemirror.sinks.reconcile import DeltaReconciliationStore
from lakemirror.sources.catalog import Catalog
from lakemirror.supervisor.batch_ops import SparkOperations
from lakemirror.supervisor.incremental import IncrementalOperations, IncrementalSweep, WithIncremental
from lakemirror.supervisor.replicate import BatchRunner, TableJob, TaskSettings
from lakemirror.supervisor.spec import PipelineSpec
from lakemirror.supervisor.state import RestartPolicy
from lakemirror.supervisor.subtasks import Subtask, SubtaskObserver, SubtaskRun, SubtaskService

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def subtask_of(s: ScheduleSettings, pipeline_id: str) -> Subtask:
    r = s.retry
    settings = TaskSettings(
        operations=tuple(s.operations), timeout_seconds=s.timeout_seconds, max_attempts=r.max_attempts,
        backoff=RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, r.multiplier, r.jitter),
        options={"clone": s.clone.model_dump(), "reconcile": s.reconcile.model_dump(),
                 "metadata": s.metadata.model_dump()},
        config={"pipeline_id": pipeline_id, "schedule": s.model_dump()})
    return Subtask(s.name, s.trigger(), settings, tuple(s.tables) if s.tables is not None else None)


def jobs_for(task: Subtask, spec: PipelineSpec, list_tables: Callable[[], list[str]]) -> list[TableJob]:
    """The sub-task's tables (the pipeline's when it names none), each with the pipeline's key and
    column choice for that table."""
    jobs = []
    for table in task.tables if task.tables is not None else list_tables():
        opts = spec.options_for(table)
        settings = replace(task.settings, keys=opts.keys, options={
            **task.settings.options,
            "incremental": {"include_columns": list(opts.include_columns),
                            "exclude_columns": list(opts.exclude_columns)}})
        jobs.append(TableJob(spec.source(table), spec.destination(table), settings))
    return jobs


class SubtaskComposer:
    """Builds the Spark-side parts lazily, on the first run (a daemon without schedules never does)."""

    def __init__(self, settings: Settings, spec: PipelineSpec, spark: Callable[[], "SparkSession"],
                 catalog: Catalog, list_tables: Callable[[], list[str]], observer: SubtaskObserver,
                 overrides: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.spec = spec
        self._spark = spark
        self.catalog = catalog
        self.list_tables = list_tables
        self.observer = observer
        self.overrides = overrides or {}
        self._lock = threading.Lock()

    @property
    def audit_catalog(self) -> str:
        return self.settings.audit_catalog or self.settings.destination_catalog

    def _table(self, fqn: str) -> Any:
        name = TableName.parse(fqn)
        self.catalog.ensure_schema(self._spark(), name.catalog, name.schema)
        return self.catalog.locate(name)

    @cached_property
    def audit(self) -> AuditLog:
        if "audit" in self.overrides:
            return self.overrides["audit"]  # type: ignore[no-any-return]
        return DeltaAuditLog(self._spark(), self._table(f"{self.audit_catalog}.continuous_sync.audit_log"))

    @cached_property
    def results(self) -> Any:
        if "results" in self.overrides:
            return self.overrides["results"]
        return DeltaReconciliationStore(self._spark(),
                                        self._table(f"{self.audit_catalog}.continuous_sync.reconciliation"))

    @cached_property
    def execution_user(self) -> str:
        if self.settings.runtime.mode == "databricks":
            return str(self._spark().sql("SELECT current_user()").collect()[0][0])
        return getpass.getuser()

    @cached_property
    def sweep(self) -> IncrementalSweep:
        root = Path(self.settings.checkpoint_volume) / self.spec.pipeline_id / "incremental"
        return IncrementalSweep(self._spark(), self.catalog, FileStateStore(root), self.settings.checkpoint_volume,
                                self.spec.pipeline_id)

    def run(self, run_id: str, jobs: Sequence[TableJob]) -> SubtaskRun:
        with self._lock:  # the lazy parts are built once, whichever sub-task runs first
            audit, results, user, sweep = self.audit, self.results, self.execution_user, self.sweep
        ops = SparkOperations(self._spark(), self.catalog, results,
                              unity_catalog=self.settings.runtime.mode == "databricks", run_id=run_id)
        runner = BatchRunner(WithIncremental(ops, IncrementalOperations(sweep)), audit, run_id=run_id,
                             execution_user=user, max_workers=1, **self.overrides.get("runner_kwargs", {}))
        summary = runner.run(jobs)
        reconciled = {TableName.parse(k).table: v for k, v in ops.latest_results.items()}
        return SubtaskRun(summary, reconciled)

    def service(self, **kwargs: Any) -> SubtaskService:
        tasks = [subtask_of(s, self.spec.pipeline_id) for s in self.settings.schedules]
        return SubtaskService(tasks, jobs=lambda t: jobs_for(t, self.spec, self.list_tables), run=self.run,
                              observer=self.observer, **kwargs)
