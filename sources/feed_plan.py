"""The next batch of a table's change feed, planned from its source's commit files instead of by
Delta's streaming source. Pure: no Spark, no delta-rs, no file access.

Delta's ``DeltaSource`` builds two snapshots of the source for every batch with data (its latest
offset, then the batch's plan), each a state reconstruction with Spark jobs on a source without
``.crc`` files, and on object storage a listing of its log besides. A batch of a few whole versions
of a plain source needs none of it: its commits say which change files hold its rows. So the table's
next batch is planned here, from the offsets Spark (or the daemon) logged for the batch before it:

- the batch after the last one logged starts where that one ended, and holds every version up to
  the source's latest, if there are at most ``window`` of them and each is *plain* (a whole version
  whose change rows delta-rs reads as Spark does: no metadata or protocol change, so no schema
  change in the range; no deletion vectors without change files; no MERGE that changed no row;
  :func:`lakemirror.delta_log.stream_offsets.version_shape`);
- a batch logged and never committed (a stop between its offsets and its commit) is re-run with the
  same offsets, if they cover whole plain versions.

Anything else is planned by Spark (:attr:`FeedPlan.spark` says why): the epoch's first batch (Spark
starts the checkpoint), a previous batch that ended inside a version (a rate limit), a range of more
than ``window`` versions (a backlog: Spark splits it by its admission limits), a commit that is not
plain, or a source whose table id is not the one the offsets name. The end offset of a planned batch
is Delta's own (:func:`~lakemirror.delta_log.stream_offsets.end_offset`: ``reservoirVersion`` one
past the last version, index -1: before its first file), so
Spark's next plan continues from it; the batch id, and so the Delta transaction id, is the next of
the query's, as Spark's would be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from lakemirror.delta_log.stream_offsets import (BASE_INDEX, SourceOffset, VersionRange, VersionShape, batch_versions,
                                                 end_offset)


@dataclass(frozen=True)
class FeedBatch:
    """A batch the daemon applies from the source's commit files."""

    batch_id: int
    versions: VersionRange
    #: The end offset to log for it (None: already logged, the batch is re-run with it).
    end_offset: dict[str, Any] | None

    @property
    def rerun(self) -> bool:
        return self.end_offset is None


@dataclass(frozen=True)
class FeedPlan:
    """The table's next batch: one the daemon applies (``batch``), or the reason Spark plans it
    (``spark``); neither when the source has nothing new."""

    batch: FeedBatch | None = None
    spark: str | None = None


def plan_feed_batch(*, latest_offsets: int | None, latest_commit: int | None,
                    offset_of: Callable[[int], str | None], latest_version: int, after_version: int,
                    table_id: str, shape: Callable[[int], VersionShape | None], window: int) -> FeedPlan:
    """The table's next batch (see the module docstring).

    ``latest_offsets`` / ``latest_commit``: the newest batch ids of the checkpoint's offset and commit
    logs; ``offset_of``: a logged batch's source end offset; ``latest_version``: the source's newest
    version; ``after_version``: the version the epoch's stream starts after; ``table_id``: the
    source's table id now; ``shape``: a version's shape from its commit file (None: unreadable)."""
    if latest_offsets is None:
        return FeedPlan(spark="the epoch's first batch is planned by Spark (it starts the stream's checkpoint)")
    if latest_commit is None or latest_commit < latest_offsets:
        return _rerun(latest_offsets, latest_commit, offset_of, after_version, table_id, shape)
    previous = _offset(offset_of, latest_offsets)
    if isinstance(previous, str):
        return FeedPlan(spark=previous)
    if previous.table_id is not None and previous.table_id != table_id:
        return FeedPlan(spark=f"the source's table id is now {table_id}, not {previous.table_id}")
    if previous.starting:
        return FeedPlan(spark="the previous batch read an initial snapshot")
    if previous.index == BASE_INDEX:
        first = previous.version
    else:
        found = shape(previous.version)
        if found is None or found.files is None:
            return FeedPlan(spark=f"the commit file of version {previous.version} cannot be read or counted")
        if previous.index != found.files - 1:
            return FeedPlan(spark=f"the previous batch ended inside version {previous.version}")
        first = previous.version + 1
    first = max(first, after_version + 1)
    if latest_version < first:
        return FeedPlan()
    count = latest_version - first + 1
    if count > window:
        return FeedPlan(spark=f"{count} versions to apply, more than {window}: Spark splits them")
    for version in range(first, latest_version + 1):
        found = shape(version)
        if found is None:
            return FeedPlan(spark=f"the commit file of version {version} cannot be read")
        if found.unfit is not None:
            return FeedPlan(spark=f"version {version}: {found.unfit}")
    return FeedPlan(batch=FeedBatch(latest_offsets + 1, VersionRange(first, latest_version),
                                    end_offset(table_id, latest_version)))


def _offset(offset_of: Callable[[int], str | None], batch_id: int) -> SourceOffset | str:
    text = offset_of(batch_id)
    if text is None:
        return f"the offsets of batch {batch_id} cannot be read"
    try:
        return SourceOffset.parse(text)
    except (KeyError, ValueError, TypeError):
        return f"the offsets of batch {batch_id} are not Delta's streaming source's"


def _rerun(batch_id: int, latest_commit: int | None, offset_of: Callable[[int], str | None], after_version: int,
           table_id: str, shape: Callable[[int], VersionShape | None]) -> FeedPlan:
    """The batch logged and never committed, re-run with its own offsets when they are whole plain versions."""
    if (latest_commit if latest_commit is not None else -1) != batch_id - 1:
        return FeedPlan(spark=f"the checkpoint's commit log ends at {latest_commit}, its offsets at {batch_id}")
    end = _offset(offset_of, batch_id)
    if isinstance(end, str):
        return FeedPlan(spark=end)
    if end.table_id is not None and end.table_id != table_id:
        return FeedPlan(spark=f"the source's table id is now {table_id}, not {end.table_id}")
    start: SourceOffset | None = None
    if batch_id > 0:
        found = _offset(offset_of, batch_id - 1)
        if isinstance(found, str):
            return FeedPlan(spark=found)
        start = found
    versions = batch_versions(start, end, after_version, shape)
    if isinstance(versions, str):
        return FeedPlan(spark=f"batch {batch_id}, logged before a stop: {versions}")
    return FeedPlan(batch=FeedBatch(batch_id, versions, None))
