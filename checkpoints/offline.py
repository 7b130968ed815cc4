"""Checkpoint rows read without Spark: delta-rs on a checkpoint table on the driver's file system.

`lakemirror status` without a running daemon, and a starting daemon before its JVM is up, read
the checkpoint table this way: milliseconds, where a Spark session takes tens of seconds to start.
:func:`summarize` is pure and shared by both, so they count batches the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from lakemirror.checkpoints.records import CheckpointRow
from lakemirror.tables import is_local_table, local_dir


def read_rows(table_path: str | None, pipeline_id: str) -> list[CheckpointRow] | None:
    """The checkpoint rows of ``pipeline_id``; None when the table is not on this file system."""
    if table_path is None or not is_local_table(table_path):
        return None
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    folder = local_dir(table_path)
    data = DeltaTable(str(folder)).to_pyarrow_table()
    data = data.filter(pc.equal(data["pipeline_id"], pipeline_id))
    names = CheckpointRow.column_names()
    return [CheckpointRow(**{k: r.get(k) for k in names}) for r in data.to_pylist()]


@dataclass(frozen=True)
class TableSummary:
    """One table's rows, summed up: every view of a table counts batches this way."""

    batches: int                 # batches applied (one row each; failure and resync rows are events)
    rows_applied: int
    latest: CheckpointRow        # the newest row, batch or event
    last_batch: CheckpointRow | None


def summarize(rows: Iterable[CheckpointRow]) -> dict[str, TableSummary]:
    """Per source table: its batch count, rows applied, newest row and newest batch row."""
    seen: dict[str, dict[tuple[str, int], CheckpointRow]] = {}
    latest: dict[str, CheckpointRow] = {}
    for r in rows:
        cur = latest.get(r.source_fqn)
        if cur is None or (r.ended_at, r.batch_id) >= (cur.ended_at, cur.batch_id):
            latest[r.source_fqn] = r
        if r.is_batch:
            seen.setdefault(r.source_fqn, {})[(r.txn_app_id, r.batch_id)] = r
    out = {}
    for fqn, newest in latest.items():
        batches = seen.get(fqn, {})
        last = max(batches.values(), key=lambda b: (b.ended_at, b.batch_id)) if batches else None
        out[fqn] = TableSummary(len(batches), sum(b.rows_merged for b in batches.values()), newest, last)
    return out


def known_slugs(state_dir: str | Path) -> list[str]:
    """The table slugs a pipeline's state folder knows (one ``<slug>.json`` per table)."""
    folder = Path(state_dir)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json") if not p.name.startswith("."))
