"""Files written into a local Delta replica beside its data, for commits the daemon writes itself
(:mod:`lakemirror.sinks.accelerator.dv_merge`, :mod:`lakemirror.sinks.accelerator.dv_compaction`): new data files with
their ``add`` actions, deletion-vector files, and a file's live rows read back."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakemirror.delta_log.deletion_vectors import DvDescriptor, DvFileWriter, read_positions
from lakemirror.delta_log.local_log import data_file_path
from lakemirror.delta_log.layout import LOG_DIR, commit_file_name

#: A scratch table's directory name starts so (inside the replica: same file system, so a move is a
#: rename); one left by a crash holds no file the replica names.
SCRATCH_PREFIX = ".lakemirror-rows-"


#: A scratch directory this old is a crashed write's: no write of ours takes that long.
STALE_SCRATCH_SECONDS = 3600


def remove_stale_scratch(table_dir: Path, now: float | None = None) -> int:
    """Delete scratch tables a crash left in the replica (VACUUM skips hidden directories); how many."""
    import time

    cutoff = (time.time() if now is None else now) - STALE_SCRATCH_SECONDS
    removed = 0
    for entry in table_dir.glob(f"{SCRATCH_PREFIX}*"):
        try:
            if entry.is_dir() and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    return removed


def write_rows(table_dir: Path, rows: pa.Table, now: int, data_change: bool = True) -> list[tuple[Path, dict[str, Any]]]:
    """``rows`` as new data files of the replica, each with its ``add`` action (the statistics
    delta-rs computes), written through a scratch table beside the replica."""
    from deltalake import write_deltalake

    scratch = table_dir / f"{SCRATCH_PREFIX}{uuid.uuid4().hex}"
    out: list[tuple[Path, dict[str, Any]]] = []
    try:
        write_deltalake(str(scratch), rows, mode="error")
        commit = (scratch / LOG_DIR / commit_file_name(0)).read_text(encoding="utf-8")
        for line in commit.splitlines():
            add = json.loads(line).get("add")
            if add is None:
                continue
            target = table_dir / Path(add["path"]).name
            (scratch / add["path"]).rename(target)
            add.update(path=target.name, dataChange=data_change, modificationTime=now, partitionValues={})
            out.append((target, add))
    except BaseException:
        for target, _ in out:
            target.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def write_dv_file(table_dir: Path, dvs: DvFileWriter) -> Path:
    path = table_dir / dvs.name
    with open(path, "xb") as f:
        f.write(dvs.content())
    return path


def arrow_schema(table_dir: Path) -> pa.Schema:
    from deltalake import DeltaTable

    return pa.schema(DeltaTable(str(table_dir)).schema().to_arrow())


def live_rows(table_dir: Path, add: dict[str, Any], schema: pa.Schema) -> pa.Table:
    """A data file's rows that its deletion vector leaves, in the replica's current schema (a
    column added since the file was written is NULL)."""
    table = pq.read_table(data_file_path(table_dir, add))
    if add.get("deletionVector"):
        keep = np.ones(table.num_rows, dtype=bool)
        keep[read_positions(table_dir, DvDescriptor.from_action(add["deletionVector"])).astype(np.int64)] = False
        table = table.filter(pa.array(keep))
    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
               else pa.nulls(table.num_rows, f.type) for f in schema]
    return pa.table(columns, schema=schema)
