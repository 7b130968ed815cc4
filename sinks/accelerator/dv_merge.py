"""The driver's apply into a replica with deletion vectors: changed rows are marked deleted where
they lie, and the batch's new row versions are appended, in one commit.

A MERGE that rewrites files costs what the files hold, not what changed: a 1% change with random
keys touches every file of a large replica, so its rewrite comes close to a full overwrite.
Spark's MERGE with deletion vectors writes only the changed rows, but still runs its two joins
over the whole replica, and delta-rs (1.6) does not write deletion vectors at all
(``make bench ONLY=steady_cost`` measures a cycle with deletion vectors and without, against a
full refresh). This executor does what such a MERGE does,
reading only the replica's key columns:

1. The replica's live files and their deletion vectors come from its log
   (:mod:`lakemirror.delta_log.local_log`).
2. Each file's key columns are read (unless its statistics put an integer key wholly outside the
   batch's range); the positions of its live rows whose key the batch changes
   (null-safe: a NULL key part equals NULL, as the MERGE's ``<=>``) join the file's deletion
   vector (:mod:`lakemirror.delta_log.deletion_vectors`). A file left with no live row is removed.
3. The batch's upserts (the winning change per key that is not a delete) are written as one new
   file, its statistics by delta-rs.
4. One commit replaces each touched file's ``add`` with one naming its new deletion vector,
   adds the new file, and carries the batch's ``txn`` action and tag, as every apply path does.
   It is written only if its version is still free; if another writer took it, the files are
   removed and the batch is planned again from the newer snapshot.

After a commit the replica is compacted when it needs it (:mod:`lakemirror.sinks.accelerator.dv_compaction`).

The result equals the MERGE's row for row: every live row with a changed key is gone, and each
upserted key has exactly its new row. Only tables whose every protocol feature and property this
path honours are taken (:func:`why_unfit`); anything else raises :class:`DvUnfit` before a file
is written, and the table goes to Spark's MERGE.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap

from lakemirror.delta_log.data_files import remove_stale_scratch, write_dv_file, write_rows
from lakemirror.delta_log.deletion_vectors import DvDescriptor, DvFileWriter, read_positions
from lakemirror.delta_log.local_log import (LogSnapshot, checkpoint_if_due, data_file_path, file_stats, load_snapshot,
                                          remove_action, write_commit)
from lakemirror.delta_log.protocol import DV_WRITER_FEATURES
from lakemirror.sinks.accelerator.composite_keys import CompositeKeys
from lakemirror.sinks.accelerator.dv_compaction import ENGINE_INFO, compact
from lakemirror.sinks.accelerator.hashed_keys import HashedKeys
from lakemirror.sinks.accelerator.key_match import KEY_CACHE, FileKeys, KeptKeys, KeyLookup, key_probe, key_ranges, outside
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.planner import DELETE, OP_COLUMN
from lakemirror.sinks.txn import TxnId

log = logging.getLogger(__name__)

#: How often a batch is planned again after another writer took its commit's version.
CONFLICT_RETRIES = 3
#: Rows a data file may hold for this path (its deletion vectors are 32-bit Roaring bitmaps).
MAX_FILE_ROWS = 2**32
#: Column metadata keys of features this path would have to enforce or fill in.
UNSUPPORTED_COLUMN_METADATA = ("delta.invariants", "delta.generationExpression", "delta.identity",
                               "delta.columnMapping")


class DvUnfit(Exception):
    """The replica needs something this path does not do; nothing was written."""


class CommitConflict(Exception):
    """Another writer committed the version this batch's commit was to take."""


def _true(value: Any) -> bool:
    return str(value).strip().lower() == "true"


def why_unfit(snapshot: LogSnapshot, column_names: Sequence[str]) -> str | None:
    """Why this path cannot apply batches to the replica ``snapshot`` describes; None if it can."""
    other = sorted(snapshot.features - DV_WRITER_FEATURES)
    if other:
        return f"the replica uses protocol features this path does not write ({', '.join(other)})"
    if "deletionVectors" not in (snapshot.protocol.get("writerFeatures") or ()):
        return "the replica's protocol does not support deletion vectors"
    config = snapshot.configuration
    if not _true(config.get("delta.enableDeletionVectors", "false")):
        return "the replica has deletion vectors off"
    if _true(config.get("delta.appendOnly", "false")):
        return "the replica is append-only"
    if _true(config.get("delta.enableChangeDataFeed", "false")):
        return "the replica has a change data feed of its own (its commits would need change files)"
    if config.get("delta.columnMapping.mode", "none") != "none":
        return "the replica uses column mapping"
    if any(k.startswith("delta.constraints.") for k in config):
        return "the replica has CHECK constraints"
    if snapshot.metadata.get("partitionColumns"):
        return "the replica is partitioned"
    fields = snapshot.schema.get("fields", [])
    if sorted(f["name"] for f in fields) != sorted(column_names):
        return "the replica's columns differ from the batch's"
    for f in fields:
        odd = [k for k in (f.get("metadata") or {}) if k.startswith(UNSUPPORTED_COLUMN_METADATA)]
        if odd:
            return f"column {f['name']} has {', '.join(odd)}"
    return None


class DeletionVectorMerge:
    """Change batches applied to the local replica at ``path`` by deletion vectors."""

    def __init__(self, path: str, keys: Sequence[str], column_names: Sequence[str]) -> None:
        self.dir = Path(path)
        self.keys = list(keys)
        self.column_names = list(column_names)
        #: A live file's identity (path, deletion vector id) -> its deleted rows.
        self._deleted: dict[tuple[str, str], BitMap] = {}
        try:
            if remove_stale_scratch(self.dir):
                log.info("%s: removed the scratch files of writes a crash interrupted", self.dir)
        except OSError as exc:
            log.warning("%s: could not look for stale scratch files: %s", self.dir, exc)

    def check(self) -> str | None:
        """Why the replica is unfit for this path now; None if fit."""
        try:
            return why_unfit(load_snapshot(self.dir), self.column_names)
        except (OSError, ValueError, KeyError) as exc:
            return f"its log could not be read ({exc})"

    def merge(self, winners: pa.Table, txn: TxnId) -> ApplyCounts | None:
        """Apply ``winners`` (one row per key, its operation in ``__lm_op``) under ``txn``; None
        when the replica holds ``txn`` already (a replay: nothing was written)."""
        for _ in range(CONFLICT_RETRIES + 1):
            try:
                snapshot = load_snapshot(self.dir)
            except (OSError, ValueError, KeyError) as exc:
                raise DvUnfit(f"its log could not be read ({exc})") from exc
            reason = why_unfit(snapshot, self.column_names)
            if reason is not None:
                raise DvUnfit(reason)
            if snapshot.transactions.get(txn.app_id, -1) >= txn.version:
                return None
            try:
                counts, actions = self._merge_once(snapshot, winners, txn)
            except CommitConflict:
                log.info("%s: another writer committed version %d first; the batch is planned again",
                         self.dir, snapshot.version + 1)
                continue
            snapshot.apply(snapshot.version + 1, actions)  # the replica as this commit left it
            checkpoint_if_due(self.dir, snapshot.version, snapshot.configuration)
            compact(self.dir, snapshot)
            return counts
        raise DvUnfit(f"other writers took the replica's next version {CONFLICT_RETRIES + 1} times running")

    def _merge_once(self, snapshot: LogSnapshot, winners: pa.Table,
                    txn: TxnId) -> tuple[ApplyCounts, list[dict[str, Any]]]:
        """Plan and commit one batch on ``snapshot``: its counts and the actions committed."""
        deleting = pc.equal(winners.column(OP_COLUMN), DELETE).combine_chunks()
        key_types = [winners.schema.field(k).type for k in self.keys]
        batch_keys = winners.select(self.keys)
        probe = key_probe(batch_keys)
        lookup = KeyLookup(probe, batch_keys)
        upsert_probe = probe.filter(pc.invert(deleting))
        now = int(time.time() * 1000)
        dvs = DvFileWriter()
        actions: list[dict[str, Any]] = []
        matched_parts: list[pa.Array] = []
        files_touched = 0
        self._forget_all_but(snapshot)
        deleted_after: dict[tuple[str, str], BitMap] = {}
        ranges = key_ranges(batch_keys)
        for identity, add in snapshot.files.items():
            if outside(file_stats(add), ranges):
                continue
            file_keys = self._file_keys(add, key_types)
            hits, matched = file_keys.find(lookup)
            if hits.size == 0:
                continue
            gone = self._deleted_rows(identity, add)
            positions = BitMap(hits) - gone
            if not positions:
                continue
            if len(positions) < hits.size:  # some of those rows were deleted already
                fresh = np.frombuffer(positions.to_array(), dtype=np.uint32)
                matched = matched.filter(pa.array(np.isin(hits, fresh, assume_unique=True)))
            matched_parts.append(matched)
            files_touched += 1
            actions.append({"remove": remove_action(add, now)})
            union = gone | positions
            if len(union) < file_keys.rows:
                new_add = self._with_dv(add, dvs.add(union))
                actions.append({"add": new_add})
                deleted_after[(new_add["path"], DvDescriptor.from_action(new_add["deletionVector"]).unique_id)] = union
        # Counted once for the batch: each lookup builds a hash set of its value set.
        matched_all = pa.concat_arrays(matched_parts) if matched_parts else probe.slice(0, 0)
        updated = int(pc.sum(pc.is_in(matched_all, value_set=upsert_probe, skip_nulls=False)).as_py() or 0)
        deleted = len(matched_all) - updated
        inserted = int(pc.sum(pc.invert(pc.is_in(upsert_probe, value_set=matched_all, skip_nulls=False))).as_py()
                       or 0)
        upserts = winners.filter(pc.invert(deleting)).select(
            [f["name"] for f in snapshot.schema["fields"]])
        self._check_not_null(snapshot, upserts)
        written: list[Path] = []
        try:
            if not dvs.empty:
                written.append(write_dv_file(self.dir, dvs))
            if upserts.num_rows:
                for new_file, new_add in write_rows(self.dir, upserts, now):
                    written.append(new_file)
                    actions.append({"add": new_add})
            counts = ApplyCounts(inserted, updated, deleted)
            head = [{"commitInfo": self._commit_info(snapshot, txn, counts, now, files_touched, bool(upserts.num_rows))},
                    {"txn": {"appId": txn.app_id, "version": txn.version, "lastUpdated": now}}]
            actions = head + actions
            if not write_commit(self.dir, snapshot.version + 1, actions):
                raise CommitConflict()
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        self._deleted.update(deleted_after)
        return counts, actions

    def _file_keys(self, add: dict[str, Any], key_types: Sequence[pa.DataType]) -> KeptKeys:
        """A data file's keys, one per physical row (from :data:`KEY_CACHE` when kept)."""
        path = data_file_path(self.dir, add)
        cache_key = (str(path), repr((self.keys, key_types)))
        kept = KEY_CACHE.get(cache_key)
        if kept is not None:
            return kept
        found = pq.ParquetFile(path).read(columns=self.keys)
        records = file_stats(add).get("numRecords")
        if records is not None and int(records) != found.num_rows:
            raise DvUnfit(f"{path} holds {found.num_rows} rows, its statistics say {records}")
        if found.num_rows >= MAX_FILE_ROWS:
            raise DvUnfit(f"{path} holds {found.num_rows} rows, more than a 32-bit deletion vector marks")
        keys = pa.table([found.column(k).cast(t) for k, t in zip(self.keys, key_types)], names=self.keys)
        kept = CompositeKeys.of(keys)
        if kept is None:  # the probe is made only here: for a composite key it is a string per row
            probe = key_probe(keys)
            kept = HashedKeys.of(probe) or FileKeys(probe)
        KEY_CACHE.put(cache_key, kept)
        return kept

    def _deleted_rows(self, identity: tuple[str, str], add: dict[str, Any]) -> BitMap:
        """The rows a live file's deletion vector deletes (kept after the first read)."""
        if not add.get("deletionVector"):
            return BitMap()
        rows = self._deleted.get(identity)
        if rows is None:
            rows = BitMap(read_positions(self.dir, DvDescriptor.from_action(add["deletionVector"])).astype(np.uint32))
            self._deleted[identity] = rows
        return rows

    def _forget_all_but(self, snapshot: LogSnapshot) -> None:
        """Drop what is kept of files the replica no longer holds."""
        for identity in [i for i in self._deleted if i not in snapshot.files]:
            del self._deleted[identity]
        KEY_CACHE.forget({str(data_file_path(self.dir, add)) for add in snapshot.files.values()}, str(self.dir))

    @staticmethod
    def _with_dv(add: dict[str, Any], dv: DvDescriptor) -> dict[str, Any]:
        new = {k: v for k, v in add.items() if k not in ("deletionVector", "stats")}
        new["dataChange"] = True
        new["deletionVector"] = dv.to_action()
        if add.get("stats"):
            stats = file_stats(add)
            stats["tightBounds"] = False  # the bounds still count the rows now deleted
            new["stats"] = json.dumps(stats, separators=(",", ":"))
        return new

    def _check_not_null(self, snapshot: LogSnapshot, upserts: pa.Table) -> None:
        for f in snapshot.schema["fields"]:
            if not f.get("nullable", True) and upserts.column(f["name"]).null_count:
                raise DvUnfit(f"the batch sets NOT NULL column {f['name']} to NULL")

    def _commit_info(self, snapshot: LogSnapshot, txn: TxnId, counts: ApplyCounts, now: int,
                     files_touched: int, added_file: bool) -> dict[str, Any]:
        metrics = {"numTargetRowsInserted": counts.inserted, "numTargetRowsUpdated": counts.updated,
                   "numTargetRowsDeleted": counts.deleted, "numTargetRowsCopied": 0,
                   "numTargetDeletionVectorsAdded": files_touched,
                   "numTargetFilesAdded": int(added_file), "numOutputRows": counts.inserted + counts.updated}
        return {"timestamp": now, "operation": "MERGE",
                "operationParameters": {"predicate": json.dumps([" AND ".join(f"target.{k} <=> source.{k}"
                                                                              for k in self.keys)])},
                "readVersion": snapshot.version, "isolationLevel": "Serializable", "isBlindAppend": False,
                "operationMetrics": {k: str(v) for k, v in metrics.items()},
                "engineInfo": ENGINE_INFO, "userMetadata": txn.tag(),
                "txnId": str(uuid.uuid4())}
