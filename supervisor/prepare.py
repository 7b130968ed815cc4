"""A table's preparation before its stream starts: key, merge plan, checks, bootstrap, schema.

:meth:`Preparation.run` describes the source, chooses its key (:func:`~lakemirror.sources.keys.choose_key`)
and plans the merge (:func:`~lakemirror.sinks.merge.planner.plan_merge`), refuses a source without a
change feed or one dropped and recreated since the replica's epoch began, bootstraps the replica
when its epoch is not bootstrapped yet (:mod:`.bootstrap`), and lets the replica follow the
source's columns. What it found comes back as :class:`Prepared`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from lakemirror.checkpoints.state import StateStore, TableProgress
from lakemirror.errors import LakemirrorError, SourceReplaced
from lakemirror.sinks.contract import TableReplica
from lakemirror.sinks.merge.planner import ColumnSelection, MergePlan, plan_merge
from lakemirror.sources.contract import ChangeSource
from lakemirror.sources.keys import KeyChoice, choose_key
from lakemirror.sources.retention import RetentionWindow
from lakemirror.supervisor.bootstrap import Bootstrap
from lakemirror.supervisor.spec import TableOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    key: KeyChoice
    plan: MergePlan
    progress: TableProgress
    retention: RetentionWindow = RetentionWindow()


@dataclass(frozen=True)
class Preparation:
    """Prepares one table (see the module docstring)."""

    source: ChangeSource[Any]
    replica: TableReplica[Any]
    states: StateStore
    slug: str
    label: str
    options: TableOptions
    allow_schema_evolution: bool
    bootstrap: Bootstrap
    fault: Callable[[str], None]

    def run(self) -> Prepared:
        info = self.source.describe()
        opts = self.options
        key = choose_key(self.label, info.columns, configured=opts.keys, declared=info.declared_key)
        plan = plan_merge(info.columns, key.columns, ColumnSelection(opts.include_columns, opts.exclude_columns))
        if not info.cdf_enabled:
            raise LakemirrorError(
                f"{self.label}: Change Data Feed is not enabled. Run: ALTER TABLE {info.location.sql} "
                f"SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')", table=self.label,
                code="cdf_disabled")
        progress = self.states.load(self.slug)
        if progress.source_table_id and info.table_id and progress.source_table_id != info.table_id:
            raise SourceReplaced(
                f"{self.label}: the source was dropped and recreated (table id {progress.source_table_id} "
                f"is now {info.table_id}); the replica no longer follows it. Resync the table.",
                table=self.label)
        if not progress.bootstrapped:
            progress = self.bootstrap.run(progress, info.table_id, plan, info.properties)
        if self.replica.prepare(plan, self.allow_schema_evolution):
            self.fault("schema_change")
        log.info("table %s: key %s", self.label, key.describe())
        return Prepared(key, plan, progress, RetentionWindow.from_properties(info.properties))
