"""A gated turn of one table (supervisor.change_feed.turn_taker) against a query whose trigger is slow to plan.

No Spark: the query is a stand-in with Spark's ``status`` and ``lastProgress``, and the batch
function runs on a plain thread through the table's real gate.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from lakemirror.supervisor.apply_workers.query_gate import TurnGate
from lakemirror.supervisor.change_feed.shared_state import TableLive
from lakemirror.supervisor.change_feed.turn_taker import TableTurns, settled_without_batch
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec

PLANNING = {"message": "Getting offsets from DeltaSource", "isDataAvailable": False, "isTriggerActive": True}
PROCESSING = {"message": "Processing new data", "isDataAvailable": True, "isTriggerActive": True}
NO_DATA = {"message": "Waiting for data to arrive", "isDataAvailable": False, "isTriggerActive": False}
BETWEEN = {"message": "Waiting for next trigger", "isDataAvailable": True, "isTriggerActive": False}


def test_a_turn_settles_without_a_batch_only_on_sparks_no_data_answer_or_the_timeout() -> None:
    assert settled_without_batch(NO_DATA, 0.0)
    assert not settled_without_batch(PLANNING, 5.0), "Spark is still listing the source and planning"
    assert not settled_without_batch(PROCESSING, 5.0)
    assert not settled_without_batch(BETWEEN, 0.1), "the committed batch's trigger had data: not an answer"
    assert settled_without_batch(BETWEEN, 1.0, idle=1.0), "Spark waits for its trigger's time: a later turn"
    assert not settled_without_batch(None, 0.1)
    assert settled_without_batch(PLANNING, 30.0, timeout=30.0), "a stuck trigger does not hold the worker for good"


class SlowPlanningQuery:
    """A query holding batch 0 at its gate; once released, Spark commits it and spends
    ``plan_seconds`` planning batch 1 (``with_data``) or finds nothing new."""

    isActive = True

    def __init__(self, gate: TurnGate, applied: list[int], plan_seconds: float, with_data: bool) -> None:
        self.gate, self.applied = gate, applied
        self.plan_seconds, self.with_data = plan_seconds, with_data
        self.status: dict[str, Any] = dict(PROCESSING)
        self.lastProgress: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._stream, daemon=True)

    def _batch(self, batch_id: int) -> None:
        self.gate.pass_batch(lambda: self.applied.append(batch_id), batch_id)

    def _stream(self) -> None:
        self._batch(0)  # returns when a later turn releases the held batch
        self.lastProgress = {"batchId": 0}
        self.status = dict(PLANNING)
        time.sleep(self.plan_seconds)
        if self.with_data:
            self.status = dict(PROCESSING)
            self._batch(1)
        else:
            self.status = dict(NO_DATA)


def _turns(gate: TurnGate, query: SlowPlanningQuery, pending: bool) -> TableTurns:
    live = TableLive("t", applied_through=0, turn_proven=True, query=query)  # type: ignore[arg-type]

    class Commits:
        def has_commit(self, version: int) -> bool:
            return pending

        def commit_time(self, version: int) -> float | None:
            return None

    turns = TableTurns(live, PipelineSpec(pipeline_id="p", source_catalog="s", destination_catalog="d",
                                          schema_name="x", destination_schema="x", checkpoint_root="/tmp/ck"),
                       "t", commit_files=lambda: Commits(), failed=lambda e: None,  # type: ignore[arg-type,return-value]
                       collect=lambda: None, track=lambda q: None)
    turns.gate = gate
    return turns


def _held(plan_seconds: float, with_data: bool) -> tuple[TurnGate, list[int], SlowPlanningQuery]:
    gate, applied = TurnGate(), []
    query = SlowPlanningQuery(gate, applied, plan_seconds, with_data)
    query.thread.start()
    deadline = time.monotonic() + 5
    while not gate.waiting:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    gate.wait_ended(gate.grant(), 5.0)  # batch 0 applied in a first turn; the query now holds
    while gate.held_batch != 0:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return gate, applied, query


def test_a_turn_waits_for_a_batch_spark_plans_slowly_instead_of_leaving_it_for_the_next_round() -> None:
    gate, applied, query = _held(plan_seconds=2.0, with_data=True)  # a source on object storage
    turns = _turns(gate, query, pending=True)
    turns.take()
    assert applied == [0, 1], "the batch planned in the turn is applied in it, however long Spark planned"
    assert gate.held_batch == 1 or gate.ready


def test_a_turn_is_withdrawn_as_soon_as_spark_finds_no_new_data() -> None:
    gate, applied, query = _held(plan_seconds=0.3, with_data=False)
    turns = _turns(gate, query, pending=True)  # the commit check cannot rule it out
    began = time.monotonic()
    turns.take()
    assert time.monotonic() - began < 5.0
    assert applied == [0] and not gate.ready, "withdrawn: the query looks for new commits by itself"


def test_a_turn_is_withdrawn_at_once_when_the_source_has_nothing_new() -> None:
    gate, applied, query = _held(plan_seconds=3.0, with_data=False)
    turns = _turns(gate, query, pending=False)
    began = time.monotonic()
    turns.take()
    assert time.monotonic() - began < 2.0, "the commit check answers before Spark's trigger does"
    assert applied == [0]


def test_a_batch_on_its_destinations_server_frees_the_turns_worker() -> None:
    """A PostgreSQL replica's batch that waits on the server (a lock, an outage) must not hold the
    apply worker, which the other tables' turns need: the turn ends once the batch's own work is
    the server's, and the table's next turn comes after the batch has left the gate."""
    gate, on_server, release = TurnGate(), threading.Event(), threading.Event()

    def apply() -> None:
        on_server.set()        # the transaction is on the server: waiting for a lock...
        release.wait(30)       # ...until the other session lets it go

    batch = threading.Thread(target=gate.pass_batch, args=(apply, 0), daemon=True)
    batch.start()
    deadline = time.monotonic() + 5
    while not gate.waiting:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    query = SlowPlanningQuery(gate, [], 0.0, False)
    turns = _turns(gate, query, pending=True)
    turns.on_server = on_server.is_set
    turn = threading.Thread(target=turns.take, daemon=True)
    turn.start()
    turn.join(10)
    try:
        assert not turn.is_alive(), "the worker waited for the server's lock"
        assert gate.applying and not gate.ready, "the batch goes on; no second turn before it ends"
    finally:
        release.set()
    batch_left = time.monotonic() + 5
    while gate.held_batch != 0:
        assert time.monotonic() < batch_left
        time.sleep(0.005)
    assert gate.ready, "the applied batch holds the query until the table's next turn"
    gate.open()
