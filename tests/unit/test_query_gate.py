"""The gate an always-on query's batch function waits at for its table's turn (no Spark: the
stream's thread is a plain thread here)."""

from __future__ import annotations

import threading
import time

from lakemirror.supervisor.apply_workers.query_gate import TurnGate


def _batch(gate: TurnGate, applied: list[int], batch_id: int) -> threading.Thread:
    """The runner's batch function on Spark's stream thread: its apply records the batch id."""
    thread = threading.Thread(target=gate.pass_batch, args=(lambda: applied.append(batch_id), batch_id), daemon=True)
    thread.start()
    return thread


def _until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _held_after_its_first_batch(gate: TurnGate, applied: list[int]) -> threading.Thread:
    """A query whose first batch was applied in a turn and now holds it, waiting for the next."""
    first = _batch(gate, applied, 0)
    _until(lambda: gate.waiting)
    gate.wait_ended(gate.grant(), 5.0)
    _until(lambda: gate.held_batch == 0)
    return first


def test_a_batch_applies_only_in_a_granted_turn_and_then_holds_the_query() -> None:
    gate, applied = TurnGate(), []
    first = _batch(gate, applied, 0)
    _until(lambda: gate.waiting)
    assert gate.ready and applied == [], "a planned batch waits for its turn"
    since = gate.grant()
    assert gate.wait_ended(since, 5.0)
    assert applied == [0]
    _until(lambda: gate.held_batch == 0)
    assert first.is_alive(), "after applying, the batch function holds the query until the next turn"
    assert gate.ready and not gate.waiting


def test_the_next_turn_releases_the_held_batch_and_the_grant_passes_to_the_next_batch() -> None:
    gate, applied = TurnGate(), []
    first = _held_after_its_first_batch(gate, applied)
    since = gate.grant()
    first.join(5.0)
    assert not first.is_alive(), "the grant lets the held batch return to Spark"
    assert gate.held_batch is None and not gate.ready, "a granted turn is not offered again"
    _batch(gate, applied, 1)  # what Spark plans next takes the grant without waiting
    assert gate.wait_ended(since, 5.0)
    assert applied == [0, 1]


def test_a_turn_no_batch_began_in_is_withdrawn_and_a_later_batch_waits_for_another() -> None:
    gate, applied = TurnGate(), []
    first = _held_after_its_first_batch(gate, applied)
    since = gate.grant()
    first.join(5.0)
    assert not gate.wait_ended(since, 0.05), "nothing new: no batch ends"
    assert gate.withdraw()
    assert not gate.ready, "a query looking for commits by itself is not offered a turn"
    _batch(gate, applied, 1)
    _until(lambda: gate.waiting)
    time.sleep(0.05)
    assert applied == [0], "a batch planned outside a turn does not apply"
    assert gate.ready
    assert gate.wait_ended(gate.grant(), 5.0)
    assert applied == [0, 1]


def test_withdrawing_a_turn_a_batch_took_meanwhile_fails_so_the_worker_waits_for_it() -> None:
    gate, applied = TurnGate(), []
    release = threading.Event()

    def slow() -> None:
        release.wait(5.0)
        applied.append(0)
    thread = threading.Thread(target=gate.pass_batch, args=(slow, 0), daemon=True)
    thread.start()
    _until(lambda: gate.waiting)
    since = gate.grant()
    _until(lambda: gate.applying)
    assert not gate.withdraw(), "the batch has taken the turn"
    release.set()
    assert gate.wait_ended(since, 5.0)
    assert applied == [0] and not gate.applying


def test_a_failed_batch_ends_its_turn() -> None:
    gate = TurnGate()
    errors = []

    def merge() -> None:
        raise RuntimeError("the MERGE failed")

    def batch_function() -> None:
        try:
            gate.pass_batch(merge, 0)
        except RuntimeError as exc:  # raised to Spark, which fails the query
            errors.append(exc)
    thread = threading.Thread(target=batch_function, daemon=True)
    thread.start()
    _until(lambda: gate.waiting)
    assert gate.wait_ended(gate.grant(), 5.0)
    thread.join(5.0)
    assert errors and not gate.applying and gate.held_batch is None, "a failed batch does not hold the query"


def test_opening_the_gate_releases_a_held_query_and_lets_later_batches_through_for_good() -> None:
    gate, applied = TurnGate(), []
    first = _held_after_its_first_batch(gate, applied)
    gate.open()
    first.join(5.0)
    assert not first.is_alive(), "a stopping query is never held in Python"
    later = _batch(gate, applied, 1)
    later.join(5.0)
    assert not later.is_alive() and applied == [0, 1], "the runner refuses such a batch itself (Drained)"
    assert not gate.ready
