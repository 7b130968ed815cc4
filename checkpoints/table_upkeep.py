"""Keeping the checkpoint table's cost per append flat over a daemon's uptime.

Each batch of each table appends one checkpoint row: one small data file and one commit. Nothing
else ever rewrites the table, so its file list grows by a file per batch without end (16 tables
taking turns land several batches a second: tens of thousands of files an hour), the appender holds
that list (loaded once, brought up to date before each append) and every load reads it (a restart,
a compaction): the cost of a batch grows with the daemon's uptime. So the appender itself keeps the
table small:

- every :data:`COMPACT_EVERY_APPENDS` appends of this process, the small files are compacted into
  one (an ``OPTIMIZE`` commit: no row changes, so a concurrent appender of another daemon never
  conflicts with it);
- the files a compaction replaced stay readable for :data:`RETENTION` (the table's
  ``delta.deletedFileRetentionDuration``, set by the appender unless set by hand) and then leave
  the table's checkpoints, so neither the live files nor the remove actions pile up;
- the commit files older than the same retention (``delta.logRetentionDuration``) are deleted
  with each compaction, rather than after each append: delta-rs's clean-up after a commit lists
  the whole log, and the appends skip it (every append otherwise lists a log that grows by a
  commit per batch);
- every :data:`VACUUM_EVERY_COMPACTIONS` compactions, a VACUUM deletes from storage the files no
  version within the retention reads (a reader that began less than the retention ago is never
  cut short).

The table is lakemirror's own record, read in seconds (status, a restart, recovery points) and
never travelled back in: a short retention costs nothing, and it bounds the log an append lists
(a few thousand commits at the busiest).

:class:`UpkeepSchedule` is the pure count; the executor is
:meth:`lakemirror.checkpoints.delta_store.DeltaCheckpointStore._upkeep`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

#: Appends between two compactions: a compaction of this many one-row files takes a fraction of a
#: second, and the file list the appender holds stays this short.
COMPACT_EVERY_APPENDS = 100
#: Compactions between two VACUUMs (each lists the table's folder).
VACUUM_EVERY_COMPACTIONS = 10
#: The checkpoint table's ``delta.deletedFileRetentionDuration`` and ``delta.logRetentionDuration``
#: (:data:`RETENTION_PROPERTIES`): how long a file a compaction replaced, and a commit file, stay.
RETENTION = "interval 15 minutes"
RETENTION_PROPERTIES = ("delta.deletedFileRetentionDuration", "delta.logRetentionDuration")


def missing_retention(configuration: "dict[str, str]") -> dict[str, str]:
    """The retention properties to set on a table that has ``configuration`` (one set by hand stays)."""
    return {name: RETENTION for name in RETENTION_PROPERTIES if name not in configuration}


class Upkeep(Enum):
    NONE = "none"
    COMPACT = "compact"
    COMPACT_AND_VACUUM = "compact and vacuum"


@dataclass
class UpkeepSchedule:
    """What the checkpoint table needs after each append (see the module docstring)."""

    compact_every: int = COMPACT_EVERY_APPENDS
    vacuum_every: int = VACUUM_EVERY_COMPACTIONS
    appends: int = 0
    compactions: int = 0

    def appended(self) -> Upkeep:
        """One more append committed: what to run now."""
        self.appends += 1
        if self.appends < self.compact_every:
            return Upkeep.NONE
        self.appends = 0
        self.compactions += 1
        if self.compactions % self.vacuum_every == 0:
            return Upkeep.COMPACT_AND_VACUUM
        return Upkeep.COMPACT
