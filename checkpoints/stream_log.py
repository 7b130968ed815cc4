"""A Structured Streaming checkpoint's offset and commit logs, read and continued by the daemon.

A table's query keeps two logs in its checkpoint folder: ``offsets/<n>`` (written before batch
``n`` runs: the source offsets it ends at) and ``commits/<n>`` (written once it has run). Spark
restarts a query from them: it re-runs the last batch that has offsets and no commit, with the same
offsets, then plans batch ``n + 1`` from batch ``n``'s end offset.

A batch the daemon applies from the source's commit files (:mod:`lakemirror.supervisor.change_feed.commit_file_batches`)
is written into the same logs, as Spark would write it: ``offsets/<n>`` before the replica's commit
(the batch's end offset in Delta's streaming source format, so that Spark's own planning continues
from it, and the batch metadata of the batch before it), ``commits/<n>`` after its checkpoint row.
So a table moves between the daemon's batches and Spark's without a gap, a batch applied twice, or
a batch id used for two ranges: whichever runs next reads where the other stopped.

Entries are created, never replaced: a file is written under a hidden temporary name (the pattern
Spark's own interrupted writes have, which :func:`lakemirror.checkpoints.stream_dir.remove_interrupted_writes`
clears) and linked into place, which fails if the name exists. Old entries are purged as Spark does
(``spark.sql.streaming.minBatchesToRetain``, 100 by default). Local folders only (the
``checkpoint_volume`` is on the driver's file system).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

from lakemirror.checkpoints.stream_dir import source_offset

OFFSETS, COMMITS = "offsets", "commits"
#: The log format Spark writes (``v1``) and reads.
LOG_VERSION = "v1"
#: What a commit entry of a stateless query holds.
COMMIT_METADATA = {"nextBatchWatermarkMs": 0}
#: Spark's ``spark.sql.streaming.minBatchesToRetain`` default: entries kept behind the newest.
MIN_BATCHES_TO_RETAIN = 100


class EntryExists(Exception):
    """An entry the daemon was to create exists already (another writer of the checkpoint)."""


def _batch_ids(folder: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return []


class StreamLog:
    """The offset and commit logs of the checkpoint folder ``folder``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def latest_offsets(self) -> int | None:
        """The newest batch id with an offsets entry; None when there is none."""
        ids = _batch_ids(self.folder / OFFSETS)
        return ids[-1] if ids else None

    def latest_commit(self) -> int | None:
        """The newest batch id with a commit entry; None when there is none."""
        ids = _batch_ids(self.folder / COMMITS)
        return ids[-1] if ids else None

    def offsets_entry(self, batch_id: int) -> str | None:
        try:
            return (self.folder / OFFSETS / str(batch_id)).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def source_offset(self, batch_id: int) -> str | None:
        """The (only) source's end offset of batch ``batch_id``, as Spark logged it; None if unreadable."""
        entry = self.offsets_entry(batch_id)
        return source_offset(entry) if entry is not None else None

    def batch_metadata(self, batch_id: int) -> dict[str, Any] | None:
        """The batch metadata line (watermark, timestamp, the session confs Spark restores) of ``batch_id``."""
        entry = self.offsets_entry(batch_id)
        if entry is None:
            return None
        lines = entry.splitlines()
        try:
            data = json.loads(lines[1])
        except (IndexError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_offsets(self, batch_id: int, offset: Mapping[str, Any], metadata: Mapping[str, Any],
                      now_ms: int | None = None) -> None:
        """Create ``offsets/<batch_id>``: ``metadata`` (the previous batch's) with this batch's time, then
        the source's end ``offset``."""
        meta = {**metadata, "batchTimestampMs": int(time.time() * 1000) if now_ms is None else now_ms}
        text = "\n".join((LOG_VERSION, json.dumps(meta, separators=(",", ":")),
                          json.dumps(dict(offset), separators=(",", ":"))))
        self._create(self.folder / OFFSETS, batch_id, text)

    def write_commit(self, batch_id: int) -> None:
        """Create ``commits/<batch_id>``: the batch has run."""
        self._create(self.folder / COMMITS, batch_id,
                     "\n".join((LOG_VERSION, json.dumps(COMMIT_METADATA, separators=(",", ":")))))

    def purge(self, keep_from: int) -> int:
        """Delete the entries of batches before ``keep_from`` (and their checksum files); how many."""
        removed = 0
        for log in (OFFSETS, COMMITS):
            folder = self.folder / log
            for batch in _batch_ids(folder):
                if batch >= keep_from:
                    break
                for name in (str(batch), f".{batch}.crc"):
                    try:
                        (folder / name).unlink()
                        removed += name == str(batch)
                    except FileNotFoundError:
                        pass
        return removed

    @staticmethod
    def _create(folder: Path, batch_id: int, text: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / str(batch_id)
        temp = folder / f".{batch_id}.{uuid.uuid4()}.tmp"
        with open(temp, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temp, final)  # fails if the entry exists: never replaced
        except FileExistsError as exc:
            raise EntryExists(f"{final} exists already") from exc
        finally:
            temp.unlink(missing_ok=True)
