"""A table's bootstrap: pin a source version, copy the source as of it, and only then say so.

Crash-safe in three steps, each durable before the next: the new epoch with its pinned version is
saved first, then the replica is replaced by the snapshot at that version (one atomic write), then
the state says the epoch is bootstrapped. A bootstrap killed between the first two steps is redone
at the same pinned version; one killed after the write rewrites the same snapshot. The stream of
the epoch then starts right after the pinned version: no gap, no overlap.

The copy writes the columns the launch planned from its description of the source. A column added
after that description and before the copy's last read (between the description and the pin, or
while a chunked copy runs) would reach the replica without its copied values, so the source is
described again once the copy is done: a column the plan would now copy and did not makes the epoch
pin anew and the table relaunch (:class:`~lakemirror.errors.SchemaChangeRestart`), which plans it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Protocol

from lakemirror.checkpoints.state import StateStore, TableProgress
from lakemirror.errors import PinnedVersionAged, SchemaChangeRestart
from lakemirror.sinks.contract import TableReplica
from lakemirror.sinks.merge.planner import ColumnSelection, MergePlan
from lakemirror.sources.catalog import TableInfo
from lakemirror.sources.contract import ChangeSource
from lakemirror.sources.retention import time_travel_refused
from lakemirror.supervisor.control import table_state as sm

log = logging.getLogger(__name__)

#: A position past any table's head: asks the source for its latest version only.
HEAD_ONLY = 1 << 62
#: How often a bootstrap pins the source anew when Delta refuses to read the pinned version.
REPINS = 2


class SnapshotCopier(Protocol):
    """Copies the snapshot at a pinned version in steps of its own (a chunked bootstrap,
    :mod:`lakemirror.sinks.batch.chunked_bootstrap`) instead of the replica's one-shot copy."""

    def copy(self, plan: MergePlan, version: int, epoch: int, source_properties: Mapping[str, str]) -> int:
        """Copy the snapshot at ``version``; the version the replica holds when done (``version``,
        or later when changes were applied between steps)."""
        ...

    def finish(self) -> None:
        """Clean up once the table is saved as bootstrapped."""
        ...


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
    #: None: the replica's own one-shot snapshot copy.
    copier: SnapshotCopier | None = None
    #: How the source is described after the copy (default: :meth:`ChangeSource.describe`; the
    #: runner's reads the source's log for a metadata change since the launch's description).
    describe: Callable[[], TableInfo] | None = None

    def run(self, progress: TableProgress, table_id: str | None, plan: MergePlan,
            source_properties: Mapping[str, str], selection: ColumnSelection = ColumnSelection()) -> TableProgress:
        """Bootstrap the epoch ``progress`` names, or a new one; the progress it leaves saved.

        A pinned version Delta refuses to read before anything was written (it is no longer the
        source's latest, and its commit is older than the source's deleted-file retention: a
        table idle for longer than that, written to just after the pin) is pinned anew, at most
        ``REPINS`` times: nothing of the refused epoch reached the replica. (A chunked copy reads
        the source's latest version and is not refused so; it pins anew when its saved plan is
        one it cannot resume, :class:`~lakemirror.errors.BootstrapPlanOutdated`.)"""
        self.replica.claim(progress.epoch)
        self.emit(sm.BootstrapStarted())
        repin = progress.bootstrap_version is None or progress.epoch == 0
        for attempt in range(REPINS + 1):
            if repin:
                head = self.source.head(HEAD_ONLY, window=1)
                progress = progress.next_epoch(head.latest_version, table_id)
                self.states.save(self.slug, progress)
            version = progress.bootstrap_version
            assert version is not None
            self.fault("bootstrap_before_snapshot")
            try:
                through = self._copy(plan, progress, version, source_properties)
                break
            except PinnedVersionAged as exc:
                if attempt == REPINS:
                    raise (exc.__cause__ or exc) from None
                log.warning("%s; pinning the source's latest version instead", exc)
                repin = True
        self._require_copied_columns(progress, plan, selection)
        self.fault("bootstrap_after_snapshot")
        # The stream starts after ``through``: the snapshot's version, or the last change applied
        # between a chunked copy's chunks.
        progress = replace(progress, bootstrapped=True, bootstrap_version=through)
        self.states.save(self.slug, progress)
        if self.copier is not None:
            self.copier.finish()
        log.info("table %s: bootstrapped %s at source version %d (epoch %d; snapshot at %d)",
                 self.label, self.destination, through, progress.epoch, version)
        return progress

    def _require_copied_columns(self, progress: TableProgress, plan: MergePlan, selection: ColumnSelection) -> None:
        """Pin anew and relaunch the table when a plan made now would copy columns ``plan`` did
        not (see the module docstring). A column added after the copy's reads costs a copy more
        than it needs; none is ever left without its values."""
        info = self.describe() if self.describe is not None else self.source.describe()
        try:
            missed = [c.name for c in selection.apply(info.columns, plan.keys) if c.name not in plan.column_names]
            change = f"added {', '.join(missed)}" if missed else None
        except ValueError as exc:  # a column the selection names is gone: the relaunch says so
            change = str(exc)
        if change is None:
            return
        self.states.save(self.slug, replace(progress, bootstrap_version=None))
        if self.copier is not None:
            self.copier.finish()
        raise SchemaChangeRestart(f"{self.label}: the source's columns changed while its snapshot was copied "
                                  f"({change}); copying it again at a new version", table=self.label)

    def _copy(self, plan: MergePlan, progress: TableProgress, version: int,
              source_properties: Mapping[str, str]) -> int:
        """Copy the snapshot at ``version``; the version the replica then holds."""
        if self.copier is not None:
            return self.copier.copy(plan, version, progress.epoch, source_properties)
        try:
            self.replica.bootstrap(plan, self.source.snapshot(version), version, progress.epoch, source_properties)
        except Exception as exc:
            if time_travel_refused(exc):  # refused while planning the read: nothing was written
                raise PinnedVersionAged(self.label, version) from exc
            raise
        return version
