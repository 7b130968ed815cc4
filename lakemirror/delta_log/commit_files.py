"""A Delta table's commit files, read one version at a time: their bytes, their digest, their shape.

A table on the driver's file system is read with plain file reads (:class:`LocalCommitFiles`,
:class:`LocalCommitActions`); a table in S3 through delta-rs's own object store
(``deltalake.fs.DeltaStorageHandler``, :class:`StoreCommitActions`), with the storage options derived
from the session's s3a settings (:func:`lakemirror.object_store.delta_rs_target`), one GET a commit
file, so both engines reach the bucket with one set of settings. A commit file is written once and
never changes, so the store reader keeps each one it read (a few hundred).

What is read of a commit: its bytes and their digest (a table dropped and recreated under the same
location has other commits under the same version numbers), whether it carries a ``metaData`` or
``protocol`` action (:func:`changes_metadata`), and its shape for the stream's offsets
(:func:`lakemirror.delta_log.stream_offsets.version_shape`).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping, Protocol

from lakemirror.delta_log.layout import LOG_DIR, commit_file_name, commit_versions
from lakemirror.delta_log.stream_offsets import VersionShape, version_shape
from lakemirror.tables import TableLocation, is_local_path, is_local_table, local_dir

#: Commit files kept in memory per table (each a few KB).
KEPT_COMMITS = 256
#: How the names of the actions :func:`changes_metadata` looks for appear in a commit's line.
_METADATA_ACTIONS = ('"metaData"', '"protocol"')


def digest(commit: bytes) -> str:
    """The digest of a commit file's bytes."""
    return hashlib.sha256(commit).hexdigest()


def changes_metadata(commit: bytes) -> bool:
    """Whether a commit file carries a ``metaData`` or ``protocol`` action (one JSON action a line).
    An unreadable commit counts as a change: the table is then described afresh."""
    try:
        text = commit.decode("utf-8")
    except UnicodeDecodeError:
        return True
    for line in text.splitlines():
        if not line.strip() or not any(name in line for name in _METADATA_ACTIONS):
            continue
        try:
            action = json.loads(line)
        except ValueError:
            return True
        if not isinstance(action, dict) or "metaData" in action or "protocol" in action:
            return True
    return False


class CommitFiles(Protocol):
    """A table's commit files, read one version at a time."""

    def read(self, version: int) -> bytes | None:
        """The commit file of ``version``; None when there is none."""
        ...

    def newest(self) -> int | None:
        """The newest version with a commit file; None when the log has none."""
        ...


def local_log_dir(location: TableLocation) -> Path | None:
    """The log folder of a path-based table whose log this (the driver's) process can read, else None."""
    if location.path is None or not is_local_table(location.path):
        return None
    folder = local_dir(location.path)
    assert folder is not None  # a local table's location is a local directory
    return folder / LOG_DIR


class LocalCommitFiles:
    """The commit files of a table on the driver's own file system."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir

    @classmethod
    def for_table(cls, location: TableLocation) -> "LocalCommitFiles | None":
        """None unless ``location`` is a path-based table whose log this process can read."""
        log_dir = local_log_dir(location)
        return None if log_dir is None else cls(log_dir)

    def read(self, version: int) -> bytes | None:
        try:
            return (self.log_dir / commit_file_name(version)).read_bytes()
        except FileNotFoundError:
            return None

    def newest(self) -> int | None:
        versions = commit_versions(self.log_dir)
        return max(versions) if versions else None


class MemoryCommitFiles:
    """The twin: commit files as bytes by version (a test writes, drops or rewrites them)."""

    def __init__(self, commits: Mapping[int, bytes] | None = None) -> None:
        self.commits: dict[int, bytes] = dict(commits or {})
        self.reads = 0

    def read(self, version: int) -> bytes | None:
        self.reads += 1
        return self.commits.get(version)

    def newest(self) -> int | None:
        return max(self.commits) if self.commits else None


class LocalCommitActions:
    """The shapes of a local Delta table's commits, read from its ``_delta_log`` directory."""

    def __init__(self, table_path: str) -> None:
        self.log_dir = Path(table_path) / LOG_DIR

    def shape(self, version: int) -> VersionShape | None:
        try:
            with open(self.log_dir / commit_file_name(version), encoding="utf-8") as commit:
                return version_shape(json.loads(line) for line in commit if line.strip())
        except (OSError, ValueError):
            return None


class StoreCommitActions:
    """The commits of the Delta table at ``uri`` (a delta-rs URI such as ``s3://…``, or a local path)."""

    def __init__(self, uri: str, options: Mapping[str, str] | None = None) -> None:
        from deltalake.fs import DeltaStorageHandler

        self.uri = uri
        self._store = DeltaStorageHandler(uri, dict(options) if options else None)
        self._kept: "OrderedDict[int, bytes]" = OrderedDict()

    def commit_bytes(self, version: int, fresh: bool = False) -> bytes | None:
        """The commit file of ``version``; None when it does not exist. ``fresh``: read it again."""
        if not fresh and version in self._kept:
            self._kept.move_to_end(version)
            return self._kept[version]
        try:
            with self._store.open_input_file(f"{LOG_DIR}/{commit_file_name(version)}") as handle:
                data = bytes(handle.read())
        except FileNotFoundError:
            return None
        self._kept[version] = data
        while len(self._kept) > KEPT_COMMITS:
            self._kept.popitem(last=False)
        return data

    def shape(self, version: int) -> VersionShape | None:
        data = self.commit_bytes(version)
        if data is None:
            return None
        try:
            return version_shape(json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip())
        except (UnicodeDecodeError, ValueError):
            return None

    def fingerprint(self, version: int, fresh: bool = False) -> str | None:
        """A digest of ``version``'s commit file (None: it does not exist): a table dropped and
        recreated under the same location has other commits under the same version numbers."""
        data = self.commit_bytes(version, fresh)
        return None if data is None else digest(data)


def commit_actions_for(uri: str, options: Mapping[str, str] | None = None) -> Any:
    """Plain file reads for a local table, delta-rs's object store for one in S3."""
    folder = local_dir(uri) if is_local_path(uri) else None
    return LocalCommitActions(str(folder)) if folder is not None and not options else StoreCommitActions(uri, options)
