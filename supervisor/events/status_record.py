"""What an event source keeps about itself across restarts: ``<events folder>/status.json``.

An event source's replicas, their counts and its lag lived in the runner's memory only: a restarted
daemon showed no replicas until the first batch, `lakemirror status` without a daemon showed only
the pipeline's header, and the lag of a backlog started again from 0 in each process. The runner
writes this small record (atomically) after each batch and whenever what it knows about its backlog
changes; a starting daemon and `lakemirror status` read it without Spark.

Lag across restarts (:func:`backlog_since`): a backlog seen before the stop still dates from when
it was first seen. A backlog first seen after a restart began after the replicas were last known to
be caught up, and after the newest applied event: the later of the two moments recorded durably is
when it can have begun at the earliest, and the lag is counted from there, never from the process's
start (which would hide a backlog that built up while the daemon was down).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakemirror.checkpoints import layout
from lakemirror.sinks.event_contract import ReplicaBatch

if TYPE_CHECKING:
    from lakemirror.supervisor.offline.recorded_tables import RecordedTable

log = logging.getLogger(__name__)

RECORD_FILE = layout.EVENT_RECORD_FILE

#: The least time between two writes of the record that only move ``caught_up_at`` forward.
CAUGHT_UP_WRITE_SECONDS = 10.0


@dataclass(frozen=True)
class EventSourceRecord:
    batch_id: int | None = None            # the last batch the source applied
    last_batch_at: float | None = None
    behind_since: float | None = None      # when the current backlog was first seen (None: none)
    caught_up_at: float | None = None      # the last time nothing was seen behind
    last_event_at: float | None = None     # the source time of the newest event applied
    dead_letters: int = 0
    #: Per replica: inserted, updated, deleted, stale, batches, replays, position_basis, last_ts_ms,
    #: last_event_lag_seconds (:class:`ReplicaStatus`).
    replicas: dict[str, dict[str, Any]] = field(default_factory=dict)


def state_slug(source: str) -> str:
    """Where an event source's pause is kept in the pipeline's state store."""
    return "events-" + source


def load_record(folder: Path) -> EventSourceRecord:
    """The record in ``folder`` (an empty one when there is none or it cannot be read)."""
    path = folder / RECORD_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {k: v for k, v in data.items() if k in EventSourceRecord.__dataclass_fields__}
        return EventSourceRecord(**known)
    except FileNotFoundError:
        return EventSourceRecord()
    except (OSError, ValueError, TypeError) as exc:
        log.info("%s: cannot read the event source's record: %s", path, exc)
        return EventSourceRecord()


def save_record(folder: Path, record: EventSourceRecord) -> None:
    """Write the record atomically (a temporary file renamed over it)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".status-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(asdict(record), fh, sort_keys=True)
        os.replace(tmp, folder / RECORD_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def backlog_since(record: EventSourceRecord, now: float) -> float:
    """When a backlog seen at ``now`` began, at the earliest (see the module docstring)."""
    if record.behind_since is not None:
        return record.behind_since
    known = [t for t in (record.caught_up_at, record.last_event_at) if t is not None and t <= now]
    return max(known) if known else now


def describe(record: EventSourceRecord, source: str, kind: str) -> dict[str, Any]:
    """The record as an event runner's ``describe()`` shows its state (status without the daemon)."""
    return {
        "source": source, "kind": kind, "dead_letters": record.dead_letters, "offsets_behind": [],
        "replicas": {table: {"inserted": r.get("inserted", 0), "updated": r.get("updated", 0),
                             "deleted": r.get("deleted", 0), "stale": r.get("stale", 0),
                             "batches": r.get("batches", 0), "event_lag_seconds": r.get("last_event_lag_seconds"),
                             "position_basis": r.get("position_basis") or ""}
                     for table, r in sorted(record.replicas.items())},
    }


def recorded_entry(folder: Path, name: str, kind: str, paused: bool) -> "RecordedTable":
    """The event source's entry (``events:<name>``) as its record has it: listed by a starting daemon
    before its runner exists (that needs Spark), and by `lakemirror status` without a daemon."""
    from lakemirror.supervisor.offline.recorded_tables import RecordedTable

    record = load_record(folder)
    return RecordedTable(f"events:{name}", applied_through=record.batch_id, latest_version=None,
                         oldest_unapplied_at=record.behind_since, last_batch_at=record.last_batch_at,
                         paused=paused, started=record.batch_id is not None or bool(record.replicas),
                         detail=describe(record, name, kind))


@dataclass
class ReplicaStatus:
    """What one replica of an event source has taken so far (status and tests)."""

    batches: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0
    replays: int = 0
    position_basis: str = ""
    last_ts_ms: int | None = None
    last_event_lag_seconds: float | None = None   # the last batch's oldest change: source commit → replica commit

    def add(self, table: str, batch: ReplicaBatch) -> None:
        """Count one batch's write to the replica of ``table``."""
        if batch.event_lags_seconds:
            self.last_event_lag_seconds = max(batch.event_lags_seconds)
        self.batches += 1
        self.inserted += batch.inserted
        self.updated += batch.updated
        self.deleted += batch.deleted
        self.stale += batch.stale
        self.replays += batch.replayed
        if batch.position_basis and batch.position_basis != self.position_basis:
            if "last resort" in batch.position_basis:
                log.warning("%s: events carry no log position; ordered by %s", table, batch.position_basis)
            self.position_basis = batch.position_basis
        if batch.last_ts_ms is not None:
            self.last_ts_ms = max(self.last_ts_ms or 0, batch.last_ts_ms)
