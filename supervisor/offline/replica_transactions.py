"""What a replica itself records about the batches applied to it: read without Spark.

Every batch is committed to the replica under a Delta transaction id (``txn`` action: the
table's app id of the epoch, and the batch id as its version). The replica's log therefore says
which batch of the current epoch was applied last, even when the daemon died before Spark
committed that batch to its stream checkpoint. The stream checkpoint's ``offsets/<batch>`` file
says which source versions that batch covered: every version below its end offset's
``reservoirVersion`` (:func:`lakemirror.delta_log.stream_offsets.applied_through_from_offset`). Together
they give the last source version the replica holds, which is what a table reports as applied from
the moment the daemon starts, whatever its state, instead of its epoch's bootstrap version.

A batch the replica's log already records needs nothing from the source: a restart that replays
it (Spark had not committed it) skips it without reading its change files, which may have been
vacuumed since (:func:`replayed_outcome`).

Read with delta-rs and plain file reads, for replicas on the driver's file system or, given their
storage options, on S3 (:func:`lakemirror.object_store.delta_rs_target`), and checkpoints on the
driver's file system; elsewhere the record is unknown (None) and the runner learns the applied
version from its stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

from lakemirror.checkpoints import layout
from lakemirror.checkpoints import stream_dir
from lakemirror.checkpoints.state import TableProgress
from lakemirror.delta_log.commit_files import LocalCommitActions, StoreCommitActions
from lakemirror.delta_log.stream_offsets import (applied_through_from_offset, reservoir_version,
                                                 touched_through_from_offset)
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import BatchStats, MergeOutcome, txn_app_id
from lakemirror.tables import is_local_table, local_dir

log = logging.getLogger(__name__)

#: ``MergeOutcome.read`` / ``.write`` of a replayed batch skipped before anything was read.
READ_NOTHING, WRITE_NOTHING = "none", "replay-skipped"


stream_checkpoint = layout.stream_checkpoint  # the stream checkpoint folder of a table's epoch


def replica_txn_version(replica_path: str | None, app_id: str,
                        storage_options: Mapping[str, str] | None = None) -> int | None:
    """The last batch of ``app_id`` the replica's log records; None when it records none, or the
    replica is neither a Delta table on the driver's file system nor reached through
    ``storage_options`` (its delta-rs URI, such as ``s3://…``): then it cannot be told here."""
    if replica_path is None:
        return None
    from deltalake import DeltaTable

    if storage_options is None:
        if not is_local_table(replica_path):
            return None
        folder = local_dir(replica_path)
        version = DeltaTable(str(folder)).transaction_version(app_id)
    else:
        from deltalake.exceptions import TableNotFoundError

        try:
            version = DeltaTable(replica_path, storage_options=dict(storage_options) or None).transaction_version(app_id)
        except TableNotFoundError:
            return None
    return None if version is None else int(version)


def remote_target(spark: Any, path: str | None) -> "tuple[str, dict[str, str]] | None":
    """How delta-rs reads the table at ``path`` when it is on S3 (its URI and storage options, from
    the session's s3a settings); None for any other location."""
    from lakemirror.object_store import delta_rs_reader, is_s3a

    if path is None or not is_s3a(path):
        return None
    return delta_rs_reader(spark, path)


def applied_through_after_batch(checkpoint: str, batch_id: int, source_path: str | None = None,
                                source_target: "tuple[str, dict[str, str]] | None" = None) -> int | None:
    """The last source version fully applied once batch ``batch_id`` of ``checkpoint`` is applied
    (from the end offset Spark logged for the batch before running it, and, for a source on the
    driver's file system or one delta-rs reads in S3 (``source_target``: its URI and storage
    options), the number of files of the offset's version)."""
    folder = local_dir(checkpoint)
    if folder is None:
        return None
    try:
        offset = stream_dir.source_offset((folder / "offsets" / str(batch_id)).read_text(encoding="utf-8"))
        files = None
        source_dir = local_dir(source_path) if source_path is not None and is_local_table(source_path) else None
        version = reservoir_version(offset)
        if version is not None:
            shape = (LocalCommitActions(str(source_dir)).shape(version) if source_dir is not None else
                     StoreCommitActions(*source_target).shape(version) if source_target is not None else None)
            files = shape.files if shape is not None else None
        return applied_through_from_offset(offset, files)
    except (OSError, UnicodeDecodeError, KeyError, ValueError, TypeError):
        return None


def touched_through(checkpoint: str) -> int | None:
    """The newest source version any of whose changes the replica holds by the stream checkpoint's
    last committed batch: its end offset's version when the offset stands inside that version (a rate
    limit split it: some of its changes are applied), else the version before it. None when the
    checkpoint is not on the driver's file system or holds no committed batch.

    :func:`~lakemirror.delta_log.stream_offsets.applied_through_from_offset` answers the version fully
    applied, for lag; a dead letter's replay needs this one, so as never to write a key's state
    older than a change the replica already holds."""
    folder = local_dir(checkpoint)
    if folder is None:
        return None
    try:
        done = [int(p.name) for p in (folder / "commits").iterdir() if p.name.isdigit()]
        if not done:
            return None
        offset = stream_dir.source_offset((folder / "offsets" / str(max(done))).read_text(encoding="utf-8"))
        return touched_through_from_offset(offset)
    except (OSError, UnicodeDecodeError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class ReplicaRecord:
    """What the replica's own log records of the table's current epoch."""

    app_id: str
    txn_version: int | None        # the last batch of the epoch in the replica (None: none yet)
    applied_through: int | None    # the last source version the replica holds (None: unknown)

    def holds(self, batch_id: int) -> bool:
        """Whether the replica holds batch ``batch_id`` of the epoch (it, or a later batch, is committed)."""
        return self.txn_version is not None and batch_id <= self.txn_version

    def through_after(self, batch_id: int) -> int | None:
        """The last source version the replica holds once batch ``batch_id`` is applied: known for the
        last batch it records (None for an earlier one, or when unknown)."""
        return self.applied_through if batch_id == self.txn_version else None


def read_record(progress: TableProgress, *, checkpoint_root: str, pipeline_id: str, table_slug: str,
                replica_path: str | None, source_path: str | None = None,
                replica_target: "tuple[str, dict[str, str]] | None" = None,
                source_target: "tuple[str, dict[str, str]] | None" = None) -> ReplicaRecord | None:
    """The replica's record for the table's current epoch; None when it cannot be read here.
    ``replica_target`` / ``source_target``: how delta-rs reaches a replica or a source that is not on
    the driver's file system (its URI and storage options)."""
    if not progress.bootstrapped or progress.bootstrap_version is None:
        return None
    app_id = txn_app_id(pipeline_id, table_slug, progress.epoch)
    if replica_target is not None and replica_target[1]:
        txn = replica_txn_version(replica_target[0], app_id, replica_target[1])
    elif replica_path is None or not is_local_table(replica_path):
        return None
    else:
        txn = replica_txn_version(replica_path, app_id)
    if txn is None:
        return ReplicaRecord(app_id, None, progress.bootstrap_version)
    checkpoint = stream_checkpoint(checkpoint_root, pipeline_id, table_slug, progress.epoch)
    through = applied_through_after_batch(checkpoint, txn, source_path, source_target)
    return ReplicaRecord(app_id, txn, through)


def replayed_outcome(applied_through: int | None = None) -> MergeOutcome:
    """The outcome of a replayed batch the replica already holds, skipped without reading it;
    ``applied_through``: the last source version it brought, where the replica's record tells it."""
    return MergeOutcome(BatchStats(0, None, applied_through, None), ApplyCounts(), replayed=True, read=READ_NOTHING,
                        write=WRITE_NOTHING)
