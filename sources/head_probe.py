"""A lag probe that reads the source's commit files directly: no Spark job.

Reading a table's history through Delta (``DeltaTable.history``) updates its snapshot, a Spark
job per probe whenever the table has new commits, for every table at every probe interval. Lag
only needs the newest version and the commit time of the oldest unapplied one. For a path-based
table both come from its commit files (:mod:`lakemirror.delta_log.commit_times`): whether a
version's commit file exists and when it was written.

:func:`probe_head` is the pure part: it walks forward from the newest version known so far,
one file status per version, and gives up (``None``: use the history read) when the table moved
further than ``max_steps``, when a version it relies on has no commit file (log cleanup, or a
table recreated under the same path), or when the table is not path-based.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from lakemirror.delta_log.commit_times import CommitLog, commit_log_for
from lakemirror.sources import change_feed
from lakemirror.sources.change_feed import SourceHead
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The commit time of a version, or None when its commit file does not exist.
CommitTime = Callable[[int], "float | None"]


def probe_head(commit_time: CommitTime, *, applied_through: int, known_latest: int | None,
               cache: dict[int, float], max_steps: int = 64, restat_start: bool = True) -> SourceHead | None:
    """The newest version and the commit time of ``applied_through + 1`` (when committed).

    ``cache`` keeps commit times across probes (a commit's time never changes) and is updated.
    ``restat_start``: the version the walk starts from is looked at again even when its time is
    cached, which is what finds a table recreated under the same path with fewer versions (its
    file is gone); without it a cached start costs nothing and only the walk forward is read.
    """
    def time_of(version: int) -> float | None:
        if version not in cache:
            found = commit_time(version)
            if found is None:
                return None
            cache[version] = found
        return cache[version]

    latest = max(applied_through, known_latest if known_latest is not None else applied_through)
    if restat_start or latest not in cache:
        start = commit_time(latest)  # read afresh: a cached time cannot prove the file is there
        if start is None:
            return None  # the version we walk from has no commit file: recreated or cleaned up
        cache[latest] = start
    for _ in range(max_steps):
        if time_of(latest + 1) is None:
            break
        latest += 1
    else:
        return None  # far behind: one history read is cheaper than many file statuses
    needed = applied_through + 1
    times = {latest: cache[latest]}
    if latest >= needed:
        needed_time = time_of(needed)
        if needed_time is None:
            return None
        times[needed] = needed_time
    for old in [v for v in cache if v < applied_through]:
        del cache[old]
    return SourceHead(latest, times)


class HeadReader:
    """A table's head, read from its commit files when this process can (:func:`probe_head`, no
    Spark job), else from its history (:func:`~lakemirror.sources.change_feed.source_head`). It
    remembers the newest version seen (the walk starts there) but no commit time: each head's
    times are read afresh. One per thread."""

    def __init__(self, spark: "SparkSession", loc: TableLocation) -> None:
        self.spark, self.loc = spark, loc
        self._log: CommitLog | None = None
        self._opened = False
        self._known: int | None = None

    def head(self, since_version: int) -> SourceHead:
        """The newest version, and the commit time of ``since_version + 1`` when it is committed
        and still in the log (``since_version`` must be a committed version)."""
        if not self._opened:
            self._log, self._opened = commit_log_for(self.spark, self.loc), True
        found = None
        if self._log is not None:
            found = probe_head(self._log.commit_time, applied_through=since_version, known_latest=self._known,
                               cache={})
        if found is None:
            found = change_feed.source_head(self.spark, self.loc, since_version=since_version, window=1)
        self._known = found.latest_version
        return found
