"""A local Delta table's log, read and written without an engine: its live files with their
deletion vectors, and new commits put in place atomically.

delta-rs (1.6) reads deletion vectors but neither writes them nor shows their descriptors, which a
commit that changes a file's deletion vector must name (its ``remove`` names the old one). So the
driver's deletion-vector apply (:mod:`lakemirror.sinks.accelerator.dv_merge`) replays the log itself: the newest
checkpoint that ``_last_checkpoint`` names (classic, single- or multi-part), then each JSON commit
after it. A file's identity is its path with its deletion vector's id; the newest action on an
identity wins.

A commit is written as Delta requires of a writer on a local file system: ``<version>.json`` is
created only if absent (a hard link of a finished temporary file, atomic on POSIX), so a writer
that lost the race learns it and nothing is overwritten.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote

from lakemirror.delta_log.commit_hooks import cleans_log, log_cleanup_enabled
from lakemirror.delta_log.deletion_vectors import DvDescriptor
from lakemirror.delta_log.layout import LAST_CHECKPOINT, LOG_DIR, commit_file_name

log = logging.getLogger(__name__)


def file_key(action: dict[str, Any]) -> tuple[str, str]:
    """A data file's identity in the log: its path and its deletion vector's id."""
    dv = action.get("deletionVector")
    return str(action["path"]), DvDescriptor.from_action(dv).unique_id if dv else ""


def data_file_path(table_dir: Path, action: dict[str, Any]) -> Path:
    """The file an ``add`` names (a URI-escaped path relative to the table, or absolute)."""
    from urllib.parse import urlparse

    path = str(action["path"])
    parsed = urlparse(path)
    if parsed.scheme in ("file",):
        return Path(unquote(parsed.path))
    if parsed.scheme:
        raise ValueError(f"a data file at {path} is not on this file system")
    return table_dir / unquote(path)


@dataclass
class LogSnapshot:
    """A table as its log says at ``version``."""

    version: int
    protocol: dict[str, Any]
    metadata: dict[str, Any]
    files: dict[tuple[str, str], dict[str, Any]]
    transactions: dict[str, int] = field(default_factory=dict)

    @property
    def configuration(self) -> dict[str, str]:
        return dict(self.metadata.get("configuration") or {})

    @property
    def schema(self) -> dict[str, Any]:
        return dict(json.loads(self.metadata["schemaString"]))

    @property
    def features(self) -> set[str]:
        return set(self.protocol.get("readerFeatures") or ()) | set(self.protocol.get("writerFeatures") or ())

    def apply(self, version: int, actions: list[dict[str, Any]]) -> None:
        for action in actions:
            if "add" in action:
                self.files[file_key(action["add"])] = action["add"]
            elif "remove" in action:
                self.files.pop(file_key(action["remove"]), None)
            elif "metaData" in action:
                self.metadata = action["metaData"]
            elif "protocol" in action:
                self.protocol = action["protocol"]
            elif "txn" in action:
                self.transactions[action["txn"]["appId"]] = int(action["txn"]["version"])
        self.version = version


def read_commit(table_dir: Path, version: int) -> list[dict[str, Any]] | None:
    """The actions of commit ``version``; None when it has no commit file (yet)."""
    try:
        text = (table_dir / LOG_DIR / commit_file_name(version)).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _checkpoint_files(log_dir: Path, hint: dict[str, Any]) -> list[Path]:
    version, parts = int(hint["version"]), hint.get("parts")
    if parts:
        return [log_dir / f"{version:020d}.checkpoint.{i:010d}.{int(parts):010d}.parquet" for i in range(1, int(parts) + 1)]
    return [log_dir / f"{version:020d}.checkpoint.parquet"]


def _checkpoint_rows(files: list[Path]) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for path in files:
        table = pq.read_table(path)
        names = [n for n in ("add", "metaData", "protocol", "txn") if n in table.column_names]
        for name in names:
            for value in table.column(name).to_pylist():
                if value is not None:
                    yield {name: _plain(value)}


#: The fields of the log's actions that are maps (Arrow gives a map as a list of pairs).
MAP_FIELDS = frozenset({"partitionValues", "tags", "configuration", "options"})


def _plain(value: Any) -> Any:
    """A checkpoint row as the JSON log spells it."""
    if isinstance(value, dict):
        return {k: (dict(v) if k in MAP_FIELDS and isinstance(v, list) else _plain(v))
                for k, v in value.items() if v is not None}
    return value


def load_snapshot(table_dir: Path) -> LogSnapshot:
    """The table's newest snapshot: its newest checkpoint, then every commit after it."""
    log_dir = table_dir / LOG_DIR
    snapshot = LogSnapshot(-1, {}, {}, {})
    start = 0
    try:
        hint = json.loads((log_dir / LAST_CHECKPOINT).read_text(encoding="utf-8"))
    except FileNotFoundError:
        hint = None
    if hint is not None:
        if hint.get("v2Checkpoint") or hint.get("checkpointSchema", {}).get("checkpointMetadata"):
            raise ValueError(f"{table_dir} has a V2 checkpoint, which this reader does not read")
        snapshot.apply(int(hint["version"]), list(_checkpoint_rows(_checkpoint_files(log_dir, hint))))
        start = snapshot.version + 1
    version = start
    while (actions := read_commit(table_dir, version)) is not None:
        snapshot.apply(version, actions)
        version += 1
    if snapshot.version < 0 or not snapshot.metadata or not snapshot.protocol:
        raise ValueError(f"{table_dir} has no readable Delta log (no commit from version {start})")
    return snapshot


def write_commit(table_dir: Path, version: int, actions: list[dict[str, Any]]) -> bool:
    """Write commit ``version``; False when that version exists already (another writer won)."""
    log_dir = table_dir / LOG_DIR
    temp = log_dir / f".{commit_file_name(version)}.{uuid.uuid4().hex}.tmp"
    with open(temp, "w", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(temp, log_dir / commit_file_name(version))
        return True
    except FileExistsError:
        return False
    finally:
        temp.unlink()


def file_stats(action: dict[str, Any]) -> dict[str, Any]:
    """An ``add`` action's statistics (its ``stats`` JSON), or ``{}`` when it has none."""
    return dict(json.loads(action["stats"])) if action.get("stats") else {}


def remove_action(add: dict[str, Any], now: int, data_change: bool = True) -> dict[str, Any]:
    """The ``remove`` of a live file (with its deletion vector, which is part of its identity)."""
    remove: dict[str, Any] = {"path": add["path"], "deletionTimestamp": now, "dataChange": data_change,
                              "extendedFileMetadata": True, "partitionValues": add.get("partitionValues") or {},
                              "size": add["size"]}
    if add.get("deletionVector"):
        remove["deletionVector"] = add["deletionVector"]
    if add.get("stats"):
        remove["stats"] = json.dumps({"numRecords": file_stats(add).get("numRecords")})
    return remove


#: Delta's default checkpoint interval (``delta.checkpointInterval``): a checkpoint every 10 commits.
DEFAULT_CHECKPOINT_INTERVAL = 10


def checkpoint_if_due(table_dir: Path, version: int, config: dict[str, str]) -> None:
    """After commit ``version``, every ``delta.checkpointInterval`` commits: a checkpoint (by
    delta-rs, which writes deletion vectors' descriptors into it); on the checkpoint whose interval
    holds a version where :func:`lakemirror.delta_log.commit_hooks.cleans_log` (the clean-up lists the
    whole log), also the cleanup of expired log files, unless the table turns it off. A failure is
    logged: a checkpoint is an optimisation, and the next interval tries again."""
    interval = int(config.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL))
    if interval <= 0 or version % interval:
        return
    try:
        from deltalake import DeltaTable

        table = DeltaTable(str(table_dir))
        table.create_checkpoint()
        due = any(cleans_log(v) for v in range(version - interval + 1, version + 1))
        if due and log_cleanup_enabled(config):
            table.cleanup_metadata()
    except Exception as exc:  # noqa: BLE001 (see the docstring)
        log.warning("%s: could not write the checkpoint of version %d: %s", table_dir, version, exc)
