"""Checkpoint rows: one durable record per applied micro-batch.

The columns of a Continuous Sync checkpoint row in the Data Replication System for Databricks (pipeline_id,
source_fqn, dest_fqn, last_committed_version, lag_seconds, rows_merged, error, degraded) plus what makes a batch auditable: the batch id and the exact
source version range applied, per-operation counts, transaction id and timings.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from typing import Any, Protocol


@dataclass(frozen=True)
class CheckpointRow:
    pipeline_id: str
    source_fqn: str
    dest_fqn: str
    epoch: int
    batch_id: int
    txn_app_id: str
    first_version: int | None          # lowest source version with change rows in the batch
    last_version: int | None           # highest source version with change rows in the batch
    last_committed_version: int | None # highest source version known applied after this batch
    rows_read: int
    rows_merged: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    lag_seconds: float | None
    error: str | None
    degraded: bool
    started_at: datetime
    ended_at: datetime
    #: Source commit times of ``first_version`` and ``last_version``: the replica's commit of this batch
    #: reflects the source as it was at ``last_version_at`` (for consistent recovery points across
    #: tables, :mod:`lakemirror.supervisor.recovery.recovery_point`). None in rows of event sources and in rows
    #: written before these columns existed.
    first_version_at: datetime | None = None
    last_version_at: datetime | None = None

    @classmethod
    def column_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @property
    def is_batch(self) -> bool:
        """A row for an applied batch (as opposed to a failure or resync event row)."""
        return self.batch_id >= 0 and self.error is None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


#: Spark DDL of the checkpoint table, in column order.
CHECKPOINT_DDL = ", ".join([
    "pipeline_id STRING", "source_fqn STRING", "dest_fqn STRING", "epoch INT", "batch_id BIGINT",
    "txn_app_id STRING", "first_version BIGINT", "last_version BIGINT",
    "last_committed_version BIGINT", "rows_read BIGINT", "rows_merged BIGINT",
    "rows_inserted BIGINT", "rows_updated BIGINT", "rows_deleted BIGINT", "lag_seconds DOUBLE",
    "error STRING", "degraded BOOLEAN", "started_at TIMESTAMP", "ended_at TIMESTAMP",
    "first_version_at TIMESTAMP", "last_version_at TIMESTAMP",
])


def commit_time(seconds: float | None) -> datetime | None:
    """A commit time in seconds since the epoch as a checkpoint row holds it (UTC), or None."""
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=timezone.utc)


class CheckpointStore(Protocol):
    """Where checkpoint rows go. ``append`` must be idempotent per (txn_app_id, batch_id);
    ``known_new`` says no earlier attempt wrote that batch's row, so the store need not look;
    ``spark``: the session a Spark-backed store reads with (the batch's own), ignored by others."""

    def append(self, row: CheckpointRow, spark: Any = None, *, known_new: bool = False) -> None: ...

    def append_rows(self, rows: list[CheckpointRow]) -> None:
        """Append batch rows no earlier attempt wrote (the caller knows), all in one commit."""
        ...

    def last_batch(self, txn_app_id: str) -> int | None:
        """The highest batch id of ``txn_app_id`` with a batch row (None: none)."""
        ...

    def latest(self, pipeline_id: str) -> dict[str, CheckpointRow]:
        """The newest row per source table of a pipeline."""
        ...


class InMemoryCheckpointStore:
    """The twin used by unit tests; keeps rows in a list, skipping a batch row already there."""

    def __init__(self) -> None:
        self.rows: list[CheckpointRow] = []
        self.commits = 0  # how many appends of several rows (append_rows) the store took
        self._lock = threading.Lock()

    def append(self, row: CheckpointRow, spark: Any = None, *, known_new: bool = False) -> None:
        with self._lock:
            present = any(r.is_batch and (r.txn_app_id, r.batch_id) == (row.txn_app_id, row.batch_id)
                          for r in self.rows)
            if row.is_batch and present:
                if known_new:
                    raise AssertionError(f"batch {row.batch_id} of {row.txn_app_id} was declared new but has a row")
                return
            self.rows.append(row)

    def append_rows(self, rows: list[CheckpointRow]) -> None:
        with self._lock:
            for row in rows:
                if any(r.is_batch and (r.txn_app_id, r.batch_id) == (row.txn_app_id, row.batch_id) for r in self.rows):
                    raise AssertionError(f"batch {row.batch_id} of {row.txn_app_id} was declared new but has a row")
            self.rows.extend(rows)
            self.commits += 1

    def last_batch(self, txn_app_id: str) -> int | None:
        with self._lock:
            ids = [r.batch_id for r in self.rows if r.is_batch and r.txn_app_id == txn_app_id]
        return max(ids) if ids else None

    def latest(self, pipeline_id: str) -> dict[str, CheckpointRow]:
        out: dict[str, CheckpointRow] = {}
        for r in self.rows:
            if r.pipeline_id == pipeline_id:
                cur = out.get(r.source_fqn)
                if cur is None or (r.ended_at, r.batch_id) >= (cur.ended_at, cur.batch_id):
                    out[r.source_fqn] = r
        return out
