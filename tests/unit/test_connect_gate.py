"""Turns across the Spark Connect boundary (sinks/merge/connect_gate.py): the batch function's side
on a plain thread, as in the server's Python worker, the daemon's side driven by the table's real
turn logic (supervisor/change_feed/turn_taker.py) against a stand-in query. No Spark."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lakemirror.sinks.merge.connect_gate import DAEMON_GONE_SECONDS, FileTurnGate, GateClosed, ServerGate, gate_folder
from tests.unit.test_turn_taker import NO_DATA, PLANNING, PROCESSING, _turns


def wait_for(predicate: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class ServerQuery:
    """A query on the server: batch 0, then (once released) batch 1 if ``with_data``; each batch
    applied through the gate of files as connect_apply.apply_batch does."""

    isActive = True

    def __init__(self, folder: str, generation: str, applied: list[int], with_data: bool = True) -> None:
        self.gate = ServerGate(folder, generation)
        self.applied, self.with_data = applied, with_data
        self.status: dict[str, Any] = dict(PROCESSING)
        self.lastProgress: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._stream, daemon=True)

    def _batch(self, batch_id: int) -> None:
        turn = self.gate.enter(batch_id)
        assert turn is not None
        try:
            self.applied.append(batch_id)
        finally:
            self.gate.leave(turn)
        self.gate.hold(batch_id, turn)

    def _stream(self) -> None:
        try:
            self._batch(0)
            self.lastProgress = {"batchId": 0}
            self.status = dict(PLANNING)
            time.sleep(0.2)
            if self.with_data:
                self.status = dict(PROCESSING)
                self._batch(1)
                self.lastProgress = {"batchId": 1}
            else:
                self.status = dict(NO_DATA)
        except BaseException as exc:  # noqa: BLE001 (the query's failure, read by the test)
            self.error = exc


def started(tmp_path: Path, with_data: bool = True) -> tuple[FileTurnGate, ServerQuery, list[int]]:
    gate = FileTurnGate(gate_folder(str(tmp_path / "e0")))
    generation = gate.take_over()
    applied: list[int] = []
    query = ServerQuery(str(gate.folder), generation, applied, with_data)
    query.thread.start()
    wait_for(lambda: gate.waiting)
    return gate, query, applied


def test_a_batch_applies_only_in_its_turn_and_holds_the_query_until_the_next(tmp_path: Path) -> None:
    gate, query, applied = started(tmp_path)
    assert gate.ready and applied == []  # planned by Spark, waiting for a turn
    turns = _turns(gate, query, pending=True)  # type: ignore[arg-type]
    turns.take()
    assert applied == [0]
    wait_for(lambda: gate.held_batch == 0)  # applied, held: Spark has not committed it
    assert query.lastProgress is None
    turns.take()  # the next turn releases it; Spark commits it, plans batch 1, which takes the turn
    assert applied == [0, 1]
    wait_for(lambda: gate.held_batch == 1)
    assert query.error is None


def test_a_turn_with_nothing_new_is_withdrawn_and_no_batch_takes_it(tmp_path: Path) -> None:
    gate, query, applied = started(tmp_path, with_data=False)
    turns = _turns(gate, query, pending=True)  # type: ignore[arg-type]
    turns.take()
    wait_for(lambda: gate.held_batch == 0)
    turns.take()  # releases batch 0; Spark finds nothing new: the turn is withdrawn
    query.thread.join(5)
    assert applied == [0] and not gate.ready and not list(gate.folder.glob("grant-*"))
    assert list(gate.folder.glob("withdrawn-*"))


def test_a_grant_is_either_taken_or_withdrawn_never_both(tmp_path: Path) -> None:
    gate = FileTurnGate(gate_folder(str(tmp_path)))
    gate.take_over()
    turn = gate.grant()
    assert gate.withdraw() is True and gate.withdraw() is False
    turn = gate.grant()
    os.rename(gate.folder / f"grant-{turn}", gate.folder / f"taken-{turn}")  # the batch function took it
    assert gate.withdraw() is False and gate.applying
    os.rename(gate.folder / f"taken-{turn}", gate.folder / f"done-{turn}")
    assert gate.wait_ended(turn, 1.0) and not gate.applying


def test_a_query_an_earlier_daemon_left_on_the_server_stops_before_applying(tmp_path: Path) -> None:
    old = FileTurnGate(gate_folder(str(tmp_path)))
    applied: list[int] = []
    query = ServerQuery(str(old.folder), old.take_over(), applied)
    query.thread.start()
    wait_for(lambda: old.waiting)
    FileTurnGate(gate_folder(str(tmp_path))).take_over()  # a new daemon run
    query.thread.join(5)
    assert isinstance(query.error, GateClosed) and "took over" in str(query.error) and applied == []


def test_a_waiting_batch_function_gives_up_on_a_daemon_gone_and_a_draining_one_applies_nothing(tmp_path: Path) -> None:
    gate = FileTurnGate(gate_folder(str(tmp_path)))
    generation = gate.take_over()
    now = [time.time()]
    server = ServerGate(str(gate.folder), generation, clock=lambda: now[0], sleep=lambda s: None)
    now[0] += DAEMON_GONE_SECONDS + 1
    with pytest.raises(GateClosed, match="has not been seen"):
        server.enter(3)
    now[0] = time.time()
    gate.open()
    with pytest.raises(GateClosed, match="draining"):
        server.enter(3)
    server.hold(2, 1)  # a held batch is let go: Spark commits it, the next one is refused
    assert not gate.waiting and gate.held_batch is None
