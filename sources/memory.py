"""The in-memory twin of a change source (:class:`~lakemirror.sources.contract.ChangeSource`).

A table held as a list of commits, each a list of change-feed rows, with Delta's semantics:
version 0 creates the table, ``snapshot(v)`` is the table as of ``v``, ``changes(v)`` are the
rows of every commit after ``v`` (``update_preimage`` rows included, as Delta writes them).
Unit tests drive the runner's preparation, bootstrap and batch apply with it, without Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sources.catalog import CDF_PROPERTY, TableInfo
from lakemirror.sources.change_feed import SourceHead
from lakemirror.sources.contract import CDF_CHANGE_TYPE, CDF_COMMIT_VERSION, CDF_PREIMAGE
from lakemirror.tables import TableLocation

Row = dict[str, Any]


@dataclass
class MemoryCommitLog:
    """Commit files of a :class:`MemoryChangeSource`: one per version, each with its commit time."""

    times: dict[int, float]
    answers_locally = True

    def has_commit(self, version: int) -> bool:
        return version in self.times

    def commit_time(self, version: int) -> float | None:
        return self.times.get(version)


@dataclass
class MemoryChangeSource:
    """One source table in memory. ``table_id`` changes when a test "recreates" the table."""

    location: TableLocation
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    table_id: str = "table-1"
    properties: dict[str, str] = field(default_factory=lambda: {CDF_PROPERTY: "true"})
    commits: list[list[Row]] = field(default_factory=lambda: [[]])   # version 0: the empty table
    times: list[float] = field(default_factory=lambda: [0.0])
    #: The ``options`` of each :meth:`changes` call, in order (what the stream was started with).
    streams: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> TableName:
        return self.location.name

    def leave_kernel_mode(self, batch: Any) -> None:
        """Nothing: the twin's batches are lists of rows, read by no streaming source."""

    def commit(self, rows: Sequence[Mapping[str, Any]], at: float | None = None) -> int:
        """Append a commit of change rows (each with ``_change_type``); returns its version."""
        version = len(self.commits)
        self.commits.append([{**r, CDF_COMMIT_VERSION: version} for r in rows])
        self.times.append(float(version) if at is None else at)
        return version

    def describe(self) -> TableInfo:
        return TableInfo(self.location, self.table_id, self.columns, dict(self.properties), self.key)

    def enable_change_feed(self) -> None:
        self.properties[CDF_PROPERTY] = "true"
        self.commits.append([])  # a table property change is a commit of its own, without rows
        self.times.append(float(len(self.times)))

    def head(self, since_version: int, window: int = 32) -> SourceHead:
        latest = len(self.commits) - 1
        wanted = set(range(max(0, latest - window + 1), latest + 1)) | set(range(since_version + 1, latest + 1))
        return SourceHead(latest, {v: self.times[v] for v in sorted(wanted)})

    def snapshot(self, version: int) -> list[Row]:
        if not 0 <= version < len(self.commits):
            raise ValueError(f"{self.location.name}: no version {version} (latest {len(self.commits) - 1})")
        rows: dict[tuple[Any, ...], Row] = {}
        for commit in self.commits[:version + 1]:
            for change in commit:
                key = tuple(change[k] for k in self.key)
                if change[CDF_CHANGE_TYPE] == "delete":
                    rows.pop(key, None)
                elif change[CDF_CHANGE_TYPE] != CDF_PREIMAGE:
                    rows[key] = {c.name: change.get(c.name) for c in self.columns}
        return list(rows.values())

    def changes(self, after_version: int, options: Mapping[str, Any] | None = None) -> list[Row]:
        self.streams.append(dict(options or {}))
        return [row for commit in self.commits[after_version + 1:] for row in commit]

    def identity(self, batch: object) -> str | None:
        return self.table_id

    def commit_log(self) -> MemoryCommitLog:
        return MemoryCommitLog(dict(enumerate(self.times)))
