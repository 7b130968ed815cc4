"""A change-feed batch that one row poisons: the row is dead-lettered, the rest of the batch applies.

A Delta replica may refuse a batch's MERGE because of one row's value, a refusal that no type check
can foresee: a ``CHECK`` constraint or a ``NOT NULL`` column an operator added to the replica
(``DELTA_VIOLATE_CONSTRAINT_WITH_VALUES``, ``DELTA_NOT_NULL_CONSTRAINT_VIOLATED``), a value cast the
write refuses. The MERGE is atomic: nothing of the batch is written. :class:`IsolatingMergeSink`
then takes the batch's winning change per key and bisects them by key
(:func:`lakemirror.sinks.isolate.bisect`): each attempt MERGEs the batch's rows of some keys under a
transaction id of its own derived from the batch's; a key whose change is refused alone goes to the
pipeline's dead-letter table (``_lakemirror_dead_letters`` beside the replica: table, key, commit
version, operation, the row as JSON, the engine's reason), every other key's change is applied.

Exactly once: a change-feed batch is stable (the same rows whenever it is read), its keys are
bisected in a fixed order, and each attempt's transaction id is skipped by Delta once committed, so
a batch replayed after a crash makes the same attempts (committed ones skipped, refused ones refused
again) and applies no key twice; the letters are MERGEd in on (table, key, commit version) under the
batch's own letters transaction id, so none is recorded twice. Keys are disjoint between attempts,
so no change can overtake another of its key.

The isolation itself (:func:`isolate_batch`) is plain Spark SQL and DataFrame calls, so over Spark
Connect the server's batch function runs the same code (:mod:`lakemirror.sinks.merge.connect_apply`)
and names the batch's letters in its outcome file for the daemon's counts.

The letters wait for the operator, who skips them or replays them (the key's row written again
from the source: :mod:`lakemirror.sinks.merge.letter_replay`) through the running daemon
(:mod:`lakemirror.supervisor.change_feed.dead_letters`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lakemirror.sinks.isolate import bisect, refused_by_value
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.planner import COMMIT_VERSION, OP_COLUMN
from lakemirror.sinks.merge.feed_letters import (  # noqa: F401 (importable from here as before)
    FEED_DEAD_LETTER_DDL, FEED_DEAD_LETTERS, FeedDeadLetters, FeedLetter, FeedLetterStore,
)
from lakemirror.sinks.txn import MergeOutcome, TxnId, transaction
from lakemirror.sinks.merge.delta_merge import counts_from_answer
from lakemirror.sources.connect_types import json_value_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
    from lakemirror.sinks.merge.planner import MergePlan
    from lakemirror.tables import TableLocation

log = logging.getLogger(__name__)

def refusal_reason(exc: BaseException) -> str | None:
    """The first line that names why a write was refused because of a value, else None."""
    text = f"{type(exc).__name__}: {exc}"
    if not refused_by_value(text):
        return None
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    named = [ln for ln in lines if refused_by_value(ln)]
    return (named or lines or [type(exc).__name__])[0][:500]


@dataclass(frozen=True)
class IsolatedOutcome(MergeOutcome):
    """A batch applied without the changes the replica refused (``dead_letters`` of them)."""

    dead_letters: int = 0


class IsolatingMergeSink:
    """A :class:`~lakemirror.sinks.merge.delta_merge.DeltaMergeSink` whose batch, refused because of a
    row's value, is applied without the refused rows, which are dead-lettered (see the module)."""

    def __init__(self, inner: "DeltaMergeSink", letters: FeedDeadLetters, table: str,
                 clock: Callable[[], float],
                 on_letters: Callable[[Sequence[FeedLetter]], None] = lambda letters: None) -> None:
        self.inner = inner
        self.letters = letters
        self.table = table
        self.clock = clock
        #: Told of every batch's letters once they are recorded (the pipeline's count of pending letters).
        self.on_letters = on_letters

    def ensure_chosen(self) -> None:
        """Choose the replica's apply path now (:meth:`DeltaMergeSink.ensure_chosen`)."""
        self.inner.ensure_chosen()

    def apply(self, batch: "DataFrame", txn: TxnId, read: Any = None) -> MergeOutcome:
        try:
            return self.inner.apply(batch, txn, read)
        except Exception as exc:
            reason = refusal_reason(exc)
            if reason is None:
                raise
        return self._isolate(batch, txn, reason)

    def _isolate(self, batch: "DataFrame", txn: TxnId, reason: str) -> MergeOutcome:
        outcome, letters = isolate_batch(batch, txn, reason, self.inner.target, self.inner.plan, self.letters,
                                         self.table, self.clock)
        self.on_letters(letters)
        return outcome


def isolate_batch(batch: "DataFrame", txn: TxnId, reason: str, target: "TableLocation", plan: "MergePlan",
                  letters: FeedLetterStore, table: str,
                  clock: Callable[[], float]) -> tuple[IsolatedOutcome, list[FeedLetter]]:
    """Apply ``batch`` (refused as a whole for ``reason``) without the changes the replica refuses,
    bisecting its winning changes by key, and record those in ``letters`` under the batch's letters
    transaction id; the outcome and the letters (see the module docstring).

    Plain Spark SQL and DataFrame calls only (SQL MERGEs, ``createDataFrame``, joins): the same code
    runs in a session with its own JVM and in a Spark Connect server's batch function
    (:mod:`lakemirror.sinks.merge.connect_apply`)."""
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink

    keys = list(plan.keys)
    session = batch.sparkSession
    plain = DeltaMergeSink(target, plan)  # the batch's rows of some keys: Spark's MERGE
    winners = sorted(plain.latest_changes(batch).collect(),
                     key=lambda r: json.dumps([r[k] for k in keys], default=str))
    log.warning("table %s: the replica refused batch %d (%s); finding the change(s) that cause it among %d keys",
                table, txn.version, reason, len(winners))

    def write(part: Sequence["Row"], attempt: TxnId) -> ApplyCounts | None:
        """One MERGE of ``part``'s keys; its counts, or None when Delta skipped it as a replay."""
        with transaction(session, attempt):
            answer = plain.merge_rows(session, _rows_of(session, batch, part, keys))
        return counts_from_answer(answer[0].asDict()) if answer else None

    found = bisect(winners, write, txn, refusal_reason, reason)
    refused = [_letter(session, batch, row, why, keys, table) for row, why in found.refused]
    letters.append(session, refused, letters_txn(txn), clock())
    log.warning("table %s: batch %d: %d change(s) refused by the replica, kept in %s (%s); the other %d "
                "applied in %d write(s)", table, txn.version, len(refused), FEED_DEAD_LETTERS,
                ", ".join(d.key for d in refused[:5]), len(winners) - len(refused), found.attempts)
    fresh = [c for c in found.applied if c is not None]
    counts = ApplyCounts(sum(c.inserted for c in fresh), sum(c.updated for c in fresh), sum(c.deleted for c in fresh))
    return IsolatedOutcome(DeltaMergeSink.stats(batch), counts, replayed=bool(found.applied) and not fresh,
                           dead_letters=len(refused)), refused


def letters_txn(txn: TxnId) -> TxnId:
    """The transaction id under which batch ``txn``'s letters are recorded (a replayed batch's are skipped)."""
    return TxnId(f"{txn.app_id}/dead-letters", txn.version)


def _rows_of(session: "SparkSession", batch: "DataFrame", part: Sequence["Row"], keys: list[str]) -> "DataFrame":
    """``batch``'s change rows of the keys of ``part`` (NULL keys matched as Spark's ``<=>``)."""
    from functools import reduce

    from pyspark.sql import functions as F

    key_schema = batch.select(*[F.col(f"`{k}`") for k in keys]).schema
    wanted = session.createDataFrame([tuple(r[k] for k in keys) for r in part], key_schema).alias("w")
    on = reduce(lambda a, b: a & b, [F.col(f"b.`{k}`").eqNullSafe(F.col(f"w.`{k}`")) for k in keys])
    return batch.alias("b").join(wanted, on, "left_semi")


def _letter(session: "SparkSession", batch: "DataFrame", row: "Row", reason: str, keys: list[str],
            table: str) -> FeedLetter:
    from pyspark.sql import functions as F

    values = row.asDict(recursive=True)
    key = {k: values[k] for k in keys}
    version = _rows_of(session, batch, [row], keys).agg(F.max(COMMIT_VERSION)).collect()[0][0]
    return FeedLetter(table, json_value_text(key), version, str(values.pop(OP_COLUMN, "")),
                      json_value_text(values), f"the replica refused it: {reason}")
