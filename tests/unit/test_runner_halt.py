"""Halting a table's query: the batch in flight finishes, a batch that begins meanwhile is refused,
and halt never holds the batch lock while the query stops (Spark's stop() waits for the thread
that runs foreachBatch; a batch blocked on that lock would wait for halt forever)."""

from __future__ import annotations

import threading

import pytest

from lakemirror.sinks.merge.delta_merge import TxnId
from lakemirror.supervisor.runner import Drained, TableRunner
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
