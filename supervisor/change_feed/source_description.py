"""The source's description for one launch: the one an earlier launch kept, while the source's log
shows it still holds (:mod:`lakemirror.sources.described`), else read by Spark and kept for the next.

Only a table's first launch in a process reuses a kept description: a relaunch (a retry after a
failure, a resume, a resync, a restart for new columns) describes the table afresh, so a table that
failed is never retried on what was read before it failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from lakemirror.checkpoints.descriptions import DescriptionStore
from lakemirror.sources.catalog import TableInfo
from lakemirror.sources.contract import ChangeSource
from lakemirror.delta_log.commit_files import CommitFiles
from lakemirror.sources.described import Described, stale
from lakemirror.tables import TableLocation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceDescription:
    """Describes one source table, reusing a kept description where it can (see the module docstring)."""

    source: ChangeSource[Any]
    location: TableLocation
    #: The source's commit files (None: not readable by the driver: every launch describes by Spark).
    commits: CommitFiles | None
    store: DescriptionStore | None
    slug: str
    label: str

    def describe(self, reuse: bool = True) -> TableInfo:
        """The table's description: the kept one when ``reuse`` and it still holds, else Spark's."""
        commits, store = self.commits, self.store
        if commits is None or store is None:
            return self.source.describe()
        kept = Described.from_json(store.load(self.slug)) if reuse else None
        newest: int | None = None
        commit: bytes | None = None
        try:
            if kept is not None:
                why = stale(kept, commits.read)
                if why is None:
                    log.debug("table %s: the description of version %d is reused: no commit since changes the "
                              "table's metadata", self.label, kept.version)
                    return kept.info(self.location)
                log.info("table %s: describing the source again: %s", self.label, why)
            newest = commits.newest()
            commit = commits.read(newest) if newest is not None else None
        except OSError as exc:  # an unreadable log: Spark's description is the answer (and names the problem)
            log.info("table %s: cannot read the source's commit files: %s", self.label, exc)
            newest = None
        info = self.source.describe()
        if newest is not None and commit is not None:
            store.save(self.slug, Described.of(info, newest, commit).as_json())
        return info
