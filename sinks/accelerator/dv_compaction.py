"""Compaction of a replica the driver changes by deletion vectors (:mod:`lakemirror.sinks.accelerator.dv_merge`).

Each batch appends a file and leaves its deleted rows in their files. Without compaction every
batch would read one file more than the last, and the deleted rows would stay forever. After a
batch's commit, :func:`compaction_plan` picks the small files once there are
:data:`COMPACT_MIN_FILES` of them, and any file with at least :data:`PURGE_DELETED_SHARE` of its
rows deleted; :func:`compact` rewrites them without their deleted rows in a commit that changes
no data (``dataChange`` false, as OPTIMIZE's: the replica's own streaming readers skip it).
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from lakemirror.delta_log.data_files import arrow_schema, live_rows, write_rows
from lakemirror.delta_log.local_log import LogSnapshot, checkpoint_if_due, file_stats, remove_action, write_commit

log = logging.getLogger(__name__)

#: Files under this size count as small: once :data:`COMPACT_MIN_FILES` are, they are compacted together.
SMALL_FILE_BYTES = 16 * 1024 * 1024
COMPACT_MIN_FILES = 16
#: A file with at least this share of its rows deleted is rewritten without them.
PURGE_DELETED_SHARE = 0.5
ENGINE_INFO = "lakemirror (deletion vectors on the driver)"


def _deleted_share(add: dict[str, Any]) -> float:
    dv = add.get("deletionVector")
    records = file_stats(add).get("numRecords")
    if not dv or not records:
        return 0.0
    return int(dv["cardinality"]) / int(records)


def compaction_plan(files: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``add`` actions of the files to rewrite now: the small ones once there are
    :data:`COMPACT_MIN_FILES` of them, and every file with at least :data:`PURGE_DELETED_SHARE` of
    its rows deleted; none otherwise."""
    small = [a for a in files if int(a["size"]) < SMALL_FILE_BYTES]
    chosen = {a["path"]: a for a in files if _deleted_share(a) >= PURGE_DELETED_SHARE}
    if len(small) >= COMPACT_MIN_FILES:
        chosen.update((a["path"], a) for a in small)
    return list(chosen.values())


def compact(table_dir: Path, snapshot: LogSnapshot) -> None:
    """Rewrite the files :func:`compaction_plan` picks in ``snapshot`` (the replica as the batch's
    own commit left it, a table the caller has found fit) without their deleted rows, in one commit
    that changes no data. Skipped (the next batch tries again) if another writer commits first or
    anything fails: compaction is never needed for a correct replica."""
    try:
        _compact_once(table_dir, snapshot)
    except Exception as exc:  # noqa: BLE001 (see the docstring)
        log.warning("%s: compaction skipped: %s", table_dir, exc)


def _compact_once(table_dir: Path, snapshot: LogSnapshot) -> None:
    chosen = compaction_plan(list(snapshot.files.values()))
    if not chosen:
        return
    schema = arrow_schema(table_dir)
    rows = pa.concat_tables([live_rows(table_dir, add, schema) for add in chosen])
    now = int(time.time() * 1000)
    written = write_rows(table_dir, rows, now, data_change=False) if rows.num_rows else []
    actions: list[dict[str, Any]] = [{"commitInfo": {
        "timestamp": now, "operation": "OPTIMIZE", "operationParameters": {"auto": "true", "predicate": "[]"},
        "readVersion": snapshot.version, "isolationLevel": "SnapshotIsolation", "isBlindAppend": False,
        "operationMetrics": {"numRemovedFiles": str(len(chosen)), "numAddedFiles": str(len(written)),
                             "numDeletionVectorsRemoved": str(sum(1 for a in chosen if a.get("deletionVector")))},
        "engineInfo": ENGINE_INFO, "txnId": str(uuid.uuid4())}}]
    actions += [{"remove": remove_action(add, now, data_change=False)} for add in chosen]
    actions += [{"add": add} for _, add in written]
    if not write_commit(table_dir, snapshot.version + 1, actions):
        for path, _ in written:
            path.unlink(missing_ok=True)
        log.info("%s: another writer committed first; compaction waits for the next batch", table_dir)
        return
    log.info("%s: compacted %d files into %d (%d rows)", table_dir, len(chosen), len(written), rows.num_rows)
    checkpoint_if_due(table_dir, snapshot.version + 1, snapshot.configuration)
