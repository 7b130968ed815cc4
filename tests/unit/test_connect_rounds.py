"""Spark Connect batches reported through outcome files, their rows appended a round at a time, and
a crash inside a round that loses and doubles nothing (no Spark: the server's batch function is
played by writing its outcome files, the checkpoint table by its in-memory twin)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from lakemirror.checkpoints.records import CheckpointRow, InMemoryCheckpointStore
from lakemirror.checkpoints.round_rows import RoundRows
from lakemirror.sinks.merge.connect_apply import ConnectBatchJob
from lakemirror.sinks.merge.connect_batches import ConnectBatches
from lakemirror.sinks.merge.connect_outcomes import (BatchOutcome, batch_ids, forget_outcomes, outcome_folder,
                                                     read_outcomes, write_outcome)
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.schema import Column
from lakemirror.supervisor.change_feed.batch_apply import RowWriter
from lakemirror.supervisor.change_feed.server_batches import report_server_batches
from lakemirror.supervisor.change_feed.shared_state import BatchReport, TableLive

APP = "lakemirror/p/src__sales__t/e0"


def outcome(batch_id: int, *, replayed: bool = False, app: str = APP) -> BatchOutcome:
    return BatchOutcome(batch_id=batch_id, txn_app_id=app, rows_read=10, first_version=2 * batch_id + 1,
                        last_version=2 * batch_id + 2, inserted=3, updated=4, deleted=1, replayed=replayed,
                        started_at=1000.0 + batch_id, ended_at=1000.5 + batch_id)


def test_an_outcome_file_is_read_back_as_written_and_forgotten_up_to_a_batch(tmp_path: Path) -> None:
    folder = outcome_folder(str(tmp_path / "e0"))
    for b in (0, 1, 2, 10):
        write_outcome(folder, outcome(b))
    (Path(folder) / ".3.json.123.tmp").write_text("{half")  # an interrupted write is no outcome
    assert batch_ids(folder) == [0, 1, 2, 10]
    assert read_outcomes(folder, 1) == [outcome(2), outcome(10)]
    write_outcome(folder, outcome(2, replayed=True))  # a replay writes its batch's file again
    assert read_outcomes(folder, 1)[0].replayed is True
    assert forget_outcomes(folder, 2) == 3
    assert batch_ids(folder) == [10]
    assert read_outcomes(str(tmp_path / "nothing"), -1) == []


class Gate:
    """A linger that waits for the test: rows handed in meanwhile join the same round."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def __call__(self, seconds: float) -> None:
        self.go.wait(10)


def row(batch_id: int, app: str = APP) -> CheckpointRow:
    from datetime import datetime, timezone

    at = datetime.fromtimestamp(1000, tz=timezone.utc)
    return CheckpointRow(pipeline_id="p", source_fqn="src.sales.t", dest_fqn="dst.sales.t", epoch=0, batch_id=batch_id,
                         txn_app_id=app, first_version=1, last_version=2, last_committed_version=2, rows_read=1,
                         rows_merged=1, rows_inserted=1, rows_updated=0, rows_deleted=0, lag_seconds=None, error=None,
                         degraded=False, started_at=at, ended_at=at)


def test_rows_handed_in_together_are_appended_in_one_commit_then_their_owners_are_told() -> None:
    store = InMemoryCheckpointStore()
    gate = Gate()
    rounds = RoundRows(store, sleep=gate)
    told: list[int] = []
    for b, app in ((0, "a"), (0, "b"), (1, "a")):
        rounds.submit(row(b, app), lambda b=b, app=app: told.append((app, b)))  # type: ignore[misc]
    assert store.rows == []  # nothing blocks the caller
    gate.go.set()
    assert rounds.flush(10)
    assert (store.commits, rounds.round_sizes, len(store.rows)) == (1, [3], 3)
    assert sorted(told) == [("a", 0), ("a", 1), ("b", 0)]
    rounds.close()


def test_a_failed_append_is_tried_again_and_flush_waits_for_it() -> None:
    class Flaky(InMemoryCheckpointStore):
        def __init__(self) -> None:
            super().__init__()
            self.failures = 2

        def append_rows(self, rows: list[CheckpointRow]) -> None:
            if self.failures:
                self.failures -= 1
                raise OSError("the store is away")
            super().append_rows(rows)

    store = Flaky()
    pauses: list[float] = []
    rounds = RoundRows(store, sleep=pauses.append)
    rounds.submit(row(0))
    assert rounds.flush(10)
    assert [r.batch_id for r in store.rows] == [0] and store.failures == 0
    assert pauses.count(0.5) >= 1 and 1.0 in pauses  # the retry pause grows
    rounds.close()


def test_a_row_handed_in_with_a_failure_callback_is_handed_back_not_tried_again() -> None:
    """The driver's commit-file batches fail their table instead (their relaunch replays the batch);
    the Connect rows of the same round are kept and tried again, and only they pass the Connect
    crash points."""
    class RefusesOnce(InMemoryCheckpointStore):
        refusals = 1

        def append_rows(self, rows: list[CheckpointRow]) -> None:
            if self.refusals:
                self.refusals -= 1
                raise OSError("the store is away")
            super().append_rows(rows)

    store = RefusesOnce()
    gate = Gate()
    points: list[str] = []
    rounds = RoundRows(store, sleep=gate, fault=points.append)
    failed: list[str] = []
    durable: list[str] = []
    rounds.submit(row(0, "driver"), lambda: durable.append("driver"), lambda exc: failed.append(str(exc)))
    rounds.submit(row(0, "server"), lambda: durable.append("server"))
    gate.go.set()
    assert rounds.flush(10)
    assert failed == ["the store is away"] and durable == ["server"]
    assert [r.txn_app_id for r in store.rows] == ["server"]
    assert points == ["connect_before_rows", "connect_before_rows", "connect_after_rows"]
    rounds.submit(row(1, "driver"), lambda: durable.append("driver"), failed.append)  # type: ignore[arg-type]
    assert rounds.flush(10) and durable == ["server", "driver"]
    assert points == ["connect_before_rows", "connect_before_rows", "connect_after_rows"], "no Connect row"
    rounds.close()


class Daemon:
    """One run of the daemon's side of a table over Spark Connect, down to what the runner does at
    each poll (supervisor/change_feed/server_batches.py) and at its start (the checkpoint table's last batch)."""

    def __init__(self, folder: str, store: InMemoryCheckpointStore, kill_at: str | None = None) -> None:
        plan = plan_merge([Column("id", "bigint", False)], ["id"])
        self.batches = ConnectBatches(ConnectBatchJob("delta.`/r`", plan, APP, folder))
        self.batches.start_after(store.last_batch(APP))
        self.crashed = threading.Event()

        def fault(point: str) -> None:
            if point == kill_at:  # the process dies here: nothing more happens on this thread
                self.crashed.set()
                threading.Event().wait()
        self.rounds = RoundRows(store, fault=fault, sleep=lambda s: None)
        self.live = TableLive("t")
        self.writer = RowWriter("p", "src.sales.t", "dst.sales.t", store, clock=lambda: 2000.0)

    def poll(self) -> list[Any]:
        report_server_batches(self.batches, self.rounds, self.writer, self.live, 0, None)
        return self.live.take_events()


@pytest.mark.parametrize("kill_at", ["connect_before_rows", "connect_after_rows"])
def test_a_crash_inside_a_round_loses_no_row_and_doubles_none(tmp_path: Path, kill_at: str) -> None:
    folder = outcome_folder(str(tmp_path / "e0"))
    store = InMemoryCheckpointStore()
    for b in (0, 1):  # the server applied two batches
        write_outcome(folder, outcome(b))
    first = Daemon(folder, store, kill_at=kill_at)
    reports = [e for e in first.poll() if isinstance(e, BatchReport)]
    assert [r.batch_id for r in reports] == [0, 1] and first.live.applied_through == 4
    assert first.crashed.wait(10)  # the writer thread died at the point (the process, in a real crash)
    written = [r.batch_id for r in store.rows]  # the first round: both rows, or the first alone
    assert written == [] if kill_at == "connect_before_rows" else written in ([0], [0, 1])
    assert batch_ids(folder) == [0, 1]  # the files stay until their rows are durable and forgotten
    # While the daemon was down the server applied batch 2 and replayed batch 1 (Spark had not
    # committed it): its MERGE skipped by the transaction id, its file written again.
    write_outcome(folder, outcome(2))
    write_outcome(folder, outcome(1, replayed=True))
    second = Daemon(folder, store)
    second.poll()
    assert second.rounds.flush(10)
    assert sorted(r.batch_id for r in store.rows) == [0, 1, 2]  # each batch's row once
    assert batch_ids(folder) == []
    assert second.poll() == []
    third = Daemon(folder, store)  # a later start: nothing to record again
    assert third.poll() == [] and len(store.rows) == 3
    for d in (first, second, third):
        d.rounds.close(1)


def test_outcomes_of_another_epochs_batch_function_are_not_this_ones(tmp_path: Path) -> None:
    folder = outcome_folder(str(tmp_path / "e0"))
    write_outcome(folder, outcome(0, app="lakemirror/p/src__sales__t/e9"))
    daemon = Daemon(folder, InMemoryCheckpointStore())
    assert daemon.poll() == []
    daemon.rounds.close(1)


def test_a_rows_source_commit_times_come_from_the_outcome_and_an_older_file_without_them_still_reads(
        tmp_path: Path) -> None:
    """The checkpoint row keeps the source commit times of the batch's first and last versions (the
    inputs of recovery points); an outcome file written before they were carried reads with none."""
    from dataclasses import replace
    from datetime import datetime, timezone

    folder = outcome_folder(str(tmp_path / "e0"))
    write_outcome(folder, replace(outcome(0), min_commit_time=900.0, max_commit_time=950.5))
    old = outcome(1).to_json().replace(', "min_commit_time": null', "").replace(', "max_commit_time": null', "")
    assert "commit_time" not in old
    (Path(folder) / "1.json").write_text(old)
    store = InMemoryCheckpointStore()
    daemon = Daemon(folder, store)
    daemon.poll()
    assert daemon.rounds.flush(10)
    by_batch = {r.batch_id: r for r in store.rows}
    assert (by_batch[0].first_version_at, by_batch[0].last_version_at) == (
        datetime.fromtimestamp(900.0, tz=timezone.utc), datetime.fromtimestamp(950.5, tz=timezone.utc))
    assert (by_batch[1].first_version_at, by_batch[1].last_version_at) == (None, None)
    daemon.rounds.close(1)


def test_a_server_batchs_dead_letters_reach_the_daemons_counts_once(tmp_path: Path) -> None:
    """The server isolated a batch's refused row: its outcome file names the letter, the daemon's
    poll hands it to the pipeline's counts, and a file read again after a crash names it again (the
    desk counts a letter once, by its id); an outcome file of an older version has no letters."""
    from dataclasses import asdict, replace

    from lakemirror.sinks.merge.connect_batches import outcome_letters
    from lakemirror.sinks.merge.feed_letters import FeedLetter

    letter = FeedLetter("src.sales.t", '{"id": 2}', 4, "insert", '{"id": 2, "v": 500}',
                        "the replica refused it: [DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint small")
    folder = outcome_folder(str(tmp_path / "e0"))
    write_outcome(folder, replace(outcome(0), dead_letters=[asdict(letter)]))
    (Path(folder) / "1.json").write_text(outcome(1).to_json().replace(', "dead_letters": []', ""))  # an older file
    assert "dead_letters" not in (Path(folder) / "1.json").read_text()
    read = read_outcomes(folder, -1)
    assert [outcome_letters(o) for o in read] == [[letter], []]

    store = InMemoryCheckpointStore()
    told: list[list[FeedLetter]] = []
    plan = plan_merge([Column("id", "bigint", False)], ["id"])
    batches = ConnectBatches(ConnectBatchJob("delta.`/r`", plan, APP, folder))
    rounds = RoundRows(store, sleep=lambda s: None)
    live = TableLive("t")
    writer = RowWriter("p", "src.sales.t", "dst.sales.t", store, clock=lambda: 2000.0)
    assert batches.files_through() == 4  # what the server applied, before the daemon reports it
    assert report_server_batches(batches, rounds, writer, live, 0, None, lambda found: told.append(list(found))) == 2
    assert told == [[letter]] and live.applied_through == 4
    assert rounds.flush(10)
    rounds.close()

    from lakemirror.supervisor.change_feed.dead_letters import FeedLetterDesk
    from lakemirror.sinks.merge.feed_letters import InMemoryFeedLetters

    desk = FeedLetterDesk(InMemoryFeedLetters(), lambda: {}, lambda: None)
    desk.recorded(told[0])
    desk.recorded(outcome_letters(read[0]))  # the same file reported again after a restart
    assert desk.pending() == {"src.sales.t": 1} and desk.recorded_counts() == {"src.sales.t": 1}
