"""The driver's apply into a replica with deletion vectors: changed rows are marked deleted where
they lie, and the batch's new row versions are appended, in one commit.

A MERGE that rewrites files costs what the files hold, not what changed: a 1% change with random
keys touches every file of a 10M-row replica, and rewriting them cost 0.46 times a full Spark
overwrite (docs/BENCHMARKS.md, eleventh session). Spark's MERGE with deletion vectors writes only
the changed rows, but its two joins over the replica cost 2.01 times the overwrite here, and
delta-rs (1.6) does not write deletion vectors at all. This executor does what such a MERGE does,
reading only the replica's key columns:

1. The replica's live files and their deletion vectors come from its log
   (:mod:`lakemirror.sinks.replica_log`).
2. Each file's key columns are read; the positions of its live rows whose key the batch changes
   (null-safe: a NULL key part equals NULL, as the MERGE's ``<=>``) join the file's deletion
   vector (:mod:`lakemirror.sinks.deletion_vectors`). A file left with no live row is removed.
3. The batch's upserts (the winning change per key that is not a delete) are written as one new
   file, its statistics by delta-rs.
4. One commit replaces each touched file's ``add`` with one naming its new deletion vector,
   adds the new file, and carries the batch's ``txn`` action and tag, as every apply path does.
   It is written only if its version is still free; if another writer took it, the files are
   removed and the batch is planned again from the newer snapshot.

Each batch adds a file, and deleted rows stay in their files, so after a commit the replica is
compacted when it needs it (:func:`compaction_plan`): its small files once there are
:data:`COMPACT_MIN_FILES` of them, and any file with at least half its rows deleted, are rewritten
without their deleted rows, in a commit of their own that changes no data (``dataChange`` false,
as OPTIMIZE's: the replica's own streaming readers skip it).

The result equals the MERGE's row for row: every live row with a changed key is gone, and each
upserted key has exactly its new row. Only tables whose every protocol feature and property this
path honours are taken (:func:`why_unfit`); anything else raises :class:`DvUnfit` before a file
is written, and the table goes to Spark's MERGE.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collections import OrderedDict

from pyroaring import BitMap

from lakemirror.sinks.deletion_vectors import DvDescriptor, DvFileWriter, read_positions
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.planner import DELETE, OP_COLUMN
from lakemirror.sinks.replica_log import LogSnapshot, data_file_path, load_snapshot, write_commit
from lakemirror.sinks.txn import TxnId
from lakemirror.tables import DV_WRITER_FEATURES

log = logging.getLogger(__name__)

#: How often a batch is planned again after another writer took its commit's version.
CONFLICT_RETRIES = 3
#: Delta's default checkpoint interval (``delta.checkpointInterval``): a checkpoint every 10 commits.
DEFAULT_CHECKPOINT_INTERVAL = 10
#: Column metadata keys of features this path would have to enforce or fill in.
UNSUPPORTED_COLUMN_METADATA = ("delta.invariants", "delta.generationExpression", "delta.identity",
                               "delta.columnMapping")


#: Files under this size count as small: once :data:`COMPACT_MIN_FILES` are, they are compacted together.
SMALL_FILE_BYTES = 16 * 1024 * 1024
COMPACT_MIN_FILES = 16
#: A file with at least this share of its rows deleted is rewritten without them.
PURGE_DELETED_SHARE = 0.5


def _deleted_share(add: dict[str, Any]) -> float:
    dv = add.get("deletionVector")
    records = json.loads(add["stats"]).get("numRecords") if add.get("stats") else None
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


def key_probe(keys: pa.Table) -> pa.Array:
    """One comparable value per row for ``keys``: the column itself for one key, else a binary
    encoding of the parts in which equal keys (NULL parts equal) and only they are equal."""
    if keys.num_columns == 1:
        return keys.column(0).combine_chunks()
    pieces = []
    for column in keys.columns:
        column = column.combine_chunks()
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            text = pc.cast(column, pa.large_binary())
        else:
            text = pc.cast(pc.cast(column, pa.large_string()), pa.large_binary())
        length = pc.cast(pc.cast(pc.binary_length(text), pa.large_string()), pa.large_binary())
        value = pc.binary_join_element_wise(pa.scalar(b"V", pa.large_binary()), length,
                                            pa.scalar(b":", pa.large_binary()), text,
                                            pa.scalar(b"", pa.large_binary()))
        pieces.append(pc.if_else(pc.is_null(column), pa.scalar(b"N", pa.large_binary()), value))
    return pc.binary_join_element_wise(*pieces, pa.scalar(b"|", pa.large_binary()))


#: The replica files' key columns kept between batches, at most this many bytes for the whole
#: process (the least recently used go first). A data file never changes under its name, so a kept
#: column is never stale; with it a batch reads only the files written since the last.
KEY_CACHE_BYTES = 512 * 1024 * 1024
#: Rows a data file may hold for this path (its deletion vectors are 32-bit Roaring bitmaps).
MAX_FILE_ROWS = 2**32

#: A batch's integer keys are looked up in a bitmap of their range (one gather per replica row, about
#: ten times faster than a hash set) while the range is at most this many times their number, or
#: at most :data:`DENSE_RANGE_FLOOR` wide.
DENSE_RANGE_PER_KEY = 64
DENSE_RANGE_FLOOR = 1 << 24


class KeyLookup:
    """Which of a replica file's keys the batch changes (null-safe, as the MERGE's ``<=>``)."""

    def __init__(self, probe: pa.Array) -> None:
        self.probe = probe
        self.dense: tuple[int, np.ndarray] | None = None
        if pa.types.is_integer(probe.type) and probe.null_count == 0 and len(probe):
            values = probe.to_numpy().astype(np.int64)
            low, high = int(values.min()), int(values.max())
            if high - low < max(DENSE_RANGE_PER_KEY * len(values), DENSE_RANGE_FLOOR):
                present = np.zeros(high - low + 1, dtype=bool)
                present[values - low] = True
                self.dense = (low, present)

    def hits(self, keys: pa.Array) -> np.ndarray:
        """A writable boolean mask over ``keys``: True where the batch changes that key."""
        if self.dense is not None and keys.null_count == 0:
            low, present = self.dense
            values = keys.to_numpy().astype(np.int64, copy=False)
            offsets = values - low
            inside = (offsets >= 0) & (offsets < len(present))
            return present[np.where(inside, offsets, 0)] & inside
        return pc.is_in(keys, value_set=self.probe, skip_nulls=False).to_numpy(zero_copy_only=False)


class KeyCache:
    """The process's kept key columns (:data:`KEY_CACHE_BYTES`), shared by every table's apply
    (tables take turns on several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probes: OrderedDict[tuple[str, str], pa.Array] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[str, str]) -> pa.Array | None:
        with self._lock:
            probe = self._probes.get(key)
            if probe is not None:
                self._probes.move_to_end(key)
            return probe

    def put(self, key: tuple[str, str], probe: pa.Array) -> None:
        with self._lock:
            if key in self._probes:
                return
            self._probes[key] = probe
            self._bytes += probe.nbytes
            while self._bytes > KEY_CACHE_BYTES and self._probes:
                _, evicted = self._probes.popitem(last=False)
                self._bytes -= evicted.nbytes

    def forget(self, files: set[str], under: str) -> None:
        """Drop the kept columns of files under directory ``under`` other than ``files``."""
        prefix = under.rstrip("/") + "/"
        with self._lock:
            for key in [k for k in self._probes if k[0].startswith(prefix) and k[0] not in files]:
                self._bytes -= self._probes.pop(key).nbytes


KEY_CACHE = KeyCache()


class DeletionVectorMerge:
    """Change batches applied to the local replica at ``path`` by deletion vectors."""

    def __init__(self, path: str, keys: Sequence[str], column_names: Sequence[str]) -> None:
        self.dir = Path(path)
        self.keys = list(keys)
        self.column_names = list(column_names)
        #: A live file's identity (path, deletion vector id) -> its deleted rows.
        self._deleted: dict[tuple[str, str], BitMap] = {}

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
                counts = self._merge_once(snapshot, winners, txn)
            except CommitConflict:
                log.info("%s: another writer committed version %d first; the batch is planned again",
                         self.dir, snapshot.version + 1)
                continue
            self._compact()
            self._maintain(snapshot.version + 1, snapshot.configuration)
            return counts
        raise DvUnfit(f"other writers took the replica's next version {CONFLICT_RETRIES + 1} times running")

    def _merge_once(self, snapshot: LogSnapshot, winners: pa.Table, txn: TxnId) -> ApplyCounts:
        deleting = pc.equal(winners.column(OP_COLUMN), DELETE).combine_chunks()
        key_types = [winners.schema.field(k).type for k in self.keys]
        probe = key_probe(winners.select(self.keys))
        lookup = KeyLookup(probe)
        upsert_probe = probe.filter(pc.invert(deleting))
        now = int(time.time() * 1000)
        dvs = DvFileWriter()
        actions: list[dict[str, Any]] = []
        matched_parts: list[pa.Array] = []
        updated = deleted = files_touched = 0
        self._forget_all_but(snapshot)
        deleted_after: dict[tuple[str, str], BitMap] = {}
        for identity, add in snapshot.files.items():
            file_probe = self._file_keys(add, key_types)
            hits = np.flatnonzero(lookup.hits(file_probe))
            if hits.size == 0:
                continue
            gone = self._deleted_rows(identity, add)
            positions = BitMap(hits.astype(np.uint32)) - gone
            if not positions:
                continue
            matched = file_probe.take(pa.array(np.frombuffer(positions.to_array(), dtype=np.uint32).astype(np.int64)))
            matched_parts.append(matched)
            upserted_here = int(pc.sum(pc.is_in(matched, value_set=upsert_probe, skip_nulls=False)).as_py() or 0)
            updated += upserted_here
            deleted += len(positions) - upserted_here
            files_touched += 1
            actions.append({"remove": self._remove(add, now)})
            union = gone | positions
            if len(union) < len(file_probe):
                new_add = self._with_dv(add, dvs.add(union))
                actions.append({"add": new_add})
                deleted_after[(new_add["path"], DvDescriptor.from_action(new_add["deletionVector"]).unique_id)] = union
        matched_all = pa.concat_arrays(matched_parts) if matched_parts else probe.slice(0, 0)
        inserted = int(pc.sum(pc.invert(pc.is_in(upsert_probe, value_set=matched_all, skip_nulls=False))).as_py()
                       or 0)
        upserts = winners.filter(pc.invert(deleting)).select(
            [f["name"] for f in snapshot.schema["fields"]])
        self._check_not_null(snapshot, upserts)
        written: list[Path] = []
        try:
            if not dvs.empty:
                written.append(self._write_dv_file(dvs))
            if upserts.num_rows:
                for new_file, new_add in self._write_rows(upserts, now):
                    written.append(new_file)
                    actions.append({"add": new_add})
            counts = ApplyCounts(inserted, updated, deleted)
            head = [{"commitInfo": self._commit_info(snapshot, txn, counts, now, files_touched, bool(upserts.num_rows))},
                    {"txn": {"appId": txn.app_id, "version": txn.version, "lastUpdated": now}}]
            if not write_commit(self.dir, snapshot.version + 1, head + actions):
                raise CommitConflict()
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        self._deleted.update(deleted_after)
        return counts

    def _file_keys(self, add: dict[str, Any], key_types: Sequence[pa.DataType]) -> pa.Array:
        """A data file's key probe, one value per physical row (from :attr:`_keys` when kept)."""
        path = data_file_path(self.dir, add)
        cache_key = (str(path), repr(key_types))
        probe = KEY_CACHE.get(cache_key)
        if probe is not None:
            return probe
        found = pq.ParquetFile(path).read(columns=self.keys)
        records = json.loads(add["stats"]).get("numRecords") if add.get("stats") else None
        if records is not None and int(records) != found.num_rows:
            raise DvUnfit(f"{path} holds {found.num_rows} rows, its statistics say {records}")
        if found.num_rows >= MAX_FILE_ROWS:
            raise DvUnfit(f"{path} holds {found.num_rows} rows, more than a 32-bit deletion vector marks")
        probe = key_probe(pa.table([found.column(k).cast(t) for k, t in zip(self.keys, key_types)], names=self.keys))
        KEY_CACHE.put(cache_key, probe)
        return probe

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
    def _remove(add: dict[str, Any], now: int) -> dict[str, Any]:
        remove: dict[str, Any] = {"path": add["path"], "deletionTimestamp": now, "dataChange": True,
                                  "extendedFileMetadata": True, "partitionValues": add.get("partitionValues") or {},
                                  "size": add["size"]}
        if add.get("deletionVector"):
            remove["deletionVector"] = add["deletionVector"]
        if add.get("stats"):
            remove["stats"] = json.dumps({"numRecords": json.loads(add["stats"]).get("numRecords")})
        return remove

    @staticmethod
    def _with_dv(add: dict[str, Any], dv: DvDescriptor) -> dict[str, Any]:
        new = {k: v for k, v in add.items() if k not in ("deletionVector", "stats")}
        new["dataChange"] = True
        new["deletionVector"] = dv.to_action()
        if add.get("stats"):
            stats = json.loads(add["stats"])
            stats["tightBounds"] = False  # the bounds still count the rows now deleted
            new["stats"] = json.dumps(stats, separators=(",", ":"))
        return new

    def _check_not_null(self, snapshot: LogSnapshot, upserts: pa.Table) -> None:
        for f in snapshot.schema["fields"]:
            if not f.get("nullable", True) and upserts.column(f["name"]).null_count:
                raise DvUnfit(f"the batch sets NOT NULL column {f['name']} to NULL")

    def _write_dv_file(self, dvs: DvFileWriter) -> Path:
        path = self.dir / dvs.name
        with open(path, "xb") as f:
            f.write(dvs.content())
        return path

    def _write_rows(self, rows: pa.Table, now: int, data_change: bool = True) -> list[tuple[Path, dict[str, Any]]]:
        """``rows`` as new data files of the replica, each with its ``add`` action (the statistics
        delta-rs computes), written through a scratch table beside the replica."""
        from deltalake import write_deltalake

        scratch = self.dir / f".lakemirror-rows-{uuid.uuid4().hex}"
        out: list[tuple[Path, dict[str, Any]]] = []
        try:
            write_deltalake(str(scratch), rows, mode="error")
            commit = (scratch / "_delta_log" / f"{0:020d}.json").read_text(encoding="utf-8")
            for line in commit.splitlines():
                add = json.loads(line).get("add")
                if add is None:
                    continue
                target = self.dir / Path(add["path"]).name
                (scratch / add["path"]).rename(target)
                add.update(path=target.name, dataChange=data_change, modificationTime=now, partitionValues={})
                out.append((target, add))
        except BaseException:
            for target, _ in out:
                target.unlink(missing_ok=True)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return out

    def _compact(self) -> None:
        """Rewrite the files :func:`compaction_plan` picks without their deleted rows, in one commit
        that changes no data. Skipped (the next batch tries again) if another writer commits first
        or anything fails: compaction is never needed for a correct replica."""
        try:
            self._compact_once()
        except Exception as exc:  # noqa: BLE001 (see the docstring)
            log.warning("%s: compaction skipped: %s", self.dir, exc)

    def _compact_once(self) -> None:
        snapshot = load_snapshot(self.dir)
        chosen = compaction_plan(list(snapshot.files.values()))
        if not chosen or why_unfit(snapshot, self.column_names) is not None:
            return
        schema = self._arrow_schema()
        rows = pa.concat_tables([self._live_rows(add, schema) for add in chosen])
        now = int(time.time() * 1000)
        written = self._write_rows(rows, now, data_change=False) if rows.num_rows else []
        actions: list[dict[str, Any]] = [{"commitInfo": {
            "timestamp": now, "operation": "OPTIMIZE", "operationParameters": {"auto": "true", "predicate": "[]"},
            "readVersion": snapshot.version, "isolationLevel": "SnapshotIsolation", "isBlindAppend": False,
            "operationMetrics": {"numRemovedFiles": str(len(chosen)), "numAddedFiles": str(len(written)),
                                 "numDeletionVectorsRemoved": str(sum(1 for a in chosen if a.get("deletionVector")))},
            "engineInfo": "lakemirror (deletion vectors on the driver)", "txnId": str(uuid.uuid4())}}]
        actions += [{"remove": {**self._remove(add, now), "dataChange": False}} for add in chosen]
        actions += [{"add": add} for _, add in written]
        if not write_commit(self.dir, snapshot.version + 1, actions):
            for path, _ in written:
                path.unlink(missing_ok=True)
            log.info("%s: another writer committed first; compaction waits for the next batch", self.dir)
            return
        log.info("%s: compacted %d files into %d (%d rows)", self.dir, len(chosen), len(written), rows.num_rows)
        self._maintain(snapshot.version + 1, snapshot.configuration)

    def _arrow_schema(self) -> pa.Schema:
        from deltalake import DeltaTable

        return pa.schema(DeltaTable(str(self.dir)).schema().to_arrow())

    def _live_rows(self, add: dict[str, Any], schema: pa.Schema) -> pa.Table:
        """A data file's rows that its deletion vector leaves, in the replica's current schema (a
        column added since the file was written is NULL)."""
        table = pq.read_table(data_file_path(self.dir, add))
        if add.get("deletionVector"):
            keep = np.ones(table.num_rows, dtype=bool)
            keep[read_positions(self.dir, DvDescriptor.from_action(add["deletionVector"])).astype(np.int64)] = False
            table = table.filter(pa.array(keep))
        columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
                   else pa.nulls(table.num_rows, f.type) for f in schema]
        return pa.table(columns, schema=schema)

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
                "engineInfo": "lakemirror (deletion vectors on the driver)", "userMetadata": txn.tag(),
                "txnId": str(uuid.uuid4())}

    def _maintain(self, version: int, config: dict[str, str]) -> None:
        """Every ``delta.checkpointInterval`` commits, a checkpoint (by delta-rs, which writes
        deletion vectors' descriptors into it) and the cleanup of expired log files."""
        interval = int(config.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL))
        if interval <= 0 or version % interval:
            return
        try:
            from deltalake import DeltaTable

            table = DeltaTable(str(self.dir))
            table.create_checkpoint()
            table.cleanup_metadata()
        except Exception as exc:  # noqa: BLE001 (a checkpoint is an optimisation; the next interval tries again)
            log.warning("%s: could not write the checkpoint of version %d: %s", self.dir, version, exc)
