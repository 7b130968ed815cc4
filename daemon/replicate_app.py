"""The composition root of ``lakemirror replicate``: builds discovery, operations, the audit log
and the batch runner from a :class:`ReplicateConfig`, once. Tests pass replacements for any part
(``ReplicateApp(cfg, spark=…, audit=InMemoryAuditLog(), …)``) instead of patching modules."""

from __future__ import annotations

import getpass
import logging
import sys
import uuid
from pathlib import Path
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TextIO

from lakemirror.checkpoints.audit import AuditLog, DeltaAuditLog
from lakemirror.checkpoints.state import FileStateStore
from lakemirror.daemon.replicate_config import CatalogEntry, ReplicateConfig
from lakemirror.identifiers import TableName
from lakemirror.sinks.reconcile import DeltaReconciliationStore
from lakemirror.sources.catalog import Catalog, LocalCatalog, UnityCatalog
from lakemirror.supervisor.batch_ops import SparkDiscovery, SparkOperations
from lakemirror.supervisor.incremental import IncrementalOperations, IncrementalSweep, WithIncremental
from lakemirror.supervisor.replicate import (
    BatchRunner, CatalogSelection, Discovery, Operations, RunSummary, SchemaSelection, TableJob, TaskSettings,
    TextProgress, plan_work,
)
from lakemirror.supervisor.state import RestartPolicy

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Where ``lakemirror replicate`` keeps incremental sweeps under ``checkpoint_volume`` (a daemon
#: uses its pipeline id instead), and part of their transaction ids.
REPLICATE_NAMESPACE = "replicate"


def selections(cfg: ReplicateConfig) -> list[CatalogSelection]:
    return [CatalogSelection(
        source=c.name, target=c.target_catalog,
        include_schemas=tuple(c.include_schemas) if c.include_schemas is not None else None,
        exclude_schemas=tuple(c.exclude_schemas),
        schemas={s.name: SchemaSelection(s.target_schema,
                                         tuple(s.include_tables) if s.include_tables is not None else None,
                                         tuple(s.exclude_tables)) for s in c.schemas},
    ) for c in cfg.selected_catalogs()]


def task_settings(cfg: ReplicateConfig, catalog: CatalogEntry | None, schema: str, table: str) -> TaskSettings:
    """Resolve one table's settings through the hierarchy (see :mod:`replicate_config`)."""
    s_entry = next((s for s in catalog.schemas if s.name == schema), None) if catalog else None
    t_entry = next((t for t in s_entry.tables if t.name == table), None) if s_entry else None
    s = cfg.resolve(catalog, s_entry, t_entry)
    r = s.retry
    return TaskSettings(
        operations=tuple(s.operations), timeout_seconds=s.timeout_seconds, keys=tuple(s.keys),
        max_attempts=r.max_attempts,
        backoff=RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, r.multiplier, r.jitter),
        options={"clone": s.clone.model_dump(), "reconcile": s.reconcile.model_dump(),
                 "metadata": s.metadata.model_dump()},
        config={"runtime": cfg.runtime.model_dump(), **s.model_dump()})


def plan(cfg: ReplicateConfig, discovery: Discovery) -> list[TableJob]:
    entries = {(c.name, c.target_catalog): c for c in cfg.catalogs}
    return plan_work(selections(cfg), discovery,
                     lambda sel, schema, table: task_settings(cfg, entries[(sel.source, sel.target)], schema, table),
                     only_schemas=cfg.cli.target_schemas)


@dataclass
class ReplicateApp:
    config: ReplicateConfig
    overrides: dict[str, Any] = field(default_factory=dict)
    out: TextIO = sys.stdout

    def _get(self, name: str, build: Any) -> Any:
        return self.overrides[name] if name in self.overrides else build()

    @cached_property
    def run_id(self) -> str:
        return self._get("run_id", lambda: uuid.uuid4().hex)  # type: ignore[no-any-return]

    @cached_property
    def spark(self) -> "SparkSession":
        from lakemirror.daemon.spark import create_session

        return self._get("spark", lambda: create_session(self.config.runtime))  # type: ignore[no-any-return]

    @property
    def unity_catalog(self) -> bool:
        return self.config.runtime.mode == "databricks"

    @cached_property
    def catalog(self) -> Catalog:
        return self._get("catalog", lambda: UnityCatalog() if self.unity_catalog  # type: ignore[no-any-return]
                         else LocalCatalog(self.config.runtime.warehouse))

    def _table(self, fqn: str) -> Any:
        name = TableName.parse(fqn)
        self.catalog.ensure_schema(self.spark, name.catalog, name.schema)
        return self.catalog.locate(name)

    @cached_property
    def audit(self) -> AuditLog:
        return self._get("audit", lambda: DeltaAuditLog(self.spark, self._table(self.config.effective_audit_table)))  # type: ignore[no-any-return]

    @cached_property
    def results(self) -> Any:
        return self._get("results", lambda: DeltaReconciliationStore(
            self.spark, self._table(self.config.effective_reconciliation_table)))

    @cached_property
    def discovery(self) -> Discovery:
        return self._get("discovery", lambda: SparkDiscovery(self.spark, self.catalog))  # type: ignore[no-any-return]

    @cached_property
    def operations(self) -> Operations:
        def build() -> Operations:
            ops: Operations = SparkOperations(self.spark, self.catalog, self.results,
                                              unity_catalog=self.unity_catalog, run_id=self.run_id)
            if self.config.checkpoint_volume is None:
                return ops
            states = FileStateStore(Path(self.config.checkpoint_volume) / REPLICATE_NAMESPACE / "incremental")
            sweep = IncrementalSweep(self.spark, self.catalog, states, self.config.checkpoint_volume,
                                     REPLICATE_NAMESPACE)
            return WithIncremental(ops, IncrementalOperations(sweep))

        return self._get("operations", build)  # type: ignore[no-any-return]

    @cached_property
    def execution_user(self) -> str:
        def build() -> str:
            if self.unity_catalog:
                return str(self.spark.sql("SELECT current_user()").collect()[0][0])
            return getpass.getuser()
        return self._get("execution_user", build)  # type: ignore[no-any-return]

    def plan(self) -> list[TableJob]:
        return plan(self.config, self.discovery)

    def run(self) -> RunSummary:
        jobs = self.plan()
        log.info("replicate run %s: %d tables", self.run_id, len(jobs))
        runner = BatchRunner(self.operations, self.audit, run_id=self.run_id, execution_user=self.execution_user,
                             max_workers=self.config.max_workers,
                             progress=self._get("progress", lambda: TextProgress(self.out)),
                             **self._get("runner_kwargs", dict))
        return runner.run(jobs)
