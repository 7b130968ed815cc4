"""The normalised change contract of event sources: keys, an orderable position, an operation, columns.

Pure: no pyspark import. Every event-stream decoder (:mod:`lakemirror.sources.debezium`: Debezium
envelopes and the simple form) turns one raw message into exactly one :class:`Decoded` outcome:

- :class:`ChangeEvent`: a change to apply (an upsert, a delete or a truncate of one table);
- :class:`Skipped`: a message that carries no change by design (a Kafka tombstone after a delete,
  a transaction BEGIN/END marker), counted but not applied;
- :class:`DeadLetter`: a message that cannot be applied (not JSON, no key, unknown operation),
  with the reason; it goes to the dead-letter table and the stream goes on.

The guard (:mod:`lakemirror.sinks.events.guard_plan`) orders a key's changes by :meth:`ChangeEvent.order`:
the :class:`Position` first, then the operation's rank (a delete before an upsert at one position).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

UPSERT = "upsert"
DELETE = "delete"
TRUNCATE = "truncate"
OPERATIONS = (UPSERT, DELETE, TRUNCATE)
#: At one position, a delete (or a truncate) of a key is ordered before an upsert of it.
OP_RANK = {TRUNCATE: 0, DELETE: 0, UPSERT: 1}

#: Position phases: every snapshot read is older than any streamed change of the same key.
SNAPSHOT, STREAM = 0, 1

#: What a position's numbers are (shown in status: ``ts_ms`` is a last resort, not an order).
BASIS_POSTGRES_LSN = "postgres lsn, txId, in-transaction order"
BASIS_MYSQL_BINLOG = "mysql binlog file, position, row"
BASIS_TS_MS = "source ts_ms (last resort: events in one millisecond are unordered)"
BASIS_SIMPLE_TIMESTAMP = "event timestamp, transaction_id (last resort: events in one microsecond are unordered)"


@dataclass(frozen=True, order=True)
class Position:
    """Where a change sits in its source's history; tuples compare field by field.

    ``phase`` puts snapshot reads (:data:`SNAPSHOT`) before streamed changes (:data:`STREAM`);
    ``major``, ``minor``, ``micro`` are the source's own coordinates (Postgres: lsn, txId,
    in-transaction order; MySQL: binlog file index, position, row; last resort: ts_ms, 0, 0).
    All are signed 64-bit integers so that a Delta replica can store and compare them.
    """

    phase: int
    major: int
    minor: int = 0
    micro: int = 0

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.phase, self.major, self.minor, self.micro)


#: A change's full order: its position, then its operation's rank.
Order = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class ChangeEvent:
    """One change of one row (or, for a truncate, of a whole table)."""

    table: str
    op: str
    keys: tuple[tuple[str, Any], ...]   # (column, value) pairs of the key, in key order; () for a truncate
    position: Position
    columns: Mapping[str, Any] = field(default_factory=dict)   # the row after the change (upserts only)
    basis: str = ""                     # what the position is made of (one of the BASIS_* texts)
    ts_ms: int | None = None            # the source's commit time, for event-time lag
    types: Mapping[str, str] = field(default_factory=dict)  # Spark SQL type per column, when the source
                                                            # declares them (Connect schemas); else inferred

    def __post_init__(self) -> None:
        if self.op not in OPERATIONS:
            raise ValueError(f"unknown operation {self.op!r}")

    @property
    def key(self) -> tuple[Any, ...]:
        return tuple(v for _, v in self.keys)

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.keys)

    def order(self) -> Order:
        return (*self.position.as_tuple(), OP_RANK[self.op])

    def digest(self) -> str:
        """A stable fingerprint of the change's content: equal for exact redeliveries."""
        body = json.dumps([self.table, self.op, list(self.keys), self.position.as_tuple(),
                           sorted(self.columns.items())], sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True)
class Skipped:
    """A message that carries no change by design (e.g. the tombstone after a delete)."""

    reason: str


@dataclass(frozen=True)
class DeadLetter:
    """A message that cannot be applied; kept with its reason, never raised."""

    reason: str
    raw: str | None = None
    key: str | None = None
    table: str | None = None


Decoded = Union[ChangeEvent, Skipped, DeadLetter]
