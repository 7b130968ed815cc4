"""What a pipeline's own records say about its tables, read without Spark.

The state files (epochs, pauses), the checkpoint rows, each replica's transaction record
(:mod:`lakemirror.supervisor.offline.replica_transactions`) and each source's commit files together tell, for
every table the pipeline knows, the last source version applied, how far the source has moved
since, and when the oldest version not yet applied was committed. A starting daemon shows this at
once (state ``starting``), long before its JVM is up; `lakemirror status` shows it when no daemon
runs. Lag is priced like the running daemon's (:mod:`lakemirror.supervisor.control.lag`): 0 when every
source commit is applied, else now minus the commit time of the oldest unapplied version; a
stopped, caught-up table has no lag, however long ago it stopped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import unquote

from lakemirror.checkpoints.offline import TableSummary, known_slugs
from lakemirror.checkpoints.state import StateStore
from lakemirror.delta_log.commit_times import LocalCommitLog
from lakemirror.delta_log.layout import LOG_DIR, newest_commit
from lakemirror.identifiers import TableName
from lakemirror.sinks.txn import txn_app_id
from lakemirror.supervisor.control.lag import LagReading
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec
from lakemirror.supervisor.offline import replica_transactions
from lakemirror.tables import TableLocation, local_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordedTable:
    table: str
    applied_through: int | None         # the last source version the replica holds
    latest_version: int | None          # the source's newest version
    oldest_unapplied_at: float | None   # commit time of applied_through + 1 (None: caught up or unknown)
    batches: int = 0
    rows_applied: int = 0
    last_batch_at: float | None = None
    last_error: str | None = None
    degraded: bool = False
    paused: bool = False
    started: bool = True                # False: configured, but the pipeline never started it
    counted_through: int | None = None  # the last batch of the current epoch with a checkpoint row
    detail: dict[str, Any] | None = None  # a runner's own status as recorded (an event source's replicas)

    @property
    def versions_behind(self) -> int | None:
        if self.applied_through is None or self.latest_version is None:
            return None
        return max(0, self.latest_version - self.applied_through)

    def lag_seconds(self, now: float) -> float | None:
        behind = self.versions_behind
        if behind is None:
            return None
        if behind == 0:
            return 0.0
        return None if self.oldest_unapplied_at is None else max(0.0, now - self.oldest_unapplied_at)

    def reading(self, now: float) -> LagReading | None:
        lag = self.lag_seconds(now)
        if lag is None or self.applied_through is None or self.latest_version is None:
            return None
        behind = self.versions_behind or 0
        return LagReading(lag, behind, self.latest_version, self.applied_through,
                          oldest_unapplied_at=self.oldest_unapplied_at if behind else None)


def table_of_slug(slug: str) -> str | None:
    parts = slug.split("__")
    return unquote(parts[2]) if len(parts) == 3 else None


def source_position(loc: TableLocation, applied_through: int | None) -> tuple[int | None, float | None]:
    """The source's newest version, and the commit time of the oldest version after
    ``applied_through`` (the oldest still in the log when that one was cleaned up)."""
    commits = LocalCommitLog.for_table(loc)
    folder = local_dir(loc.path) if loc.path is not None else None
    if commits is None or folder is None:
        return None, None
    latest = newest_commit(folder / LOG_DIR)
    if latest is None or applied_through is None or latest <= applied_through:
        return latest, None
    for version in range(applied_through + 1, latest + 1):
        at = commits.commit_time(version)
        if at is not None:
            return latest, at
    return latest, None


def read_recorded(spec: PipelineSpec, *, locate: Callable[[TableName], TableLocation], states: StateStore,
                  state_dir: str | Path, summaries: Mapping[str, TableSummary] | None) -> dict[str, RecordedTable]:
    """Every table the pipeline knows (listed in the config, or with a state file), as recorded. A
    table the config lists is there even if nothing about it is recorded yet (``started`` False: a
    first start, or a first bootstrap killed before it saved anything), and even if its records
    cannot be read: a configured table is never missing from status."""
    listed = spec.tables is not None
    if spec.tables is not None:
        names = [t for t in spec.tables if t not in spec.exclude_tables]
    else:
        names = sorted({t for s in known_slugs(state_dir) if (t := table_of_slug(s)) is not None}
                       - set(spec.exclude_tables))
    out: dict[str, RecordedTable] = {}
    for table in names:
        try:
            known = _read_table(spec, table, locate=locate, states=states, summaries=summaries)
        except Exception as exc:  # noqa: BLE001 (one unreadable table must not hide the others)
            log.info("table %s: cannot read what the pipeline recorded: %s", spec.source(table), exc)
            known = RecordedTable(table, None, None, None)
        if known is not None:
            out[table] = known
        elif listed:
            out[table] = RecordedTable(table, None, None, None, started=False)
    return out


def _read_table(spec: PipelineSpec, table: str, *, locate: Callable[[TableName], TableLocation], states: StateStore,
                summaries: Mapping[str, TableSummary] | None) -> RecordedTable | None:
    source = spec.source(table)
    progress = states.load(source.slug)
    summary = (summaries or {}).get(str(source))
    if progress.epoch == 0 and summary is None:
        return None  # never started: nothing recorded
    try:
        record = replica_transactions.read_record(
            progress, checkpoint_root=spec.checkpoint_root, pipeline_id=spec.pipeline_id,
            table_slug=source.slug, replica_path=locate(spec.destination(table)).path,
            source_path=locate(source).path)
    except Exception as exc:  # noqa: BLE001 (the checkpoint rows remain)
        log.info("table %s: cannot read the replica's transaction record: %s", source, exc)
        record = None
    applied = record.applied_through if record is not None else None
    if applied is None and summary is not None:
        applied = summary.latest.last_committed_version
    latest, oldest = source_position(locate(source), applied)
    last = summary.last_batch if summary is not None else None
    newest = summary.latest if summary is not None else None
    epoch_app = txn_app_id(spec.pipeline_id, source.slug, progress.epoch)
    return RecordedTable(
        table=table, applied_through=applied, latest_version=latest, oldest_unapplied_at=oldest,
        batches=summary.batches if summary else 0, rows_applied=summary.rows_applied if summary else 0,
        last_batch_at=last.ended_at.timestamp() if last is not None else None,
        last_error=newest.error if newest is not None and newest.degraded else None,
        degraded=bool(newest is not None and newest.degraded), paused=progress.paused,
        counted_through=last.batch_id if last is not None and last.txn_app_id == epoch_app else None)


def refreshed(known: RecordedTable, spec: PipelineSpec, locate: Callable[[TableName], TableLocation]) -> RecordedTable:
    """``known`` with the source's newest version and the commit time of its oldest unapplied one
    read again (the source moves on while a table is starting): commit files only, no Spark."""
    latest, oldest = source_position(locate(spec.source(known.table)), known.applied_through)
    if latest is None:
        return known
    return replace(known, latest_version=latest, oldest_unapplied_at=oldest)


def read_pipeline(spec: PipelineSpec, *, locate: Callable[[TableName], TableLocation], states: StateStore,
                  state_dir: str | Path, checkpoint_table: TableLocation) -> dict[str, RecordedTable]:
    """:func:`read_recorded` with the checkpoint rows read by delta-rs (none where it cannot)."""
    from lakemirror.checkpoints.offline import read_rows, summarize

    try:
        rows = read_rows(checkpoint_table.path, spec.pipeline_id)
    except Exception as exc:  # noqa: BLE001 (the replicas' own records remain)
        log.info("cannot read the checkpoint table %s without Spark: %s", checkpoint_table.name, exc)
        rows = None
    return read_recorded(spec, locate=locate, states=states, state_dir=state_dir,
                         summaries=summarize(rows) if rows is not None else None)
