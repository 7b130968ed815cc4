"""When a table's versions were committed, and whether a version is: its commit files, stat'ed.

A commit file is written once, at its commit: its modification time is the commit's time, the one
Delta's history reports for tables without in-commit timestamps. Asking the file system is one
``stat`` (or one request to the store) where Delta's history updates the table's snapshot, a Spark
job whenever the table has new commits. :class:`LocalCommitLog` stats a table on the driver's own
file system; :class:`HadoopCommitLog` asks the JVM's Hadoop FileSystem, for a path-based table
anywhere Hadoop reaches (S3 through s3a). A table known only by name has neither.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from lakemirror.delta_log.commit_files import local_log_dir
from lakemirror.delta_log.layout import LOG_DIR, commit_file_name
from lakemirror.tables import TableLocation, has_own_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
        log_dir = local_log_dir(loc)
        return None if log_dir is None else cls(log_dir)

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
