"""`lakemirror status` when no daemon answers: the pipeline's records, read without Spark.

The answer has the shape of the daemon's ``/status`` (:func:`lakemirror.daemon.status.status_info`,
``tables`` with the fields of :class:`~lakemirror.supervisor.control.loop.TableView`, ``subtasks``),
whether or not a daemon runs, so a script reads one shape. Nothing here starts a JVM: a pipeline
that never ran lists its configured tables as ``not started``; the records are the state files,
the checkpoint table (delta-rs), each replica's transaction record and each source's commit files
(:mod:`lakemirror.supervisor.offline.recorded_tables`), and an event source's own record
(:mod:`lakemirror.supervisor.events.status_record`). Where those are not on this machine (Unity Catalog,
a checkpoint table on object storage), :func:`offline_status` answers None and the caller reads the
checkpoint table through Spark.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.state import FileStateStore
from lakemirror.daemon.settings.runtime_spec import pipeline_spec
from lakemirror.daemon.status import status_info
from lakemirror.identifiers import TableName
from lakemirror.sources.catalog import LocalCatalog
from lakemirror.supervisor.control.loop import TableView
from lakemirror.supervisor.events.status_record import recorded_entry, state_slug
from lakemirror.supervisor.offline.recorded_tables import RecordedTable, read_pipeline
from lakemirror.tables import local_dir


def offline_state(t: RecordedTable) -> str:
    return ("paused" if t.paused else "degraded" if t.degraded else "stopped" if t.started else "not started")


def offline_view(t: RecordedTable, now: float) -> TableView:
    """A recorded table as ``/status`` shows a table, in the state it was left."""
    return TableView(table=t.table, state=offline_state(t), lag_seconds=t.lag_seconds(now),
                     versions_behind=t.versions_behind, applied_through=t.applied_through,
                     rows_applied=t.rows_applied, batches=t.batches, failures=0, retries=0, next_retry_at=None,
                     last_error=t.last_error, last_batch_at=t.last_batch_at, detail=t.detail)


def payload(settings: Any, views: list[TableView]) -> dict[str, Any]:
    """``/status``'s shape for ``views``."""
    return {**status_info(pipeline_spec(settings)), "tables": [asdict(v) for v in views], "subtasks": []}


def offline_status(settings: Any, now: float | None = None) -> dict[str, Any] | None:
    """The pipeline's status from its records, or None when they are not on this machine."""
    now = time.time() if now is None else now
    spec = pipeline_spec(settings)
    folder = layout.pipeline_dir(settings.checkpoint_volume, spec.pipeline_id)
    states = FileStateStore(folder)
    source = settings.source
    if source is not None:
        entry = recorded_entry(layout.event_source_dir(folder, source.name), source.name, source.kind,
                               states.load(state_slug(source.name)).paused)
        return payload(settings, [offline_view(entry, now)])
    if settings.runtime.mode == "databricks" and folder.exists():
        return None  # the checkpoint table is in Unity Catalog: only Spark reads it
    catalog = LocalCatalog(settings.runtime.warehouse)
    checkpoint_table = catalog.locate(TableName.parse(settings.effective_checkpoint_table))
    local = checkpoint_table.path is not None and local_dir(checkpoint_table.path) is not None
    if not local and folder.exists():
        return None  # a pipeline that ran, its checkpoint rows on object storage
    recorded = read_pipeline(spec, locate=catalog.locate, states=states, state_dir=layout.state_dir(folder),
                             checkpoint_table=checkpoint_table)
    return payload(settings, [offline_view(t, now) for t in recorded.values()])
