"""A Delta table's commit files read through delta-rs's object store: on S3 as on local disk.

:class:`lakemirror.sources.feed_range.LocalCommitActions` reads a local table's commits with plain
file reads; a table in S3 is read here with the storage options derived from the session's s3a
settings (:func:`lakemirror.object_store.delta_rs_target`), one GET a commit file, by delta-rs's own
object store (``deltalake.fs.DeltaStorageHandler``), so both engines reach the bucket with one set of
settings. A commit file is written once and never changes, so each one read is kept (a few hundred).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any, Mapping

from lakemirror.sources.feed_range import LocalCommitActions, VersionShape, version_shape
from lakemirror.tables import LOG_DIR, commit_file_name, is_local_path, local_dir

#: Commit files kept in memory per table (each a few KB).
KEPT_COMMITS = 256


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
        return None if data is None else hashlib.sha256(data).hexdigest()


def commit_actions_for(uri: str, options: Mapping[str, str] | None = None) -> Any:
    """Plain file reads for a local table, delta-rs's object store for one in S3."""
    folder = local_dir(uri) if is_local_path(uri) else None
    return LocalCommitActions(str(folder)) if folder is not None and not options else StoreCommitActions(uri, options)
