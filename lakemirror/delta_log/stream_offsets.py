"""Delta's streaming source offsets, and which source versions a change-feed batch holds whole.

The driver path can read a batch's change rows with delta-rs (:mod:`lakemirror.sources.driver_feed`)
instead of Spark, a tenth of the time, but only if it reads exactly the rows Spark planned. Spark
plans a batch between two offsets of Delta's streaming source, ``(reservoirVersion, index)``: the
batch holds every file *after* the start offset up to and including the end offset, where a
version's files are numbered 0, 1, ... in its commit and ``-1`` stands before the first one. The
start offset is the previous batch's end offset (both are in the query's ``offsets`` log).

A rate limit (``maxFilesPerTrigger``, ``maxBytesPerTrigger``) may split a version between batches.
Delta admits a version that has change-data (``cdc``) files whole, but one without them (an
append, a whole-file delete) file by file. So a batch is a range of whole versions only when both
of its offsets fall on version boundaries: ``-1``, or the version's last file index. This module
answers that from the commit files: :func:`batch_versions` gives the range, or the reason to leave
the batch to Spark's read. It never guesses: an offset it cannot place, a version whose commit
file is gone, or a commit delta-rs might read differently from Spark sends the batch to Spark.

A version's files are numbered as Delta's source numbers them (``DeltaSourceCDCSupport``): a
commit with ``cdc`` actions counts those; any other counts its ``add`` and ``remove`` actions with
``dataChange`` set. The reasons a commit is left to Spark even when whole
(:func:`version_shape`): a metadata or protocol action (a schema or feature change), a deletion
vector on a commit without ``cdc`` files (Spark derives those rows from the vectors), and a MERGE
that reports no changed rows (Spark serves no rows for its rewritten files).

The same offsets say which source versions are fully applied once the batch that reached one has
committed (:func:`applied_through_from_offset`): every version strictly below its
``reservoirVersion``, and that version too when the offset stands at its last file index.

The daemon also writes such offsets itself, for the batches it plans from the commit files
(:func:`end_offset`, :mod:`lakemirror.sources.feed_plan`): Delta's ``DeltaSourceOffset`` format,
version :data:`SOURCE_OFFSET_VERSION`, so that Spark's next plan continues from them.

Pure: no Spark, no delta-rs, no file access (:mod:`lakemirror.delta_log.commit_files` reads the
commit files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

#: The index of an offset that stands before a version's first file.
BASE_INDEX = -1
#: The source offset format Delta's streaming source writes for a plain index (``DeltaSourceOffset``).
SOURCE_OFFSET_VERSION = 1

#: The metrics whose all-zero values make Delta serve no rows for a MERGE's file actions.
_MERGE_CHANGE_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")


@dataclass(frozen=True)
class SourceOffset:
    """A Delta streaming source offset: files of ``version`` up to ``index`` are read."""

    version: int
    index: int
    starting: bool = False  # the offset of an initial snapshot (``isStartingVersion``)
    table_id: str | None = None  # the id of the table the offset is in (``reservoirId``)

    @classmethod
    def parse(cls, text: str | Mapping[str, Any]) -> "SourceOffset":
        data = json.loads(text) if isinstance(text, str) else text
        return cls(int(data["reservoirVersion"]), int(data["index"]), bool(data.get("isStartingVersion", False)),
                   data.get("reservoirId"))


@dataclass(frozen=True)
class VersionShape:
    """What :func:`batch_versions` needs of one commit."""

    files: int | None          # the number of file indexes Delta's source gives it; None: not sure
    unfit: str | None = None   # why delta-rs's read of it might differ from Spark's; None: it will not


@dataclass(frozen=True)
class VersionRange:
    """Source versions ``first`` to ``last``, both included; empty when ``first > last``."""

    first: int
    last: int

    @property
    def empty(self) -> bool:
        return self.first > self.last


def end_offset(table_id: str, last_version: int) -> dict[str, Any]:
    """Delta's streaming source offset after every file of ``last_version``: before the next version."""
    return {"sourceVersion": SOURCE_OFFSET_VERSION, "reservoirId": table_id, "reservoirVersion": last_version + 1,
            "index": BASE_INDEX, "isStartingVersion": False}


def reservoir_version(offset: str | None) -> int | None:
    """The source version an offset (its JSON text) stands in; None without one. A text that is not
    JSON raises ``ValueError``."""
    parsed = json.loads(offset) if offset is not None else None
    if isinstance(parsed, dict) and "reservoirVersion" in parsed:
        return int(parsed["reservoirVersion"])
    return None


def touched_through_from_offset(offset: str | None) -> int | None:
    """The newest source version any of whose changes are read once the stream reaches ``offset`` (its
    JSON text): the offset's version when it stands inside it (a file index of 0 or more: a rate limit
    split it, some of its files are read), else the version before it; None without one. A text that
    is not JSON raises ``ValueError``. (:func:`applied_through_from_offset` answers the version fully
    applied.)"""
    parsed = json.loads(offset) if offset is not None else None
    if not isinstance(parsed, dict) or "reservoirVersion" not in parsed:
        return None
    version = int(parsed["reservoirVersion"])
    return version if int(parsed.get("index", BASE_INDEX)) >= 0 else version - 1


def applied_through_from_offset(offset: Mapping[str, Any] | str | None,
                                files_in_version: int | None = None) -> int | None:
    """The highest source version fully applied at ``offset``, or None if it cannot be told.

    ``files_in_version``: how many file indexes the offset's version has, where known. Delta's
    ``DeltaSource`` ends a batch that read a whole version at that version's last file index (not at
    the next version's ``-1``): that version is then fully applied too."""
    if offset is None:
        return None
    if isinstance(offset, str):
        offset = json.loads(offset)
    assert not isinstance(offset, str)
    if "reservoirVersion" not in offset:
        return None
    version = int(offset["reservoirVersion"])
    index = int(offset.get("index", BASE_INDEX))
    if files_in_version is not None and index >= 0 and index == files_in_version - 1:
        return version
    return version - 1


def version_shape(actions: Iterable[Mapping[str, Any]]) -> VersionShape:
    """The shape of one commit from its actions (the parsed lines of its commit file)."""
    cdc = files = 0
    vectors = metadata = unknown = False
    commit_info: Mapping[str, Any] = {}
    for action in actions:
        if "cdc" in action:
            cdc += 1
        elif "add" in action or "remove" in action:
            file = action.get("add") or action.get("remove") or {}
            unknown = unknown or "dataChange" not in file
            if file.get("dataChange", True):
                files += 1
                vectors = vectors or file.get("deletionVector") is not None
        elif "metaData" in action or "protocol" in action:
            metadata = True
        elif "commitInfo" in action:
            commit_info = action["commitInfo"] or {}
    count = cdc if cdc else (None if unknown else files)
    if metadata:
        return VersionShape(count, "it changes the table's metadata or protocol")
    if cdc:
        return VersionShape(count)
    if unknown:
        return VersionShape(count, "a file action has no dataChange flag")
    if vectors:
        return VersionShape(count, "it carries deletion vectors without change-data files")
    metrics = commit_info.get("operationMetrics") or {}
    if commit_info.get("operation") == "MERGE" and all(str(metrics.get(m)) == "0" for m in _MERGE_CHANGE_METRICS):
        return VersionShape(count, "it is a MERGE that changed no row")
    return VersionShape(count)


def batch_versions(start: SourceOffset | None, end: SourceOffset, after_version: int,
                   shape: Callable[[int], VersionShape | None]) -> VersionRange | str:
    """The whole versions a batch between ``start`` and ``end`` holds, or why that cannot be told.

    ``start`` is None for a query's first batch, which starts at its ``startingVersion``,
    ``after_version`` (the stream also drops that version's rows: every batch holds only versions
    after it). ``shape`` gives a version's shape, or None when its commit file cannot be read.
    """
    if end.starting or (start is not None and start.starting):
        return "the batch reads an initial snapshot"
    shapes: dict[int, VersionShape | None] = {}

    def shape_of(version: int) -> VersionShape | None:
        if version not in shapes:
            shapes[version] = shape(version)
        return shapes[version]

    def last_file(offset: SourceOffset) -> bool | None:
        """Whether ``offset`` is at its version's last file; None: the commit cannot be told."""
        found = shape_of(offset.version)
        return None if found is None or found.files is None else offset.index == found.files - 1

    if start is None:
        first = after_version
    elif start.index == BASE_INDEX:
        first = start.version
    else:
        whole = last_file(start)
        if whole is None:
            return f"the commit file of version {start.version} cannot be read or counted"
        if not whole:
            return f"the batch starts inside version {start.version} (file index {start.index})"
        first = start.version + 1
    if end.index == BASE_INDEX:
        last = end.version - 1
    else:
        whole = last_file(end)
        if whole is None:
            return f"the commit file of version {end.version} cannot be read or counted"
        if not whole:
            return f"the batch ends inside version {end.version} (file index {end.index})"
        last = end.version
    first = max(first, after_version + 1)
    for version in range(first, last + 1):
        found = shape_of(version)
        if found is None:
            return f"the commit file of version {version} cannot be read"
        if found.unfit is not None:
            return f"version {version}: {found.unfit}"
    return VersionRange(first, last)
