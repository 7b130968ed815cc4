"""Repairs to a Structured Streaming checkpoint directory before a query starts on it.

Spark writes each offset and commit file to a hidden temporary file (``.<n>.<uuid>.tmp``) and
renames it into place. A query stopped (a drain, a turn halted) or killed while writing leaves the
temporary file behind. Spark never reads such files, but since Spark 4 a query that starts at
batch 0 refuses a non-empty ``offsets`` directory (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``),
so one interrupted write of the first offset would fail the table on every retry, forever. The
files are partial writes nobody will finish: removing them before the table's query starts (no
other query runs on a table's checkpoint) loses nothing.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark's checkpoint file manager names its temporary files ``.<final name>.<uuid>.tmp``.
_INTERRUPTED = re.compile(r"^\..+\.tmp$")
LOG_DIRS = ("offsets", "commits")


def interrupted_writes(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that are temporary files of a write that never finished."""
    return sorted(n for n in names if _INTERRUPTED.match(n))


def remove_interrupted_writes(spark: "SparkSession", checkpoint: str) -> list[str]:
    """Delete the leftover temporary files of ``checkpoint``'s offset and commit logs.

    Returns the paths removed. A no-op where there is no JVM (Spark Connect: the server owns the
    checkpoint) or the directory does not exist yet."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return []
    path = jvm.org.apache.hadoop.fs.Path
    root = path(checkpoint)
    fs = root.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    removed = []
    for sub in LOG_DIRS:
        folder = path(root, sub)
        if not fs.exists(folder):
            continue
        names = [status.getPath().getName() for status in fs.listStatus(folder)]
        for name in interrupted_writes(names):
            target = path(folder, name)
            if fs.delete(target, False):
                removed.append(str(target))
    return removed
