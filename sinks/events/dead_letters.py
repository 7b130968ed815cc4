"""The dead-letter Delta table of an event stream: poison messages, kept with the reason.

An event that cannot be decoded, lacks its key, or does not fit its replica's schema is appended
here and the stream goes on. The append runs under the batch's transaction id (Delta's
``txnAppId``/``txnVersion`` writer options), so a replayed batch does not record its dead letters
twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Sequence

from lakemirror import tables
from lakemirror.sinks.txn import TxnId
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
        """Append ``letters`` once per ``txn``; how many were given."""
        if not letters:
            return 0
        at = datetime.fromtimestamp(now, timezone.utc)
        rows = [(d.raw.origin, d.raw.partition, d.raw.offset, d.raw.key, d.raw.value, d.table, d.reason,
                 txn.version, at) for d in letters]
        df = session.createDataFrame(rows, DEAD_LETTER_DDL)
        tables.write(df, self.location, "append", txnAppId=txn.app_id, txnVersion=str(txn.version))
        return len(rows)

    def count(self, session: "SparkSession") -> int:
        return tables.read(session, self.location).count() if tables.exists(session, self.location) else 0
