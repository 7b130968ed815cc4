"""The driver path's read of a batch: delta-rs when the stream's offsets show whole versions.

A table's query plans each batch between two offsets it writes to its checkpoint before calling
the batch function. :class:`BatchFeed` turns those into the source versions the batch holds
(:func:`lakemirror.delta_log.stream_offsets.batch_versions`) and reads their change rows with delta-rs
(:class:`lakemirror.sources.driver_feed.DriverFeed`), from a source on the driver's file system or
in S3 (through the session's s3a settings). Where that cannot be told exactly (a version a rate
limit split, a commit delta-rs might read differently, a checkpoint off the driver's file system),
the reader answers None and the driver path reads the batch with Spark as before. Each batch is decided alone, from Spark's own offsets, so a batch read one way never
changes what the next one reads.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

from lakemirror.checkpoints import stream_dir
from lakemirror.delta_log.commit_files import commit_actions_for
from lakemirror.delta_log.stream_offsets import SourceOffset, batch_versions
from lakemirror.sinks.accelerator.driver_apply import ChangeReader
from lakemirror.sources.driver_feed import DriverFeed, FeedTooLarge, FeedUnfit
from lakemirror.tables import TableLocation, is_local_path, is_local_table, local_dir

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


class BatchFeed:
    """Reads the batches of one table's query (checkpoint ``checkpoint``) from its source at
    ``source_path`` (a local path, or a delta-rs URI with its storage ``options``)."""

    def __init__(self, checkpoint: str, source_path: str, after_version: int, table: str,
                 options: dict[str, str] | None = None) -> None:
        self.checkpoint = checkpoint
        self.after_version = after_version
        self.table = table
        self.commits = commit_actions_for(source_path, options)
        self.feed = DriverFeed(source_path, options)
        self._unfit: str | None = None  # why the source was last found unfit (logged once per reason)
        #: Batches read here, and batches left to Spark's read (for status and tests).
        self.read_by_delta_rs = 0
        self.read_by_spark = 0

    @classmethod
    def for_stream(cls, checkpoint: str, source: TableLocation, after_version: int,
                   remote: "tuple[str, dict[str, str]] | None" = None) -> "BatchFeed | None":
        """None when the source is neither a table on the driver's file system nor one delta-rs reaches
        in S3 (``remote``: its URI and storage options), the checkpoint is not local, or delta-rs is missing."""
        import importlib.util

        if not is_local_path(checkpoint) or importlib.util.find_spec("deltalake") is None:
            return None
        if remote is not None and remote[1]:
            return cls(checkpoint, remote[0], after_version, str(source), remote[1])
        folder = local_dir(source.path) if source.path is not None else None
        if folder is None or not is_local_table(str(folder)):
            return None
        return cls(checkpoint, str(folder), after_version, str(source))

    def reader(self, batch_id: int) -> ChangeReader:
        """The reader of batch ``batch_id``'s change rows."""
        return lambda columns, max_rows: self.read(batch_id, columns, max_rows)

    def read(self, batch_id: int, columns: Sequence[str], max_rows: int) -> "pa.Table | None":
        """Batch ``batch_id``'s change rows, preimages left out; None: leave the read to Spark."""
        rows = self._read(batch_id, columns, max_rows)
        if rows is None:
            self.read_by_spark += 1
        else:
            self.read_by_delta_rs += 1
        return rows

    def _read(self, batch_id: int, columns: Sequence[str], max_rows: int) -> "pa.Table | None":
        offsets = stream_dir.batch_offsets(self.checkpoint, batch_id)
        if offsets is None:
            log.debug("%s: batch %d: its offsets cannot be read; Spark reads it", self.table, batch_id)
            return None
        try:
            start = SourceOffset.parse(offsets[0]) if offsets[0] is not None else None
            end = SourceOffset.parse(offsets[1])
            versions = batch_versions(start, end, self.after_version, self.commits.shape)
        except (KeyError, ValueError, TypeError) as exc:
            log.debug("%s: batch %d: an offset it cannot place (%s); Spark reads it", self.table, batch_id, exc)
            return None
        if isinstance(versions, str):
            log.debug("%s: batch %d: %s; Spark reads it", self.table, batch_id, versions)
            return None
        try:
            return self.feed.read(versions, columns, max_rows, end.table_id)
        except FeedTooLarge:
            return None
        except FeedUnfit as exc:
            if str(exc) != self._unfit:
                log.info("%s: batches are read by Spark, not delta-rs: %s", self.table, exc)
            self._unfit = str(exc)
            return None
        except Exception as exc:  # noqa: BLE001 (any failure of the fast read: Spark's read is exact)
            log.warning("%s: delta-rs could not read batch %d (versions %d-%d): %s; Spark reads it",
                        self.table, batch_id, versions.first, versions.last, exc)
            return None
