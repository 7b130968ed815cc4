"""Repairs to a Structured Streaming checkpoint directory before a query starts on it, and the
file manager Spark writes it with.

Spark writes each offset and commit file to a hidden temporary file (``.<n>.<uuid>.tmp``) and
renames it into place. A query stopped (a drain, a turn halted) or killed while writing leaves the
temporary file behind. Spark never reads such files, but since Spark 4 a query that starts at
batch 0 refuses a non-empty ``offsets`` directory (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``),
so one interrupted write of the first offset would fail the table on every retry, forever. The
files are partial writes nobody will finish: removing them before the table's query starts (no
other query runs on a table's checkpoint) loses nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from lakemirror.tables import is_local_path, local_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark's checkpoint file manager names its temporary files ``.<final name>.<uuid>.tmp``; on a
#: checksummed file system (Hadoop's local one) each has a ``..<final name>.<uuid>.tmp.crc`` beside it.
_INTERRUPTED = re.compile(r"^\..+\.tmp(\.crc)?$")
LOG_DIRS = ("offsets", "commits")

#: The Spark SQL conf that names the class writing a query's checkpoint files.
FILE_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
#: Spark's checkpoint file manager that writes through Hadoop's FileSystem API (the package moved
#: in Spark 4.1), newest first.
FILE_SYSTEM_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)


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


def use_file_system_manager(spark: "SparkSession", checkpoint: str) -> str | None:
    """Have ``spark``'s queries write a local checkpoint through Hadoop's FileSystem API; the class
    chosen, or None (left to Spark) for a checkpoint elsewhere, a manager the user configured, or
    no JVM (Spark Connect: the server owns the checkpoint).

    Spark's default for local paths (FileContext) is several times slower per file than the
    FileSystem API, and every turn writes an offset file and a commit file (``make bench
    ONLY=steady`` measures whole turns). Both write a hidden temporary file and rename it into
    place; a rename on a local POSIX file system is atomic, which is all the log needs.
    """
    jvm = getattr(spark, "_jvm", None)
    if jvm is None or not is_local_path(checkpoint) or spark.conf.get(FILE_MANAGER_CONF, None):
        return None
    for name in FILE_SYSTEM_MANAGERS:
        try:
            jvm.java.lang.Class.forName(name)
        except Exception:  # noqa: BLE001 (not in this Spark: try the next name)
            continue
        spark.conf.set(FILE_MANAGER_CONF, name)
        return name
    return None


def source_offset(entry: str) -> str | None:
    """The (only) source's offset in the text of an ``offsets/<batch id>`` file, or None.

    Spark writes the file as a version line (``v1``), a line of batch metadata, then one line per
    source: its offset, or ``-`` when it has none."""
    lines = entry.splitlines()
    if len(lines) != 3 or not lines[0].startswith("v") or lines[2].strip() in ("", "-"):
        return None
    return lines[2]


def batch_offsets(checkpoint: str, batch_id: int) -> "tuple[str | None, str] | None":
    """The single source's offsets a batch of a local checkpoint runs between: (start, end).

    The start is the previous batch's end, None for batch 0 (the query's starting position).
    None when the checkpoint is not local, or either offset cannot be read (the caller then does
    not rely on them)."""
    folder = local_dir(checkpoint)
    if folder is None:
        return None

    def offset_of(batch: int) -> str | None:
        try:
            return source_offset((folder / "offsets" / str(batch)).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None

    end = offset_of(batch_id)
    start = offset_of(batch_id - 1) if batch_id > 0 else None
    if end is None or (batch_id > 0 and start is None):
        return None
    return start, end


def query_id(checkpoint: str | Path) -> str | None:
    """The id of the query checkpointed in the local folder ``checkpoint``: Spark writes it to the
    folder's ``metadata`` file when a query first starts there and keeps it across restarts, so a new
    id means a new checkpoint (a replay from the source's start). None when there is no checkpoint
    yet; ``ValueError`` when its ``metadata`` is not Spark's."""
    path = Path(checkpoint) / "metadata"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        found = json.loads(text.splitlines()[0] if text.strip() else "")
    except (ValueError, IndexError) as exc:
        raise ValueError(f"{path} is not a query checkpoint's metadata: {exc}") from exc
    if not isinstance(found, dict) or not isinstance(found.get("id"), str):
        raise ValueError(f"{path} names no query id")
    return str(found["id"])
