"""A source's description kept between launches, and reused while the source's log shows it still holds.

Describing a Delta table through Spark (``DESCRIBE DETAIL`` and the schema of a read) rebuilds the
table's snapshot, a Spark job on a source whose writer leaves no checksum files, and on a restarted
daemon's cold JVM it was most of each table's launch: 81 of 84 s for one table on the loaded 2-core
machine (``make bench ONLY=startup``). Yet between two runs a source's description almost never
changes: everything it holds (the table id, the columns, the properties, the declared key in its
property) comes from the table's latest ``metaData`` action. So a description is kept with the
version it was read at (the newest commit before it was read) and a digest of that version's commit
file, and a later launch reuses it while (:func:`stale` says why not):

- that commit file is still there, unchanged: a table dropped and recreated under the same location
  has other commit files under the same version numbers (their digests differ), and a cleaned-up
  log no longer proves anything;
- no commit since carries a ``metaData`` or ``protocol`` action (a schema, property or feature
  change), looked for in at most :data:`MAX_COMMITS` commits.

A description read while a commit landed is kept under the version before it, so whatever that
commit changed makes the next launch describe the table afresh. Only tables whose commit files the
driver reads itself are kept (a path on its file system,
:class:`~lakemirror.delta_log.commit_files.LocalCommitFiles`): a table known by name may have a
declared key outside its log (a Unity Catalog constraint).

Pure: the commit files are read by the caller (:mod:`lakemirror.delta_log.commit_files`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from lakemirror.delta_log.commit_files import changes_metadata, digest
from lakemirror.schema import Column
from lakemirror.sources.catalog import TableInfo
from lakemirror.tables import TableLocation

#: The most commits read past the kept version before the table is described afresh instead.
MAX_COMMITS = 1_000
#: The format of a kept description (a file of another format is ignored: the table is described).
FORMAT = 1


@dataclass(frozen=True)
class Described:
    """A table's description as read at ``version`` (whose commit file's digest is ``digest``)."""

    version: int
    digest: str
    table_id: str | None
    columns: tuple[Column, ...]
    properties: Mapping[str, str]
    declared_key: tuple[str, ...] = ()

    @classmethod
    def of(cls, info: TableInfo, version: int, commit: bytes) -> "Described":
        return cls(version, digest(commit), info.table_id, tuple(info.columns), dict(info.properties),
                   tuple(info.declared_key))

    def info(self, location: TableLocation) -> TableInfo:
        """The description, as the catalog's ``describe`` gives it."""
        return TableInfo(location, self.table_id, self.columns, dict(self.properties), self.declared_key)

    def as_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": self.version, "digest": self.digest, "table_id": self.table_id,
                "columns": [[c.name, c.type, c.nullable] for c in self.columns],
                "properties": dict(self.properties), "declared_key": list(self.declared_key)}

    @classmethod
    def from_json(cls, data: Any) -> "Described | None":
        """The kept description, or None when ``data`` is not one (another format, a damaged file)."""
        try:
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                return None
            columns = tuple(Column(str(name), str(kind), bool(nullable)) for name, kind, nullable in data["columns"])
            properties = {str(k): str(v) for k, v in dict(data["properties"]).items()}
            table_id = data["table_id"]
            return cls(int(data["version"]), str(data["digest"]), None if table_id is None else str(table_id),
                       columns, properties, tuple(str(k) for k in data["declared_key"]))
        except (KeyError, TypeError, ValueError):
            return None


def stale(kept: Described, read: Callable[[int], bytes | None], max_commits: int = MAX_COMMITS) -> str | None:
    """Why ``kept`` no longer describes the table whose commit files ``read`` gives (None for a
    version that has none); None when it still does (see the module docstring)."""
    commit = read(kept.version)
    if commit is None:
        return f"the commit file of version {kept.version} is gone"
    if digest(commit) != kept.digest:
        return f"the commit file of version {kept.version} is not the one described (the table was recreated)"
    for version in range(kept.version + 1, kept.version + max_commits + 1):
        commit = read(version)
        if commit is None:
            return None
        if changes_metadata(commit):
            return f"version {version} changes the table's metadata or protocol"
    return f"more than {max_commits} commits since version {kept.version}"
