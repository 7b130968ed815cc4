"""The names in a Delta table's log folder: where the log is, what its commit files are called, and
whether a local table has a log yet.

A table's log is the ``_delta_log`` folder under its root. Version ``v`` is committed by the file
``<v, 20 digits>.json`` there; a checkpoint of version ``v`` is ``<v>.checkpoint.parquet`` (or its
numbered parts), and ``_last_checkpoint`` names the newest one. Plain names and file listings: no
engine.
"""

from __future__ import annotations

import re
from pathlib import Path

#: A Delta table's log directory, under the table's root.
LOG_DIR = "_delta_log"
#: The file in the log that names the newest checkpoint (its version, and its parts if several).
LAST_CHECKPOINT = "_last_checkpoint"
#: A commit file's name: the version in 20 digits, ``.json``.
COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


def commit_file_name(version: int) -> str:
    """The name of version ``version``'s commit file in a Delta log (``00000000000000000007.json``)."""
    return f"{version:020d}.json"


def commit_versions(log_dir: Path) -> list[int]:
    """The versions with a commit file in ``log_dir`` (a ``_delta_log`` folder), in no order;
    ``OSError`` when the folder cannot be listed."""
    return [int(m.group(1)) for entry in log_dir.iterdir() if (m := COMMIT_FILE.match(entry.name))]


def newest_commit(log_dir: Path) -> int | None:
    """The newest version with a commit file in ``log_dir``; None when it has none, or cannot be listed."""
    try:
        versions = commit_versions(log_dir)
    except OSError:
        return None
    return max(versions) if versions else None


def has_commits(table_dir: Path) -> bool:
    """Whether the local Delta table at ``table_dir`` has a log: its first commit, or a checkpoint
    (which log cleanup leaves once the first commits are gone)."""
    log_dir = table_dir / LOG_DIR
    return (log_dir / commit_file_name(0)).is_file() or (log_dir / LAST_CHECKPOINT).is_file()
