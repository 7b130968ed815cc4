"""The dead letters of a pipeline's change-feed tables: one Delta table beside the replicas.

A change a Delta replica refuses because of its value (a ``CHECK`` constraint or a ``NOT NULL``
column an operator added to the replica) is found by :mod:`lakemirror.sinks.merge.row_isolation` and
recorded here, in ``_lakemirror_dead_letters`` in the destination schema: the pipeline, the source
table, the key (its columns and values as JSON), the commit version and operation of the refused
change, the change's row as JSON and the engine's reason. A letter's ``id`` is a digest of table, key
and commit version, so a batch replayed after a crash records none twice.

``status`` is ``pending`` until the operator acts, then ``skipped`` (nothing written) or
``replayed`` (the key's row written again from the source:
:mod:`lakemirror.sinks.merge.letter_replay`), with ``resolved_at`` and ``resolution`` saying when and
how; a replay the replica refuses again leaves the letter ``pending`` with the new ``reason``.

Every write here is a MERGE keyed on (pipeline, id): recording a letter twice, or a resolution twice,
changes nothing. The table is shared by the pipeline's tables, whose batches may record letters at
the same moment: a write that loses Delta's optimistic-concurrency race is tried again
(:func:`retry_conflicts`).

:class:`InMemoryFeedLetters` is the table's twin for unit tests.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence, TypeVar

from lakemirror import tables
from lakemirror.identifiers import quote
from lakemirror.sinks.events.dead_letters import PENDING, REPLAYED, SKIPPED, STATUSES, Resolution
from lakemirror.sinks.txn import TxnId, transaction
from lakemirror.sql_exec import run_sql
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The change-feed tables' dead letters, one Delta table per destination schema.
FEED_DEAD_LETTERS = "_lakemirror_dead_letters"
FEED_DEAD_LETTER_DDL = ("id STRING, pipeline_id STRING, `table` STRING, key STRING, commit_version BIGINT, "
                        "change_type STRING, `row` STRING, reason STRING, batch_id BIGINT, txn_app_id STRING, "
                        "recorded_at TIMESTAMP, status STRING, resolved_at TIMESTAMP, resolution STRING")
__all__ = ["FEED_DEAD_LETTERS", "FEED_DEAD_LETTER_DDL", "PENDING", "REPLAYED", "SKIPPED", "STATUSES", "FeedDeadLetters",
           "FeedLetter", "FeedLetterStore", "InMemoryFeedLetters", "Resolution", "StoredFeedLetter", "retry_conflicts"]

#: Delta's optimistic-concurrency failures: the write committed nothing and may be tried again.
CONFLICTS = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
             "ConcurrentTransactionException", "ConcurrentWriteException", "DELTA_CONCURRENT_")
CONFLICT_ATTEMPTS = 5

T = TypeVar("T")


def retry_conflicts(write: Callable[[], T], what: str, attempts: int = CONFLICT_ATTEMPTS,
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """``write()``, tried again (at most ``attempts`` times in all) while it fails on a concurrent
    commit to the same table; any other error, or the last conflict, is raised as it is."""
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if attempt == attempts or not any(name in text for name in CONFLICTS):
                raise
            log.info("%s: a concurrent commit to the same table; trying again (%d/%d)", what, attempt, attempts)
            sleep(0.2 * attempt)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class FeedLetter:
    """One refused change of a change-feed table, as a batch records it."""

    table: str
    key: str            # the key columns and values, as JSON
    commit_version: int | None
    change_type: str
    row: str            # the winning change's columns, as JSON
    reason: str

    @property
    def id(self) -> str:
        body = f"{self.table}\x00{self.key}\x00{self.commit_version}"
        return hashlib.sha256(body.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StoredFeedLetter:
    """A recorded letter, as read back (listing, skip and replay work on these)."""

    id: str
    table: str
    key: str
    commit_version: int | None
    change_type: str
    reason: str
    status: str = PENDING
    row: str | None = None
    batch_id: int | None = None
    txn_app_id: str | None = None
    recorded_at: datetime | None = None
    resolved_at: datetime | None = None
    resolution: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "table": self.table, "key": self.key, "commit_version": self.commit_version,
                "change_type": self.change_type, "row": self.row, "reason": self.reason, "status": self.status,
                "batch_id": self.batch_id, "txn_app_id": self.txn_app_id,
                "recorded_at": self.recorded_at.isoformat() if self.recorded_at else None,
                "resolved_at": self.resolved_at.isoformat() if self.resolved_at else None,
                "resolution": self.resolution}


def _stored(row: dict[str, Any]) -> StoredFeedLetter:
    return StoredFeedLetter(row["id"], row.get("table") or "", row.get("key") or "", row.get("commit_version"),
                            row.get("change_type") or "", row.get("reason") or "", row.get("status") or PENDING,
                            row.get("row"), row.get("batch_id"), row.get("txn_app_id"), row.get("recorded_at"),
                            row.get("resolved_at"), row.get("resolution"))


def _ordered(letters: Iterable[StoredFeedLetter]) -> list[StoredFeedLetter]:
    """Oldest first: by when they were recorded, then by table, key and version."""
    floor = datetime.min.replace(tzinfo=timezone.utc)
    return sorted(letters, key=lambda x: (_aware(x.recorded_at) or floor, x.table, x.key, x.commit_version or -1))


def _aware(at: datetime | None) -> datetime | None:
    return at.replace(tzinfo=timezone.utc) if at is not None and at.tzinfo is None else at


class FeedLetterStore(Protocol):
    """Where a pipeline's change-feed letters are kept (the Delta table, or its in-memory twin)."""

    def append(self, session: Any, letters: Sequence[FeedLetter], txn: TxnId, now: float) -> None: ...

    def letters(self, session: Any, ids: Iterable[str] | None = None) -> list[StoredFeedLetter]: ...

    def resolve(self, session: Any, done: Sequence[Resolution], now: float) -> None: ...


@dataclass(frozen=True)
class FeedDeadLetters:
    """The dead-letter table of a pipeline's change-feed tables (created on the first letter)."""

    location: TableLocation
    pipeline_id: str

    def append(self, session: "SparkSession", letters: Sequence[FeedLetter], txn: TxnId, now: float) -> None:
        """Record ``letters`` once per (pipeline, id), under ``txn``."""
        if not letters:
            return
        at = datetime.fromtimestamp(now, timezone.utc)
        df = session.createDataFrame([(d.id, self.pipeline_id, d.table, d.key, d.commit_version, d.change_type, d.row,
                                       d.reason, txn.version, txn.app_id, at, PENDING, None, None)
                                      for d in letters], FEED_DEAD_LETTER_DDL)

        def write() -> None:
            if not tables.exists(session, self.location):
                tables.write(df, self.location, "append", txnAppId=txn.app_id, txnVersion=str(txn.version))
                return
            with transaction(session, txn):
                _merge_from(session, df, lambda view: f"MERGE INTO {self.location.sql} AS t USING {view} AS s "
                                                      f"ON t.id = s.id AND t.pipeline_id <=> s.pipeline_id "
                                                      f"WHEN NOT MATCHED THEN INSERT *")
        retry_conflicts(write, f"{self.location.name}: recording {len(letters)} dead letter(s)")

    def letters(self, session: "SparkSession", ids: Iterable[str] | None = None) -> list[StoredFeedLetter]:
        """This pipeline's letters (those with ``ids`` only, when given), oldest first."""
        if not tables.exists(session, self.location):
            return []
        from pyspark.sql import functions as F

        frame = tables.read(session, self.location).where(F.col("pipeline_id") == F.lit(self.pipeline_id))
        if ids is not None:
            wanted = sorted(set(ids))
            if not wanted:
                return []
            frame = frame.where(F.col("id").isin(wanted))
        return _ordered(_stored(r.asDict()) for r in frame.collect())

    def resolve(self, session: "SparkSession", done: Sequence[Resolution], now: float) -> None:
        """Record what became of the letters in ``done`` (status, when, how), in one commit."""
        if not done or not tables.exists(session, self.location):
            return
        at = datetime.fromtimestamp(now, timezone.utc)
        source = session.createDataFrame(
            [(d.id, self.pipeline_id, d.status, d.resolution, d.reason, at) for d in done],
            "rid STRING, rpipeline STRING, rstatus STRING, rresolution STRING, rreason STRING, rat TIMESTAMP")

        def write() -> None:
            _merge_from(session, source, lambda view: (
                f"MERGE INTO {self.location.sql} AS t USING {view} AS s "
                f"ON t.id = s.rid AND t.pipeline_id <=> s.rpipeline "
                f"WHEN MATCHED THEN UPDATE SET status = s.rstatus, resolution = s.rresolution, "
                f"resolved_at = s.rat, reason = coalesce(s.rreason, t.reason)"))
        retry_conflicts(write, f"{self.location.name}: recording {len(done)} resolution(s)")


def _merge_from(session: "SparkSession", source: "DataFrame", statement: Callable[[str], str]) -> None:
    """Run the ``MERGE`` ``statement(view)`` with ``source`` as ``view`` (a temp view of its own).

    SQL text, not Delta's ``DeltaTable`` API: the same statement runs in a session with its own JVM
    and over Spark Connect (in the daemon, and in a Connect server's batch function, which records a
    batch's letters there), where ``DeltaTable`` needs Delta's Connect plugin."""
    view = f"lakemirror_letters_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    try:
        run_sql(session, statement(quote(view))).collect()
    finally:
        session.catalog.dropTempView(view)


@dataclass
class InMemoryFeedLetters:
    """The dead-letter table's twin: letters by id, transactions by (app id, version)."""

    pipeline_id: str = "p"
    rows: dict[str, StoredFeedLetter] = field(default_factory=dict)
    txns: set[tuple[str, int]] = field(default_factory=set)
    clock: Callable[[], float] = time.time

    def append(self, session: Any, letters: Sequence[FeedLetter], txn: TxnId, now: float) -> None:
        if not letters or (txn.app_id, txn.version) in self.txns:
            return
        self.txns.add((txn.app_id, txn.version))
        at = datetime.fromtimestamp(now, timezone.utc)
        for d in letters:
            self.rows.setdefault(d.id, StoredFeedLetter(d.id, d.table, d.key, d.commit_version, d.change_type,
                                                        d.reason, PENDING, d.row, txn.version, txn.app_id, at))

    def letters(self, session: Any, ids: Iterable[str] | None = None) -> list[StoredFeedLetter]:
        wanted = None if ids is None else set(ids)
        return _ordered(r for r in self.rows.values() if wanted is None or r.id in wanted)

    def resolve(self, session: Any, done: Sequence[Resolution], now: float) -> None:
        at = datetime.fromtimestamp(now, timezone.utc)
        for d in done:
            row = self.rows.get(d.id)
            if row is not None:
                self.rows[d.id] = replace(row, status=d.status, resolution=d.resolution, resolved_at=at,
                                          reason=d.reason or row.reason)
