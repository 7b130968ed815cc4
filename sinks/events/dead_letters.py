"""The dead-letter Delta table of an event stream: poison messages, kept with the reason.

An event that cannot be decoded, lacks its key, or does not fit its replica's schema is recorded
here and the stream goes on. A letter is keyed by where its message came from (origin, partition,
offset): the batch's rows are MERGEd in, inserted only where that key is not yet recorded, under the
batch's transaction id. A replayed batch is skipped by Delta, and a replay under a new epoch (a
resync, which reads the topic again from its earliest offsets) records no letter twice either.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Sequence

from lakemirror import tables
from lakemirror.sinks.txn import TxnId, transaction
from lakemirror.sources.event_stream import RawEvent
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: origin: the topic or the file; offset: the Kafka offset or the line number in the file.
DEAD_LETTER_DDL = ("origin STRING, `partition` INT, `offset` BIGINT, key STRING, value STRING, "
                   "`table` STRING, reason STRING, batch_id BIGINT, recorded_at TIMESTAMP")


@dataclass(frozen=True)
class DeadLetterRow:
    raw: RawEvent
    reason: str
    table: str | None = None


@dataclass(frozen=True)
class DeadLetterTable:
    location: TableLocation

    def append(self, session: "SparkSession", letters: Sequence[DeadLetterRow], txn: TxnId, now: float) -> int:
        """Record ``letters`` once per message and per ``txn``; how many were given."""
        if not letters:
            return 0
        at = datetime.fromtimestamp(now, timezone.utc)
        unique = {(d.raw.origin, d.raw.partition, d.raw.offset): d for d in letters}  # one row per message
        rows = [(d.raw.origin, d.raw.partition, d.raw.offset, d.raw.key, d.raw.value, d.table, d.reason,
                 txn.version, at) for d in unique.values()]
        df = session.createDataFrame(rows, DEAD_LETTER_DDL)
        if not tables.exists(session, self.location):
            tables.write(df, self.location, "append", txnAppId=txn.app_id, txnVersion=str(txn.version))
            return len(letters)
        on = " AND ".join(f"t.{c} <=> s.{c}" for c in ("origin", "`partition`", "`offset`"))
        with transaction(session, txn):
            (tables.delta_table(session, self.location).alias("t").merge(df.alias("s"), on)
             .whenNotMatchedInsertAll().execute())
        return len(letters)

    def count(self, session: "SparkSession") -> int:
        return tables.read(session, self.location).count() if tables.exists(session, self.location) else 0
