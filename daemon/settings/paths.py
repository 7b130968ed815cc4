"""Checks of the folders a pipeline writes to: what a path may look like (a field validator), and
where the checkpoint folder may not be (inside a Delta table, or a schema's folder of tables).

A checkpoint folder inside a table's folder is deleted by the table's first routine ``VACUUM``
(which removes every file the table's log does not name, after the retention period): the stream
offsets, commits and state of every table of the pipeline with it. A schema's folder holds its
tables' folders, so a checkpoint folder there sits where a table of that name would be created.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lakemirror.daemon.settings.limits import MAX_PATH_CHARS
from lakemirror.delta_log.layout import LOG_DIR

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def directory_value(value: str, what: str) -> str:
    """``value`` if it can name a folder to write in; else ``ValueError`` saying why.

    Refused: an empty or blank value (which would be the daemon's working folder), the file
    system's root, a NUL, more than :data:`MAX_PATH_CHARS` characters, and ``~user`` for a user
    this machine does not have. URIs (``s3a://…``) are only checked for length and emptiness."""
    if not value or not value.strip():
        raise ValueError(f"{what} cannot be empty: give a directory (an absolute path is clearest)")
    if len(value) > MAX_PATH_CHARS:
        raise ValueError(f"{what} is {len(value)} characters long; a path has at most {MAX_PATH_CHARS}")
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL character")
    if _SCHEME.match(value) and not value.lower().startswith("file:"):
        return value
    local = value[len("file:"):] if value.lower().startswith("file:") else value
    if local.startswith("~"):
        expanded = os.path.expanduser(local)
        if expanded.startswith("~"):
            user = local[1:].split("/", 1)[0]
            raise ValueError(f"{what} {value!r} starts with ~{user}, and this machine has no user {user!r}: "
                             f"write the full path")
        local = expanded
    if Path(os.path.abspath(local)) == Path(os.path.abspath(local)).parent:
        raise ValueError(f"{what} {value!r} is the file system's root: give a directory of its own")
    return value


def _real(path: str) -> Path:
    """``path`` absolute, with ``~`` and every symbolic link of the part that exists resolved."""
    return Path(path).expanduser().absolute().resolve()


def enclosing_table(folder: str) -> Path | None:
    """The Delta table (a folder with a ``_delta_log``) that ``folder`` is, or lies inside, if any."""
    here = _real(folder)
    for candidate in (here, *here.parents):
        if (candidate / LOG_DIR).is_dir():
            return candidate
    return None


def checkpoint_location_problem(checkpoint_volume: str, warehouse: str | None,
                                schemas: list[tuple[str, str]]) -> str | None:
    """Why ``checkpoint_volume`` (a local folder) may not hold a pipeline's checkpoints, or None:
    it is or lies inside a Delta table, or inside (or is) the folder of one of ``schemas``
    (``(catalog, schema)`` pairs) under a local ``warehouse``."""
    if _SCHEME.match(checkpoint_volume) and not checkpoint_volume.lower().startswith("file:"):
        return None
    table = enclosing_table(checkpoint_volume)
    if table is not None:
        return (f"{checkpoint_volume} is inside the Delta table at {table}: a VACUUM of that table deletes "
                f"every file its log does not name, lakemirror's offsets, commits and state with them; put "
                f"checkpoint_volume outside every table")
    if warehouse is None or (_SCHEME.match(warehouse) and not warehouse.lower().startswith("file:")):
        return None
    here = _real(checkpoint_volume)
    for catalog, schema in schemas:
        folder = _real(warehouse) / catalog / schema
        if here == folder or folder in here.parents:
            where = "is" if here == folder else f"is inside {folder},"
            return (f"{checkpoint_volume} {where} the folder of the tables of {catalog}.{schema}, where a "
                    f"table's folder (and its VACUUM) may reach it; put checkpoint_volume outside the "
                    f"warehouse's schemas")
    return None
