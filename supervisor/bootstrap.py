"""A table's bootstrap: pin a source version, copy the source as of it, and only then say so.

Crash-safe in three steps, each durable before the next: the new epoch with its pinned version is
saved first, then the replica is replaced by the snapshot at that version (one atomic write), then
the state says the epoch is bootstrapped. A bootstrap killed between the first two steps is redone
at the same pinned version; one killed after the write rewrites the same snapshot. The stream of
the epoch then starts right after the pinned version: no gap, no overlap.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from lakemirror.checkpoints.state import StateStore, TableProgress
from lakemirror.sinks.contract import TableReplica
from lakemirror.sinks.planner import MergePlan
from lakemirror.sources.contract import ChangeSource
from lakemirror.supervisor import state as sm

log = logging.getLogger(__name__)

#: A position past any table's head: asks the source for its latest version only.
HEAD_ONLY = 1 << 62


@dataclass(frozen=True)
class Bootstrap:
    """Bootstraps one table's replica from its source (see the module docstring)."""

    source: ChangeSource[Any]
    replica: TableReplica[Any]
    states: StateStore
    slug: str
    label: str
    destination: str
    fault: Callable[[str], None]
    emit: Callable[[sm.Event], None]

    def run(self, progress: TableProgress, table_id: str | None, plan: MergePlan,
            source_properties: Mapping[str, str]) -> TableProgress:
        """Bootstrap the epoch ``progress`` names, or a new one; the progress it leaves saved."""
        self.replica.claim(progress.epoch)
        self.emit(sm.BootstrapStarted())
        if progress.bootstrap_version is None or progress.epoch == 0:
            head = self.source.head(HEAD_ONLY, window=1)
            progress = progress.next_epoch(head.latest_version, table_id)
            self.states.save(self.slug, progress)
        version = progress.bootstrap_version
        assert version is not None
        self.fault("bootstrap_before_snapshot")
        self.replica.bootstrap(plan, self.source.snapshot(version), version, progress.epoch, source_properties)
        self.fault("bootstrap_after_snapshot")
        progress = replace(progress, bootstrapped=True)
        self.states.save(self.slug, progress)
        log.info("table %s: bootstrapped %s at source version %d (epoch %d)",
                 self.label, self.destination, version, progress.epoch)
        return progress
