"""A table's preparation before its stream starts: key, merge plan, checks, bootstrap, schema.

:meth:`Preparation.run` describes the source, chooses its key (:func:`~lakemirror.sources.keys.choose_key`)
and plans the merge (:func:`~lakemirror.sinks.merge.planner.plan_merge`), refuses a source without a
change feed or one dropped and recreated since the replica's epoch began, bootstraps the replica
when its epoch is not bootstrapped yet (:mod:`.bootstrap`), and lets the replica follow the
source's columns. What it found comes back as :class:`Prepared`.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

from lakemirror.checkpoints.state import StateStore, TableProgress
from lakemirror.errors import SourceReplaced
from lakemirror.schema import Column
from lakemirror.sinks.contract import TableReplica
from lakemirror.sinks.merge.planner import ColumnSelection, MergePlan, plan_merge
from lakemirror.sources.catalog import TableInfo
from lakemirror.sources.feed_required import ChangeFeedSource as ChangeFeedSource
from lakemirror.sources.feed_required import require_change_feed as require_change_feed
from lakemirror.sources.contract import ChangeSource
from lakemirror.sources.keys import KeyChoice, choose_key
from lakemirror.sources.retention import RetentionWindow
from lakemirror.supervisor.change_feed.bootstrap import Bootstrap
from lakemirror.supervisor.control.pipeline_spec import TableOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    key: KeyChoice
    plan: MergePlan
    progress: TableProgress
    retention: RetentionWindow = RetentionWindow()
    #: The source's columns as the launch described them (the plan's own may be a selection of them).
    source_columns: tuple[Column, ...] = ()


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
    #: ``enable_change_data_feed``: turn a source's change data feed on instead of refusing it.
    enable_change_feed: bool = False
    #: Called with each step's name as it ends (``describe``, ``bootstrap``, ``replica``): the launch's timing.
    mark: Callable[[str], None] = lambda step: None
    #: How the source is described (default: :meth:`~lakemirror.sources.contract.ChangeSource.describe`;
    #: the runner's reuses what an earlier launch read while it still holds, :mod:`.source_description`).
    describe: Callable[[], TableInfo] | None = None
    #: Wraps the bootstrap: the runner gives its launch slot back while the snapshot is copied.
    while_bootstrapping: Callable[[], ContextManager[None]] = nullcontext

    def run(self) -> Prepared:
        info = self.describe() if self.describe is not None else self.source.describe()
        self.mark("describe")
        opts = self.options
        key = choose_key(self.label, info.columns, configured=opts.keys, declared=info.declared_key)
        selection = ColumnSelection(opts.include_columns, opts.exclude_columns)
        plan = plan_merge(info.columns, key.columns, selection)
        info = require_change_feed(self.source, info, self.label, enable=self.enable_change_feed)
        progress = self.states.load(self.slug)
        if progress.source_table_id and info.table_id and progress.source_table_id != info.table_id:
            raise SourceReplaced(
                f"{self.label}: the source was dropped and recreated (table id {progress.source_table_id} "
                f"is now {info.table_id}); the replica no longer follows it. Resync the table.",
                table=self.label)
        if not progress.bootstrapped:
            with self.while_bootstrapping():
                progress = self.bootstrap.run(progress, info.table_id, plan, info.properties, selection)
            self.mark("bootstrap")
        if self.replica.prepare(plan, self.allow_schema_evolution):
            self.fault("schema_change")
        self.mark("replica")
        log.info("table %s: key %s", self.label, key.describe())
        return Prepared(key, plan, progress, RetentionWindow.from_properties(info.properties), tuple(info.columns))
