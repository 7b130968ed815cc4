"""When a table's versions were committed, and whether a version is: its commit files, stat'ed.

A commit file is written once, at its commit: its modification time is the commit's time, the one
Delta's history reports for tables without in-commit timestamps. Asking the file system is one
``stat`` (or one request to the store) where Delta's history updates the table's snapshot, a Spark
job whenever the table has new commits. :class:`LocalCommitLog` stats a table on the driver's own
file system; :class:`HadoopCommitLog` asks the JVM's Hadoop FileSystem, for a path-based table
anywhere Hadoop reaches (S3 through s3a). A table known only by name has neither. Where the
store's times are whole seconds (S3), the commit's own time on its first line places it within
its second (:func:`precise_commit_time`).
"""

from __future__ import annotations

import json
import os
import threading
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

    #: A look costs a ``stat``, no request to a store: it may be asked at every scrape.
    answers_locally = True

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

    def __init__(self, fs: Any, commit_file: Callable[[int], object], *, read_head: bool = False) -> None:
        """``fs``: a Hadoop ``FileSystem`` (a py4j handle); ``commit_file``: a version's file (a Hadoop
        ``Path``); ``read_head``: a time in whole seconds is made precise from the commit's first line
        (:func:`precise_commit_time`)."""
        self._fs = fs
        self._commit_file = commit_file
        self._read_head = read_head
        #: Versions' precise times by their store time (a table recreated at the path has new files).
        self._precise: dict[int, tuple[int, float]] = {}
        self._precise_lock = threading.Lock()
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
            return cls(fs, lambda version: path(log_dir, commit_file_name(version)), read_head=True)
        except Exception:  # noqa: BLE001 (the history read remains)
            return None

    def has_commit(self, version: int) -> bool:
        """Whether ``version`` is committed: one probe of its file, never a directory listing; none
        for a version at or below the newest seen committed (the lag probe walks the table's new
        commits every interval, and the turn pool then asks whether the version after the applied
        one is there: a table behind its source costs no request for that answer)."""
        if self.known_committed(version):
            return True
        found = self._file_exists(self._commit_file(version))
        if found and self._unseen(version):
            self._newest_seen = version
        return found

    def known_committed(self, version: int) -> bool:
        """Whether ``version`` was seen committed by a look made before (the turn pool's, the lag
        probe's): no request."""
        return not self._unseen(version)

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
        modified_ms = int(status.getModificationTime())
        if self._read_head and modified_ms % 1000 == 0:
            return self._precise_time(version, modified_ms)
        return modified_ms / 1000.0

    def _precise_time(self, version: int, modified_ms: int) -> float:
        """The commit's time read from its first line once, then kept (a probe stats its newest
        version at every round; an idle table must not cost a read of it each time)."""
        kept = self._precise.get(version)
        if kept is not None and kept[0] == modified_ms:
            return kept[1]
        precise = precise_commit_time(modified_ms, self._head_of(version))
        with self._precise_lock:  # the lag probe's thread and a scrape's may both ask
            self._precise[version] = (modified_ms, precise)
            while len(self._precise) > KEPT_TIMES:
                del self._precise[min(self._precise)]
        return precise

    def _head_of(self, version: int) -> bytes | None:
        """The first bytes of ``version``'s commit file (None: unreadable; the whole-second time stays)."""
        try:
            stream = self._fs.open(self._commit_file(version))
            try:
                return bytes(stream.readNBytes(HEAD_BYTES))
            finally:
                stream.close()
        except Exception:  # noqa: BLE001 (a gone or unreadable file: the file's own time is kept)
            return None

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


#: How much of a commit file is read for its commit time: its first line, the ``commitInfo`` action
#: that Delta's and delta-rs's writers put first.
HEAD_BYTES = 16 * 1024
#: How many versions' precise times a commit log keeps (a probe needs its newest and its oldest unapplied).
KEPT_TIMES = 64


def precise_commit_time(modified_ms: int, head: bytes | None) -> float:
    """A commit's time where the store reports modification times in whole seconds (S3 and s3a: an
    HTTP ``Last-Modified``), which puts a commit up to a second early and a lag up to a second high.

    The commit's own time (``inCommitTimestamp``, else ``timestamp`` of the ``commitInfo`` on its
    first line), taken by its writer just before the file was written, says where in that second
    it was committed; it is used only when it lies in that second, so a writer's clock that is off
    never moves a commit by more than the store's rounding."""
    stamped = _commit_info_time(head)
    if stamped is not None and modified_ms <= stamped < modified_ms + 1000:
        return stamped / 1000.0
    return modified_ms / 1000.0


def _commit_info_time(head: bytes | None) -> int | None:
    if not head:
        return None
    line = head.split(b"\n", 1)[0]
    try:
        info = json.loads(line).get("commitInfo")
    except (ValueError, AttributeError):
        return None  # not a whole line in the bytes read, or not an action
    if not isinstance(info, dict):
        return None
    stamped = info.get("inCommitTimestamp", info.get("timestamp"))
    return stamped if isinstance(stamped, int) and not isinstance(stamped, bool) else None


def _not_found(exc: Exception) -> bool:
    return "FileNotFoundException" in str(exc)


def _unsupported(exc: Exception) -> bool:
    text = str(exc)
    return "UnsupportedOperationException" in text or "AbstractMethodError" in text or "does not exist in the JVM" in text
