"""The chunk planner of a chunked bootstrap: the snapshot at a pinned version, split into groups of
its data files. Pure: no Spark.

On the fast path (``bootstrap.internal_file_reads``) a chunk is a group of the source's data files at
the pinned version V; on the default, public path it is a range of the key
(:mod:`lakemirror.sources.key_ranges`). The plan is a function of
the file list alone (sorted by path, grouped greedily up to a byte target), so planning again
from the same version gives the same chunks; the plan is nevertheless saved with the table's
bootstrap state (:mod:`lakemirror.checkpoints.bootstrap_state`) so a restart never re-plans.

Each chunk is committed to the replica under a Delta transaction id of its own
(:func:`chunk_app_id`), which is why chunks of one table can commit in any order and in parallel:
Delta skips a write whose version is not above the one recorded for its app id, so chunks sharing
one app id (version = chunk number) would skip an earlier chunk committed after a later one, and
would conflict with each other (``ConcurrentTransactionException``) when committed at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from lakemirror.sources.key_ranges import KeyRange

#: Default byte target of one chunk: large enough that a chunk's fixed overheads (its commit and its
#: Spark jobs) stay small against its copy, small enough that a crash redoes little
#: (``make bench ONLY=bootstrap_chunked`` bootstraps with it and with the smallest chunks).
DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    """One data file of the source at the pinned version, as its log lists it."""

    path: str            # as in the log's ``add`` action (relative to the table, or absolute)
    size_bytes: int
    rows: int | None = None  # from the file's statistics; None when the writer wrote none


@dataclass(frozen=True)
class Chunk:
    number: int                  # 0, 1, 2, ... in plan order
    paths: tuple[str, ...]
    size_bytes: int
    rows: int | None             # None: some file has no row count
    #: Set on the public read path: the chunk is these rows of the key (its ``paths`` stay empty).
    key_range: KeyRange | None = None

    @property
    def whole_table(self) -> bool:
        """The chunk is the whole snapshot (a table copied in one chunk)."""
        return not self.paths and (self.key_range is None or self.key_range.predicate() is None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"number": self.number, "paths": list(self.paths), "size_bytes": self.size_bytes,
                               "rows": self.rows}
        if self.key_range is not None:
            out["key_range"] = self.key_range.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Chunk":
        rows = data.get("rows")
        key_range = data.get("key_range")
        return cls(int(data["number"]), tuple(str(p) for p in data["paths"]), int(data["size_bytes"]),
                   None if rows is None else int(rows), None if key_range is None else KeyRange.from_json(key_range))


def plan_chunks(files: Iterable[SourceFile], target_bytes: int = DEFAULT_CHUNK_BYTES) -> tuple[Chunk, ...]:
    """Group ``files`` (sorted by path) into chunks of about ``target_bytes`` each.

    A file is never split: one larger than the target is a chunk of its own. A table with no
    files (empty) still has one, empty, chunk: the first chunk creates the replica."""
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, not {target_bytes}")
    ordered = sorted(files, key=lambda f: f.path)
    if len({f.path for f in ordered}) != len(ordered):
        raise ValueError("the file list names a file twice")
    groups: list[list[SourceFile]] = []
    size = 0
    for f in ordered:
        if not groups or (size + f.size_bytes > target_bytes and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(f)
        size += f.size_bytes
    if not groups:
        groups = [[]]
    return tuple(_chunk(n, g) for n, g in enumerate(groups))


def _chunk(number: int, files: Sequence[SourceFile]) -> Chunk:
    rows = None if any(f.rows is None for f in files) else sum(f.rows or 0 for f in files)
    return Chunk(number, tuple(f.path for f in files), sum(f.size_bytes for f in files), rows)


def chunk_app_id(bootstrap_app_id: str, number: int) -> str:
    """The Delta transaction app id chunk ``number`` is committed under (its version is the chunk
    number too). ``bootstrap_app_id`` names pipeline, table and epoch, so a new epoch's chunks are
    never mistaken for an old epoch's."""
    return f"{bootstrap_app_id}/chunk/{number}"


def chunk_number(bootstrap_app_id: str, app_id: str) -> int | None:
    """The chunk number ``app_id`` names under ``bootstrap_app_id``; None for any other app id."""
    prefix = f"{bootstrap_app_id}/chunk/"
    if not app_id.startswith(prefix):
        return None
    tail = app_id[len(prefix):]
    return int(tail) if tail.isdigit() else None


def bootstrap_app_id(stream_app_id: str) -> str:
    """The app id family of a table epoch's bootstrap writes, beside the stream's own app id."""
    return f"{stream_app_id}/bootstrap"
