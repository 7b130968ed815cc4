"""The dead-letter Delta table of an event stream: poison messages, kept with the reason.

An event that cannot be decoded, lacks its key, does not fit its replica's schema, or that the
replica refuses when written is recorded here and the stream goes on. A letter is keyed by where its
message came from (origin, partition, offset): the batch's rows are MERGEd in, inserted only where
that key is not yet recorded, under the batch's transaction id. A replayed batch is skipped by Delta,
and a replay under a new epoch (a resync, which reads the topic again from its earliest offsets)
records no letter twice either.

Each letter names its table, the decoded key and the source position of its change when the message
got that far, and carries a short ``id`` (a digest of origin, partition and offset) by which the
operator skips or replays it: ``status`` is ``pending`` until then, ``skipped`` or ``replayed`` after,
with ``resolved_at`` and ``resolution`` saying when and how. Rows written before these columns
existed read as pending; the columns are added to an older table on first use.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Protocol, Sequence

from lakemirror import tables
from lakemirror.sinks.txn import TxnId, transaction
from lakemirror.sources.change_event import (
    BASIS_MYSQL_BINLOG, BASIS_POSTGRES_LSN, BASIS_SIMPLE_TIMESTAMP, BASIS_TS_MS, SNAPSHOT, ChangeEvent,
)
from lakemirror.sources.connect_types import json_value_text
from lakemirror.sources.event_stream import RawEvent
from lakemirror.sql_exec import run_sql
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: origin: the topic or the file; offset: the Kafka offset or the line number in the file.
DEAD_LETTER_DDL = ("origin STRING, `partition` INT, `offset` BIGINT, key STRING, value STRING, "
                   "`table` STRING, reason STRING, batch_id BIGINT, recorded_at TIMESTAMP, id STRING, "
                   "change_key STRING, position STRING, status STRING, resolved_at TIMESTAMP, resolution STRING")
#: The columns added after the first release of the table (added to an older table on first use).
ADDED_COLUMNS = (("id", "STRING"), ("change_key", "STRING"), ("position", "STRING"), ("status", "STRING"),
                 ("resolved_at", "TIMESTAMP"), ("resolution", "STRING"))
PENDING, SKIPPED, REPLAYED = "pending", "skipped", "replayed"
STATUSES = (PENDING, SKIPPED, REPLAYED)
_COORDINATES = {BASIS_POSTGRES_LSN: ("lsn", "txId", "order"), BASIS_MYSQL_BINLOG: ("binlog", "pos", "row"),
                BASIS_TS_MS: ("ts_ms", "", ""), BASIS_SIMPLE_TIMESTAMP: ("timestamp_us", "transaction", "")}


def letter_id(origin: str, partition: int | None, offset: int) -> str:
    """A dead letter's short, stable id: a digest of where its message came from."""
    body = f"{origin}\x00{'' if partition is None else partition}\x00{offset}"
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def position_text(change: ChangeEvent) -> str:
    """A change's source position as a person reads it: ``stream lsn=24023560 txId=771 order=2``."""
    p = change.position
    names = _COORDINATES.get(change.basis, ("major", "minor", "micro"))
    parts = [f"{n}={v}" for n, v in zip(names, (p.major, p.minor, p.micro)) if n]
    return " ".join(["snapshot" if p.phase == SNAPSHOT else "stream", *parts])


@dataclass(frozen=True)
class DeadLetterRow:
    raw: RawEvent
    reason: str
    table: str | None = None
    change: ChangeEvent | None = None   # the decoded change, when the message got that far

    @property
    def id(self) -> str:
        return letter_id(self.raw.origin, self.raw.partition, self.raw.offset)

    def values(self, batch_id: int, at: datetime) -> tuple[Any, ...]:
        """The row in :data:`DEAD_LETTER_DDL`'s column order."""
        change_key = json_value_text(dict(self.change.keys)) if self.change is not None and self.change.keys else None
        position = position_text(self.change) if self.change is not None else None
        return (self.raw.origin, self.raw.partition, self.raw.offset, self.raw.key, self.raw.value,
                self.table or (self.change.table if self.change is not None else None), self.reason, batch_id, at,
                self.id, change_key, position, PENDING, None, None)


@dataclass(frozen=True)
class StoredLetter:
    """A recorded dead letter, as read back (skip and replay work on these)."""

    id: str
    raw: RawEvent
    table: str | None
    reason: str
    status: str
    batch_id: int | None = None
    recorded_at: datetime | None = None
    change_key: str | None = None
    position: str | None = None
    resolved_at: datetime | None = None
    resolution: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "table": self.table, "origin": self.raw.origin, "partition": self.raw.partition,
                "offset": self.raw.offset, "key": self.change_key, "position": self.position, "reason": self.reason,
                "status": self.status, "batch_id": self.batch_id,
                "recorded_at": self.recorded_at.isoformat() if self.recorded_at else None,
                "resolved_at": self.resolved_at.isoformat() if self.resolved_at else None,
                "resolution": self.resolution}


@dataclass(frozen=True)
class Resolution:
    """What became of one letter the operator acted on: its new status and why."""

    id: str
    status: str
    resolution: str
    reason: str | None = None   # a new reason, when a replay was refused again


#: What an operator may do with a pending letter.
VERBS = ("skip", "replay")


@dataclass(frozen=True)
class LetterReport:
    """What an operator's skip or replay did: one resolution per letter found, the ids not found."""

    verb: str
    resolutions: tuple[Resolution, ...]
    unknown: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"verb": self.verb, "unknown": list(self.unknown),
                "letters": [{"id": r.id, "status": r.status, "resolution": r.resolution,
                             **({"reason": r.reason} if r.reason else {})} for r in self.resolutions]}


class DeadLetterStore(Protocol):
    """Where an event source's dead letters are kept (the Delta table, or its in-memory twin)."""

    def append(self, session: Any, letters: Sequence[DeadLetterRow], txn: TxnId, now: float) -> int: ...

    def letters(self, session: Any, ids: Iterable[str] | None = None, messages: bool = True) -> list[StoredLetter]: ...

    def resolve(self, session: Any, done: Sequence[Resolution], txn: TxnId, now: float) -> None: ...

    def version(self, session: Any) -> int: ...


def _stored(row: dict[str, Any]) -> StoredLetter:
    raw = RawEvent(row.get("value"), row.get("key"), row.get("origin") or "", row.get("partition"),
                   int(row.get("offset") or 0))
    return StoredLetter(row.get("id") or letter_id(raw.origin, raw.partition, raw.offset), raw, row.get("table"),
                        row.get("reason") or "", row.get("status") or PENDING, row.get("batch_id"),
                        row.get("recorded_at"), row.get("change_key"), row.get("position"), row.get("resolved_at"),
                        row.get("resolution"))


@dataclass
class DeadLetterTable:
    """The dead letters of one event source in a Delta table (created on the first letter)."""

    location: TableLocation
    _widened: bool = field(default=False, init=False, repr=False)

    def _widen(self, session: "SparkSession") -> None:
        """Add the columns a table written by an older release lacks (once per process)."""
        if self._widened:
            return
        have = {f.name.lower() for f in tables.read(session, self.location).schema.fields}
        missing = [(n, t) for n, t in ADDED_COLUMNS if n not in have]
        if missing:
            cols = ", ".join(f"`{n}` {t}" for n, t in missing)
            run_sql(session, f"ALTER TABLE {self.location.sql} ADD COLUMNS ({cols})")
        self._widened = True

    def append(self, session: "SparkSession", letters: Sequence[DeadLetterRow], txn: TxnId, now: float) -> int:
        """Record ``letters`` once per message and per ``txn``; how many were given."""
        if not letters:
            return 0
        at = datetime.fromtimestamp(now, timezone.utc)
        unique = {(d.raw.origin, d.raw.partition, d.raw.offset): d for d in letters}  # one row per message
        df = session.createDataFrame([d.values(txn.version, at) for d in unique.values()], DEAD_LETTER_DDL)
        if not tables.exists(session, self.location):
            tables.write(df, self.location, "append", txnAppId=txn.app_id, txnVersion=str(txn.version))
            self._widened = True
            return len(letters)
        self._widen(session)
        on = " AND ".join(f"t.{c} <=> s.{c}" for c in ("origin", "`partition`", "`offset`"))
        with transaction(session, txn):
            (tables.delta_table(session, self.location).alias("t").merge(df.alias("s"), on)
             .whenNotMatchedInsertAll().execute())
        return len(letters)

    def letters(self, session: "SparkSession", ids: Iterable[str] | None = None,
                messages: bool = True) -> list[StoredLetter]:
        """The recorded letters (those with ``ids`` only, when given), oldest first; without
        ``messages``, their raw keys and values are left out (counting needs none)."""
        if not tables.exists(session, self.location):
            return []
        wanted = None if ids is None else set(ids)
        frame = tables.read(session, self.location)
        if not messages:
            frame = frame.drop("key", "value")
        rows = [_stored(r.asDict()) for r in frame.collect()]
        chosen = [r for r in rows if wanted is None or r.id in wanted]
        return sorted(chosen, key=lambda r: (r.batch_id or 0, r.raw.origin, r.raw.partition or 0, r.raw.offset))

    def resolve(self, session: "SparkSession", done: Sequence[Resolution], txn: TxnId, now: float) -> None:
        """Record what became of the letters in ``done`` (their status, when, how), in one commit
        under ``txn``."""
        if not done or not tables.exists(session, self.location):
            return
        self._widen(session)
        from pyspark.sql import functions as F

        at = datetime.fromtimestamp(now, timezone.utc)
        # Matched on where the message came from (rows written before the id column have no id).
        where = {r.id: r.raw for r in self.letters(session, [d.id for d in done])}
        source = session.createDataFrame(
            [(where[d.id].origin, where[d.id].partition, where[d.id].offset, d.id, d.status, d.resolution, d.reason, at)
             for d in done if d.id in where],
            "origin STRING, `partition` INT, `offset` BIGINT, rid STRING, rstatus STRING, rresolution STRING, "
            "rreason STRING, rat TIMESTAMP")
        on = " AND ".join(f"t.{c} <=> s.{c}" for c in ("origin", "`partition`", "`offset`"))
        with transaction(session, txn):
            (tables.delta_table(session, self.location).alias("t").merge(source.alias("s"), on)
             .whenMatchedUpdate(set={"status": F.col("s.rstatus"), "resolution": F.col("s.rresolution"),
                                     "resolved_at": F.col("s.rat"), "id": F.col("s.rid"),
                                     "reason": F.coalesce(F.col("s.rreason"), F.col("t.reason"))})
             .execute())

    def version(self, session: "SparkSession") -> int:
        """The table's latest Delta version (-1 before it exists): it grows with every write, so it
        numbers the operator's replays in order (each replay ends by writing here)."""
        if not tables.exists(session, self.location):
            return -1
        return int(tables.delta_table(session, self.location).history(1).collect()[0]["version"])

    def count(self, session: "SparkSession") -> int:
        return tables.read(session, self.location).count() if tables.exists(session, self.location) else 0


@dataclass
class InMemoryDeadLetters:
    """The dead-letter table's twin: rows in a dict keyed by (origin, partition, offset)."""

    rows: dict[tuple[str, int | None, int], StoredLetter] = field(default_factory=dict)
    txns: set[tuple[str, int]] = field(default_factory=set)
    writes: int = 0

    def append(self, session: Any, letters: Sequence[DeadLetterRow], txn: TxnId, now: float) -> int:
        if not letters or (txn.app_id, txn.version) in self.txns:
            return len(letters)
        self.txns.add((txn.app_id, txn.version))
        at = datetime.fromtimestamp(now, timezone.utc)
        for d in letters:
            coordinate = (d.raw.origin, d.raw.partition, d.raw.offset)
            if coordinate not in self.rows:
                v = d.values(txn.version, at)
                self.rows[coordinate] = StoredLetter(d.id, d.raw, v[5], d.reason, PENDING, txn.version, at, v[10], v[11])
        self.writes += 1
        return len(letters)

    def letters(self, session: Any, ids: Iterable[str] | None = None, messages: bool = True) -> list[StoredLetter]:
        wanted = None if ids is None else set(ids)
        return [r for r in self.rows.values() if wanted is None or r.id in wanted]

    def resolve(self, session: Any, done: Sequence[Resolution], txn: TxnId, now: float) -> None:
        if not done or (txn.app_id, txn.version) in self.txns:
            return
        self.txns.add((txn.app_id, txn.version))
        at = datetime.fromtimestamp(now, timezone.utc)
        by_id = {d.id: d for d in done}
        for coordinate, row in list(self.rows.items()):
            d = by_id.get(row.id)
            if d is not None:
                self.rows[coordinate] = StoredLetter(row.id, row.raw, row.table, d.reason or row.reason, d.status,
                                                     row.batch_id, row.recorded_at, row.change_key, row.position, at,
                                                     d.resolution)
        self.writes += 1

    def version(self, session: Any) -> int:
        return self.writes - 1
