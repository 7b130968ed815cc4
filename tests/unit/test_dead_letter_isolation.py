"""One bad event never stops the others: a write a replica refuses is bisected to its poison changes,
which become dead letters naming their table, key and position; everything else applies, the
source's other tables too. A batch replayed after a crash repeats the same attempts, so nothing is
applied or dead-lettered twice. The operator skips or replays letters; a replay goes through the
sequence guard and cannot move a row backwards. Without Spark: the guarded sink's and the
dead-letter table's in-memory twins."""

from __future__ import annotations

import json
from typing import Any, Sequence

import pytest

from lakemirror.sinks.events.dead_letters import PENDING, REPLAYED, SKIPPED, InMemoryDeadLetters
from lakemirror.sinks.event_contract import EventBatchResult, EventTxn
from lakemirror.sinks.events.letter_resolution import resolve_letters
from lakemirror.sinks.events.memory_sink import MemoryEventStore, MemoryGuardedSink, memory_event_sink
from lakemirror.sinks.isolate import attempt_txn, bisect, value_refusal
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.change_event import ChangeEvent
from lakemirror.sources.event_stream import EventDecoder, RawEvent, decode_batch
from lakemirror.supervisor.events.dead_letters import LetterIndex
from lakemirror.supervisor.events.stream_spec import EventStreamSpec

BATCH = TxnId("lakemirror/p/shop/orders/e1", 7)


class Refused(Exception):
    pass


def refusal(exc: BaseException) -> str | None:
    return str(exc) if isinstance(exc, Refused) else None


def writer(poison: set[int], committed: set[tuple[str, int]], applied: list[int]) -> Any:
    """A write of integers under transaction ids: refused whole when it holds a poison item, skipped
    when its id was committed (as Delta skips a replay)."""
    def write(part: Sequence[int], txn: TxnId) -> list[int]:
        if (txn.app_id, txn.version) in committed:
            return []
        bad = sorted(set(part) & poison)
        if bad:
            raise Refused(f"value {bad[0]} out of range")
        committed.add((txn.app_id, txn.version))
        applied.extend(part)
        return list(part)
    return write


def test_bisection_refuses_exactly_the_poison_items_and_applies_the_rest() -> None:
    items = list(range(100))
    committed: set[tuple[str, int]] = set()
    applied: list[int] = []
    found = bisect(items, writer({13, 14, 77}, committed, applied), BATCH, refusal, "value out of range")
    assert sorted(i for i, _ in found.refused) == [13, 14, 77]
    assert sorted(applied) == [i for i in items if i not in (13, 14, 77)]
    assert all(app.startswith(BATCH.app_id + "/isolate/") for app, _ in committed)
    assert {v for _, v in committed} == {BATCH.version}


def test_a_replayed_batch_repeats_the_same_attempts_and_applies_nothing_twice() -> None:
    committed: set[tuple[str, int]] = set()
    first: list[int] = []
    bisect(list(range(40)), writer({5}, committed, first), BATCH, refusal, "bad")
    again: list[int] = []
    replay = bisect(list(range(40)), writer({5}, committed, again), BATCH, refusal, "bad")
    assert again == [] and [i for i, _ in replay.refused] == [5]


def test_an_error_no_value_caused_is_raised_and_nothing_is_dead_lettered() -> None:
    def flaky(part: Sequence[int], txn: TxnId) -> None:
        raise ConnectionError("the store went away")

    with pytest.raises(ConnectionError):
        bisect([1, 2, 3], flaky, BATCH, refusal, "bad")


def test_a_single_refused_item_is_refused_without_another_write() -> None:
    found = bisect([9], writer(set(), set(), []), BATCH, refusal, "the reason")
    assert found.refused == [(9, "the reason")] and found.attempts == 0


def test_each_attempt_has_an_app_id_of_its_own_so_a_refused_one_is_never_skipped() -> None:
    """Delta skips every version up to the last one an app id committed: under one app id, attempt 0
    (refused) would pass for committed once attempt 1 has committed, and its dead letter be lost."""
    assert attempt_txn(BATCH, 0).app_id != attempt_txn(BATCH, 1).app_id
    assert attempt_txn(BATCH, 1).version == attempt_txn(TxnId(BATCH.app_id, 7), 1).version == 7
    with pytest.raises(ValueError):
        attempt_txn(BATCH, -1)


def test_delta_and_delta_rs_refusals_are_told_from_transient_failures() -> None:
    assert value_refusal(Exception("[NUMERIC_VALUE_OUT_OF_RANGE.WITH_SUGGESTION] 1E+32 cannot be represented"))
    assert value_refusal(Exception("[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint positive (amount > 0)"))
    assert value_refusal(Exception("Generic DeltaTable error: Invariant violations: [\"Check or Invariant (x > 0)\"]"))
    assert value_refusal(Exception("[DELTA_CONCURRENT_APPEND] Files were added")) is None
    assert value_refusal(ConnectionResetError("Connection reset by peer")) is None


# -- an event source's batches, with the guarded sink's twin -------------------------------------------


def event(table: str, op: str, key: int, ts: int, **columns: Any) -> str:
    doc: dict[str, Any] = {"table_name": table, "operation": op, "timestamp": ts, "transaction_id": f"t{ts}",
                           "primary_key": {"id": key}}
    doc["after" if op != "DELETE" else "before"] = {"id": key, **columns}
    return json.dumps(doc)


def raws(lines: Sequence[str], first_line: int = 1) -> list[RawEvent]:
    return [RawEvent(line, None, "/in/batch.jsonl", None, n) for n, line in enumerate(lines, start=first_line)]


class Setup:
    def __init__(self, constraint: Any = lambda change: True) -> None:
        spec = EventStreamSpec("shop", "files", format="simple", table_workers=1)
        self.letters = InMemoryDeadLetters()
        self.sinks = {t: MemoryGuardedSink(constraint=constraint) for t in ("orders", "users")}
        store = MemoryEventStore(dict(self.sinks), self.letters, clock=lambda: 1_000.0)
        self.applier = memory_event_sink(spec, EventDecoder("files", "simple"), "p", store, clock=lambda: 1_000.0)

    def apply(self, events: Sequence[RawEvent], batch_id: int, epoch: str = "e1") -> EventBatchResult:
        """One micro-batch as the runner hands it to the sink: decoded, under its transaction id."""
        decoded = decode_batch(events, self.applier.decoder, self.applier.spec.tables)
        return self.applier.apply(decoded, EventTxn(epoch, batch_id))

    def rows(self, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
        return self.sinks[table].replica.live()


def positive(change: ChangeEvent) -> bool:
    """A CHECK (amount > 0) an operator put on the orders replica."""
    return change.table != "orders" or (change.columns.get("amount") or 0) > 0


BATCH_LINES = [event("orders", "INSERT", k, 100 + k, amount=-5 if k == 3 else k) for k in range(1, 7)] + \
              [event("users", "INSERT", k, 200 + k, name=f"u{k}") for k in range(1, 4)]


def test_a_refused_change_is_dead_lettered_and_every_other_change_applies() -> None:
    s = Setup(positive)
    result = s.apply(raws(BATCH_LINES), 0)
    assert sorted(s.rows("orders")) == [(1,), (2,), (4,), (5,), (6,)]
    assert sorted(s.rows("users")) == [(1,), (2,), (3,)]     # the other table never waited
    assert result.dead_letters == 1 and result.outcomes["orders"].counts.inserted == 5
    [letter] = s.letters.letters(None)
    assert (letter.table, letter.change_key, letter.raw.offset, letter.status) == ("orders", '{"id": 3}', 3, PENDING)
    assert letter.position is not None and letter.position.startswith("stream timestamp_us=")
    assert "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES" in letter.reason


def test_the_batch_replayed_after_a_crash_applies_and_dead_letters_nothing_twice() -> None:
    s = Setup(positive)
    s.apply(raws(BATCH_LINES), 0)
    before = {t: s.rows(t) for t in ("orders", "users")}
    writes = len(s.sinks["orders"].writes)
    again = s.apply(raws(BATCH_LINES), 0)   # Spark replays the batch: same id, same rows
    assert {t: s.rows(t) for t in ("orders", "users")} == before
    assert len(s.letters.rows) == 1 and again.outcomes["orders"].counts.inserted == 0
    assert [d.raw.offset for d in again.letters] == [3]  # refused again: its letter is written even if the crash
    #                                                      came before the first run's letters were
    assert len(s.sinks["orders"].writes) - writes == writes  # the same attempts, each skipped or refused again


def test_a_replay_applies_the_letter_once_the_replica_takes_it() -> None:
    s = Setup(positive)
    s.apply(raws(BATCH_LINES), 0)
    [letter] = s.letters.letters(None)
    still = resolve_letters(s.applier, "replay", [letter.id])   # the constraint still refuses it
    assert [(r.status, r.resolution) for r in still.resolutions] == [(PENDING, "replay refused")]
    s.sinks["orders"].constraint = lambda change: True          # the operator dropped the constraint
    done = resolve_letters(s.applier, "replay", [letter.id])
    assert [r.status for r in done.resolutions] == [REPLAYED] and "1 inserted" in done.resolutions[0].resolution
    assert s.rows("orders")[(3,)] == {"id": 3, "amount": -5}
    assert s.letters.letters(None)[0].status == REPLAYED


def test_a_replay_cannot_move_a_row_backwards() -> None:
    s = Setup(positive)
    s.apply(raws(BATCH_LINES), 0)
    s.apply(raws([event("orders", "UPDATE", 3, 500, amount=30)], 20), 1)  # newer, and valid
    [letter] = s.letters.letters(None)
    s.sinks["orders"].constraint = lambda change: True
    done = resolve_letters(s.applier, "replay", [letter.id])
    assert done.resolutions[0].status == REPLAYED and "1 stale" in done.resolutions[0].resolution
    assert s.rows("orders")[(3,)] == {"id": 3, "amount": 30}


def test_skip_marks_letters_and_writes_no_replica() -> None:
    s = Setup(positive)
    s.apply(raws(BATCH_LINES + ["not json"]), 0)
    rows = dict(s.rows("orders"))
    report = resolve_letters(s.applier, "skip", None, table="orders")   # every pending letter of orders
    assert [r.status for r in report.resolutions] == [SKIPPED] and s.rows("orders") == rows
    pending = [x for x in s.letters.letters(None) if x.status == PENDING]
    assert len(pending) == 1 and pending[0].table is None             # the undecodable line is left
    assert resolve_letters(s.applier, "skip", ["nope"]).unknown == ("nope",)


def test_the_letter_index_counts_what_the_table_holds_across_restarts() -> None:
    s = Setup(positive)
    result = s.apply(raws(BATCH_LINES + ["not json"]), 0)
    index = LetterIndex()
    assert index.add(result.letters) == 2 and index.add(result.letters) == 0  # a replayed batch adds none
    restarted = LetterIndex()
    restarted.seed(s.letters.letters(None))
    assert restarted.total == 2 and restarted.pending() == {"orders": 1, "": 1}


def test_a_change_feed_refusal_names_the_line_that_says_why() -> None:
    from lakemirror.sinks.merge.row_isolation import FeedLetter, refusal_reason

    exc = Exception("An error occurred while calling o123.sql.\n: org.apache.spark.SparkRuntimeException: "
                    "[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint positive (amount > 0) violated by row "
                    "with values:\n - amount : -2.50\n\tat org.apache...")
    assert refusal_reason(exc) is not None and refusal_reason(exc).startswith(": org.apache.spark")  # type: ignore[union-attr]
    assert refusal_reason(TimeoutError("read timed out")) is None
    one = FeedLetter("s.s.src", '{"id": 2}', 3, "update_postimage", "{}", "r")
    assert one.id == FeedLetter("s.s.src", '{"id": 2}', 3, "insert", "{}", "other").id  # keyed by table, key, version
    assert one.id != FeedLetter("s.s.src", '{"id": 2}', 4, "update_postimage", "{}", "r").id
