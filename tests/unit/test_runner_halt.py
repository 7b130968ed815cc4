"""Halting a table's query: the batch in flight finishes, a batch that begins meanwhile is refused,
and halt never holds the batch lock while the query stops (Spark's stop() waits for the thread
that runs foreachBatch; a batch blocked on that lock would wait for halt forever)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from lakemirror.sinks.merge.delta_merge import TxnId
from lakemirror.supervisor.change_feed.table_runner import Drained, TableRunner
from tests.unit.runner_fakes import table_runner


class _StreamThreadQuery:
    """A query whose stop() waits, like Spark's, for its stream thread to run one more batch."""

    def __init__(self, runner: TableRunner) -> None:
        self.runner = runner
        self.batch_outcome: list[str] = []
        self.stopped = False

    def stop(self) -> None:
        def next_batch() -> None:
            try:
                self.runner._apply_batch(None, TxnId("app", 7), None, 1)  # type: ignore[arg-type]  # noqa: SLF001
            except Drained:
                self.batch_outcome.append("refused")

        stream_thread = threading.Thread(target=next_batch)
        stream_thread.start()
        stream_thread.join(5.0)
        assert not stream_thread.is_alive(), "the batch blocked: halt held the batch lock across stop()"
        self.stopped = True


@pytest.mark.parametrize("apply_workers", [0, 1])
def test_a_batch_beginning_while_the_query_stops_is_refused_not_deadlocked(apply_workers: int) -> None:
    runner = table_runner(apply_workers=apply_workers)
    query = _StreamThreadQuery(runner)
    runner._query = query  # type: ignore[assignment]  # noqa: SLF001
    runner.halt(timeout=10.0)
    assert query.stopped and query.batch_outcome == ["refused"]
    assert not runner.ready_for_turn()


class _GoneQuery:
    """A query whose server has gone: stop() never returns (its client retries for minutes)."""

    def __init__(self) -> None:
        self.stop_called = threading.Event()

    def stop(self) -> None:
        self.stop_called.set()
        threading.Event().wait()


def _halted_within(halt: Any, seconds: float) -> bool:
    thread = threading.Thread(target=halt, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def test_a_stop_that_never_returns_ends_the_halt_at_its_deadline_naming_what_was_left() -> None:
    runner = table_runner()
    query = _GoneQuery()
    runner._query = query  # type: ignore[assignment]  # noqa: SLF001
    assert _halted_within(lambda: runner.halt(timeout=0.3), 20.0), "halt waited for stop() past its deadline"
    assert query.stop_called.is_set() and runner.live.query is None
    assert runner.halting == "stopping its query"


def test_a_halt_that_finished_everything_leaves_nothing_named() -> None:
    runner = table_runner()
    query = _StreamThreadQuery(runner)
    runner._query = query  # type: ignore[assignment]  # noqa: SLF001
    runner.halt(timeout=10.0)
    assert runner.halting is None


def test_an_event_sources_stop_that_never_returns_ends_its_halt_at_the_deadline(tmp_path: Path) -> None:
    from lakemirror.sources.kafka_offsets import StaticOffsets
    from tests.unit.test_event_control import runner as event_runner

    r = event_runner(tmp_path, StaticOffsets())
    query = _GoneQuery()
    r._query = query  # type: ignore[assignment]  # noqa: SLF001
    assert _halted_within(lambda: r.halt(timeout=0.3), 20.0), "halt waited for stop() past its deadline"
    assert query.stop_called.is_set() and r.halting == "stopping its query"


def test_a_batch_still_running_at_the_deadline_is_what_the_halt_names() -> None:
    runner = table_runner()
    runner.apply_batch.lock.acquire()  # a batch in flight that does not end
    try:
        runner._query = _GoneQuery()  # type: ignore[assignment]  # noqa: SLF001
        assert _halted_within(lambda: runner.halt(timeout=0.3), 20.0)
        assert runner.halting == "waiting for its batch in flight"
    finally:
        runner.apply_batch.lock.release()
