"""A lag probe that reads the source's commit files directly: no Spark job.

Reading a table's history through Delta (``DeltaTable.history``) updates its snapshot, a Spark
job per probe whenever the table has new commits, for every table at every probe interval. Lag
only needs the newest version
and the commit time of the oldest unapplied one. For a path-based table both come from the
``_delta_log`` directory itself, through Hadoop's FileSystem: whether ``<version>.json`` exists
and when it was written (a commit file is written once, at its commit: its modification time is
the commit's time, the same one Delta's history reports for tables without in-commit timestamps).

:func:`probe_head` is the pure part: it walks forward from the newest version known so far,
one file status per version, and gives up (``None``: use the history read) when the table moved
further than ``max_steps``, when a version it relies on has no commit file (log cleanup, or a
table recreated under the same path), or when the table is not path-based.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from lakemirror.sources import change_feed
from lakemirror.sources.change_feed import SourceHead
from lakemirror.tables import LOG_DIR, TableLocation, commit_file_name, has_own_jvm, is_local_table, local_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The commit time of a version, or None when its commit file does not exist.
CommitTime = Callable[[int], "float | None"]


def probe_head(commit_time: CommitTime, *, applied_through: int, known_latest: int | None,
               cache: dict[int, float], max_steps: int = 64) -> SourceHead | None:
    """The newest version and the commit time of ``applied_through + 1`` (when committed).

    ``cache`` keeps commit times across probes (a commit's time never changes) and is updated.
    """
    def time_of(version: int) -> float | None:
        if version not in cache:
            found = commit_time(version)
            if found is None:
                return None
            cache[version] = found
        return cache[version]

    latest = max(applied_through, known_latest if known_latest is not None else applied_through)
    start = commit_time(latest)  # always read afresh: a cached time cannot prove the file is there
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


class CommitLog(Protocol):
    """A table's commit files, checked one version at a time."""

    def has_commit(self, version: int) -> bool: ...

    def commit_time(self, version: int) -> float | None: ...


def commit_log_for(spark: "SparkSession", loc: TableLocation) -> "CommitLog | None":
    """The commit files of ``loc``: stat'ed by this process when the driver sees the table's
    directory, else through the JVM's Hadoop FileSystem; None where neither can work."""
    return LocalCommitLog.for_table(loc) or HadoopCommitLog.for_table(spark, loc)


class LocalCommitLog:
    """Commit files of a table on the driver's own file system, stat'ed in this process.

    The embedded default's lag probe and turn checks run every second per table; through py4j
    each check was a round trip into the JVM (and a missing file a Java exception carried back),
    for a question the operating system answers directly with one ``stat``. The times are
    Hadoop's: the file's modification time in whole milliseconds.
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir

    @classmethod
    def for_table(cls, loc: TableLocation) -> "LocalCommitLog | None":
        """None unless ``loc`` is a path-based table whose log directory this process can see."""
        if loc.path is None or not is_local_table(loc.path):
            return None
        directory = local_dir(loc.path)
        assert directory is not None  # a local table's location is a local directory
        return cls(directory / LOG_DIR)

    def _commit_file(self, version: int) -> Path:
        return self._log_dir / commit_file_name(version)

    def has_commit(self, version: int) -> bool:
        return self._commit_file(version).exists()

    def commit_time(self, version: int) -> float | None:
        try:
            return (os.stat(self._commit_file(version)).st_mtime_ns // 1_000_000) / 1000.0
        except FileNotFoundError:
            return None


class HadoopCommitLog:
    """Commit files of a path-based Delta table, stat'ed through the JVM's Hadoop FileSystem.

    On an object store, Hadoop's ``exists`` and ``getFileStatus`` of a missing file also probe the
    path as a directory (s3a: a HEAD, then a LIST), and a missing file is what these checks find
    most: an idle table's next version, looked for several times a second by the turn pool and
    once a second by the lag probe. So a version not yet seen committed is first probed by opening
    its file (Hadoop's ``openFile``, which on s3a is the HEAD alone and reads nothing until asked):
    an idle table then costs HEAD requests only, no LIST (the cheap request class, and the light
    one for the store; ``scripts/measure-s3-costs.py batch``).
    """

    def __init__(self, fs: Any, commit_file: Callable[[int], object]) -> None:
        """``fs``: a Hadoop ``FileSystem`` (a py4j handle); ``commit_file``: a version's file (a Hadoop ``Path``)."""
        self._fs = fs
        self._commit_file = commit_file
        self._open_probe = True               # False once the file system refuses ``openFile``
        self._newest_seen: int | None = None  # the newest version seen committed

    @classmethod
    def for_table(cls, spark: "SparkSession", loc: TableLocation) -> "HadoopCommitLog | None":
        """None where it cannot work: a table known only by name, or Spark Connect (no JVM)."""
        if loc.path is None or not has_own_jvm(spark):
            return None
        try:
            jvm = spark._jvm
            assert jvm is not None  # has_own_jvm
            path = jvm.org.apache.hadoop.fs.Path
            log_dir = path(loc.path.rstrip("/") + "/" + LOG_DIR)
            fs = log_dir.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
            return cls(fs, lambda version: path(log_dir, commit_file_name(version)))
        except Exception:  # noqa: BLE001 (the history read remains)
            return None

    def has_commit(self, version: int) -> bool:
        """Whether ``version`` is committed: one probe of its file, never a directory listing."""
        found = self._file_exists(self._commit_file(version))
        if found and self._unseen(version):
            self._newest_seen = version
        return found

    def commit_time(self, version: int) -> float | None:
        """The commit file's modification time; None when it does not exist. A version beyond the
        newest seen committed is probed first (see the class), one seen before is stat'ed at once."""
        if self._unseen(version) and not self.has_commit(version):
            return None
        try:
            status = self._fs.getFileStatus(self._commit_file(version))
        except Exception as exc:  # noqa: BLE001 (py4j wraps java.io.FileNotFoundException)
            if _not_found(exc):
                return None
            raise
        return float(status.getModificationTime()) / 1000.0

    def _unseen(self, version: int) -> bool:
        """Whether ``version`` is beyond the newest version seen committed (or none was seen yet)."""
        return self._newest_seen is None or version > self._newest_seen

    def _file_exists(self, path: object) -> bool:
        if self._open_probe:
            try:
                stream = self._fs.openFile(path).build().get()
            except Exception as exc:  # noqa: BLE001 (py4j wraps the file system's answer)
                if _not_found(exc):
                    return False
                if not _unsupported(exc):
                    raise
                self._open_probe = False  # a file system without openFile: exists() from now on
            else:
                stream.close()
                return True
        return bool(self._fs.exists(path))


def _not_found(exc: Exception) -> bool:
    return "FileNotFoundException" in str(exc)


def _unsupported(exc: Exception) -> bool:
    text = str(exc)
    return "UnsupportedOperationException" in text or "AbstractMethodError" in text or "does not exist in the JVM" in text
