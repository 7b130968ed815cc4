"""What a recovery point is computed from, read from the target side (and the source when it answers).

Per table of a pipeline: its checkpoint rows (each applied batch, with the source commit times of its
first and last versions), the replica's history (each batch commit carries its transaction's tag in
``userMetadata``, which names the row it belongs to) and, when the source can still be read, the
source's history after the last applied version (what the newest replica commit is exact until).
The pure parts (:func:`commit_versions`, :func:`exact_until`, :func:`timelines`) turn those rows into
:class:`~lakemirror.supervisor.recovery.recovery_point.TableTimeline` values; :class:`RecoveryPoints` reads them
and asks :func:`~lakemirror.supervisor.recovery.recovery_point.recovery_point`.

Everything but the source's history lives with the replicas (the checkpoint table is in the audit
catalog, by default the target's), so a cut can be computed after the source is lost.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from lakemirror import tables
from lakemirror.checkpoints.records import CheckpointRow
from lakemirror.identifiers import TableName
from lakemirror.supervisor.recovery.recovery_point import (
    NoRecoveryPoint, RecoveryPoint, ReplicaCommit, TableTimeline, instant, recovery_point,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Source operations that change no row: a commit of these after the last applied version leaves the
#: replica exact (Delta's ``DESCRIBE HISTORY`` operation names).
NON_DATA_OPERATIONS = frozenset({
    "OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES", "ADD COLUMNS",
    "CHANGE COLUMN", "ADD CONSTRAINT", "DROP CONSTRAINT", "UPGRADE PROTOCOL", "SET TABLE LOCATION",
    "COMPUTE STATS", "ANALYZE",
})


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value)


def commit_versions(history: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], int]:
    """(transaction app id, batch id) -> the replica version whose commit applied it, from
    ``DESCRIBE HISTORY`` rows (``version``, ``userMetadata``); the first commit of a tag wins."""
    out: dict[tuple[str, int], int] = {}
    for row in history:
        meta = row.get("userMetadata")
        if not meta or '"lakemirror_txn"' not in str(meta):
            continue
        try:
            tag = json.loads(str(meta))
            key = (str(tag["lakemirror_txn"]), int(tag["batch"]))
        except (ValueError, KeyError, TypeError):
            continue
        version = int(row["version"])
        if key not in out or version < out[key]:
            out[key] = version
    return out


def exact_until(history: Iterable[Mapping[str, Any]], last_applied: int, now: float) -> float:
    """Until when the replica holding the source as of ``last_applied`` stays exact, from the source's
    ``DESCRIBE HISTORY`` rows (``version``, ``timestamp``, ``operation``): the commit time of the
    first later version that may change data, or ``now`` if there is none."""
    later = sorted((int(r["version"]), r) for r in history if int(r["version"]) > last_applied)
    for _, row in later:
        if str(row.get("operation") or "").upper() not in NON_DATA_OPERATIONS:
            t = _seconds(row.get("timestamp"))
            return now if t is None else t
    return now


@dataclass(frozen=True)
class TableInputs:
    """What was read for one table."""

    source: str
    replica: str
    rows: tuple[CheckpointRow, ...]
    commits: Mapping[tuple[str, int], int]
    exact_until: float | None = None
    notes: tuple[str, ...] = ()


def timeline(inputs: TableInputs) -> tuple[TableTimeline, list[str]]:
    """The table's timeline (short name: the source table's), and notes on the rows left out."""
    commits: list[ReplicaCommit] = []
    unmatched = 0
    for r in inputs.rows:
        if not r.is_batch or r.last_version is None or r.first_version is None or r.last_version_at is None:
            continue
        version = inputs.commits.get((r.txn_app_id, r.batch_id))
        if version is None:
            unmatched += 1
            continue
        commits.append(ReplicaCommit(version, r.first_version, r.last_version, _seconds(r.first_version_at),
                                     r.last_version_at.timestamp(), r.epoch))
    notes = list(inputs.notes)
    if unmatched:
        notes.append(f"{unmatched} applied batch(es) have no commit left in the replica's history "
                     f"(log retention): they cannot be cut at")
    name = TableName.parse(inputs.source).table
    return TableTimeline(name, inputs.replica, tuple(commits), inputs.exact_until), notes


@dataclass(frozen=True)
class Cut:
    """A recovery point with what was read for it."""

    point: RecoveryPoint
    notes: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        def iso(t: float | None) -> str | None:
            return None if t is None else instant(t)

        p = self.point
        return {"as_of": iso(p.as_of), "as_of_epoch_seconds": p.as_of, "valid_until": iso(p.valid_until),
                "tables": [{"table": t.table, "replica": t.replica, "replica_version": t.replica_version,
                            "source_version": t.source_version, "source_committed_at": iso(t.source_time)}
                           for t in p.tables],
                "notes": {k: list(v) for k, v in self.notes.items() if v}}


class RecoveryPoints:
    """Reads a pipeline's inputs and computes its recovery points (one Spark session, thin)."""

    def __init__(self, spark: "SparkSession", locate: Callable[[TableName], Any], checkpoint_table: Any,
                 pipeline_id: str, *, clock: Callable[[], float] = time.time) -> None:
        self.spark = spark
        self.locate = locate
        self.checkpoint_table = checkpoint_table
        self.pipeline_id = pipeline_id
        self.clock = clock

    def rows(self) -> dict[str, list[CheckpointRow]]:
        """The pipeline's applied-batch rows, by source table."""
        from pyspark.sql import functions as F

        if not tables.exists(self.spark, self.checkpoint_table):
            return {}
        df = tables.read(self.spark, self.checkpoint_table)
        if "last_version_at" not in df.columns:
            return {}
        names = CheckpointRow.column_names()
        picked = df.where((F.col("pipeline_id") == F.lit(self.pipeline_id)) & F.col("error").isNull()
                          & (F.col("batch_id") >= 0)).collect()
        out: dict[str, list[CheckpointRow]] = {}
        for r in picked:
            row = CheckpointRow(**{k: r[k] for k in names})
            out.setdefault(row.source_fqn, []).append(row)
        return out

    def inputs(self, source: str, rows: Sequence[CheckpointRow], use_source: bool) -> TableInputs:
        replica_name = rows[-1].dest_fqn
        replica = self.locate(TableName.parse(replica_name))
        history = [r.asDict() for r in tables.history(self.spark, replica).select("version", "userMetadata").collect()]
        notes: list[str] = []
        until: float | None = None
        if use_source:
            last = max((r.last_version for r in rows if r.is_batch and r.last_version is not None), default=None)
            try:
                src = tables.history(self.spark, self.locate(TableName.parse(source)))
                later = [r.asDict() for r in src.where(f"version > {int(last or -1)}")
                         .select("version", "timestamp", "operation").collect()]
                until = exact_until(later, int(last if last is not None else -1), self.clock())
            except Exception as exc:  # noqa: BLE001 — a lost source is the case this exists for
                notes.append(f"the source could not be read ({type(exc).__name__}); its newest replica commit "
                             f"counts as exact only at its own source time")
        return TableInputs(source, replica_name, tuple(rows), commit_versions(history), until, tuple(notes))

    def cut(self, at: float | None = None, anchor: str | None = None, only: Sequence[str] | None = None,
            use_source: bool = True) -> Cut:
        by_source = self.rows()
        chosen = {s: rows for s, rows in sorted(by_source.items())
                  if only is None or TableName.parse(s).table in only}
        if only is not None:
            missing = sorted(set(only) - {TableName.parse(s).table for s in chosen})
            if missing:
                raise NoRecoveryPoint(f"no applied batch recorded for {', '.join(missing)} in pipeline "
                                      f"{self.pipeline_id}", {m: "no checkpoint rows" for m in missing})
        lines: list[TableTimeline] = []
        notes: dict[str, list[str]] = {}
        for source, rows in chosen.items():
            tl, table_notes = timeline(self.inputs(source, rows, use_source))
            lines.append(tl)
            notes[tl.table] = table_notes
        return Cut(recovery_point(lines, at=at, anchor=anchor), notes)
