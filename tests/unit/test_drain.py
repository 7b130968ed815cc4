"""The daemon's drain is bounded for real: whatever a Spark call does (a query's stop() that never
returns, a control loop tick stuck on a Spark Connect server that is gone), ``DaemonContext.run``
returns within ``drain_timeout_seconds``, releases the lease, removes ``daemon.json`` and says in
one line which tables did not finish. Real daemon parts (context, supervisor, table runner, lease
on a real folder, HTTP server); only the Spark session and its query are stand-ins."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry

from lakemirror.checkpoints.lease_store import FileLeaseStore
from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.drain import DrainOutcome, ExitGuard, end_process
from lakemirror.daemon.exit_codes import EXIT_DRAIN_INCOMPLETE
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.pipelines import PipelineHandle, PipelineRegistry
from lakemirror.daemon.settings import load_settings
from lakemirror.supervisor.change_feed.table_runner import TableRunner
from lakemirror.supervisor.control.loop import Supervisor
from tests.unit.runner_fakes import table_runner

DRAIN = 1.0
#: How long a test waits for a drain bounded at DRAIN seconds before calling it a hang.
HANG = DRAIN + 20.0

_NEVER = threading.Event()  # what a call to a server that is gone waits for: set once the test is over


@pytest.fixture(autouse=True)
def _the_server_comes_back_after_the_test() -> Iterator[None]:
    """Calls abandoned by a test end after it: a launch hung in a ``cached_property`` of its runner
    holds that property's lock, which Python 3.11 shares between all instances of the class."""
    global _NEVER
    _NEVER = threading.Event()
    yield
    _NEVER.set()


class GoneSession:
    """Stands in for a Spark session whose Spark Connect server went away: with ``hang``, asking
    it for a session of its own never returns (the client retries); without, the runner's launch
    finds nothing it can use and fails."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    def newSession(self) -> "GoneSession":
        if self.hang:
            _NEVER.wait()
        return self


class GoneQuery:
    """A streaming query of that server: stop() never returns; with ``hang``, neither does isActive."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.asked = threading.Event()      # a tick asked whether it is active
        self.stop_called = threading.Event()
        self.lastProgress = None

    @property
    def isActive(self) -> bool:
        self.asked.set()
        if self.hang:
            _NEVER.wait()
        return True

    def stop(self) -> None:
        self.stop_called.set()
        _NEVER.wait()


def settings(tmp_path: Path) -> Any:
    return load_settings(None, {
        "pipeline_id": "orders", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
        "tables": ["t"], "checkpoint_volume": str(tmp_path / "ck"), "runtime": {"warehouse": str(tmp_path / "wh")},
        "http": {"port": 0}, "drain_timeout_seconds": DRAIN})


def daemon(tmp_path: Path, query: GoneQuery, hang: bool) -> tuple[DaemonContext, list[TableRunner]]:
    runners: list[TableRunner] = []

    def runner(table: str) -> TableRunner:
        r = table_runner(table, apply_workers=0)  # an always-on query, as the supervisor below runs them
        r.ctx.spark = GoneSession(hang)  # type: ignore[assignment]
        r.live.query = query  # type: ignore[assignment]  # the table's stream, up when its server went away
        runners.append(r)
        return r

    supervisor = Supervisor(runner_factory=runner, list_tables=lambda: ["t"])
    app = DaemonContext(settings(tmp_path)).replace(
        mode_check=lambda runtime: None, checkpoints=InMemoryCheckpointStore(),
        metrics=Metrics("t", CollectorRegistry()), supervisor=supervisor)
    return app, runners


def run_bounded(app: DaemonContext, stop: threading.Event) -> tuple[DrainOutcome | None, float]:
    """Run the daemon on a thread; fail if it has not returned HANG seconds after the stop."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["outcome"] = app.run(stop)
        except BaseException as exc:  # noqa: BLE001 (the test reads it)
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert stop.wait(HANG), "the test never asked for the stop"
    asked = time.monotonic()
    thread.join(HANG)
    assert not thread.is_alive(), "the drain hung: run() did not return"
    assert "error" not in result, result.get("error")
    return result["outcome"], time.monotonic() - asked


def lease_released(app: DaemonContext) -> bool:
    newest = FileLeaseStore(app.pipeline_dir / "lease").newest()
    return newest is not None and newest.record is not None and newest.record.released


def test_a_query_whose_stop_never_returns_is_abandoned_at_the_deadline_and_the_lease_released(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM at once after the start, the table's query cannot be stopped: the drain returns at
    its deadline, names the table and what it waited for, releases the lease, removes daemon.json."""
    query = GoneQuery()
    app, runners = daemon(tmp_path, query, hang=False)
    stop = threading.Event()
    stop.set()
    with caplog.at_level(logging.INFO, logger="lakemirror.daemon.context"):
        outcome, _ = run_bounded(app, stop)
    assert query.stop_called.is_set()
    assert outcome is not None and not outcome.complete
    assert dict(outcome.tables) == {"orders": ["t (stopping its query)"]}
    assert lease_released(app)
    assert not (app.pipeline_dir / "daemon.json").exists()
    [line] = [r.getMessage() for r in caplog.records if "drain incomplete" in r.getMessage()]
    assert "pipeline orders: t (stopping its query)" in line and "drain_timeout_seconds (1s)" in line
    assert "replayed at the next start" in line and "\n" not in line
    assert runners[0].live.query is None and runners[0].live.draining


def test_a_tick_stuck_on_a_server_that_is_gone_does_not_hold_the_drain(tmp_path: Path) -> None:
    """Every call to the server hangs: the table's launch, and the control loop's tick asking
    whether its query is active. The stop is still seen at once and the drain still ends at its
    deadline, naming the table whose stop could not even begin."""
    query = GoneQuery(hang=True)
    app, _ = daemon(tmp_path, query, hang=True)
    stop = threading.Event()
    threading.Thread(target=lambda: query.asked.wait(HANG) and stop.set(), daemon=True).start()
    outcome, _ = run_bounded(app, stop)
    assert outcome is not None
    assert dict(outcome.tables) == {"orders": ["t (its stop did not begin)"]}
    assert lease_released(app)
    assert not (app.pipeline_dir / "daemon.json").exists()


def test_the_drain_says_in_one_line_what_it_finished_or_abandoned() -> None:
    done = DrainOutcome(120.0, 0.4)
    assert done.complete and done.line() == "drained in 0.4s"
    cut = DrainOutcome(10.0, 10.5, {"orders": ["t (stopping its query)"], "api": ["u"]}, ["nightly"])
    assert not cut.complete
    assert cut.line() == (
        "drain incomplete: not finished within drain_timeout_seconds (10s) and abandoned: pipeline orders: "
        "t (stopping its query); pipeline api: u; sub-task nightly. Nothing is lost: each table's unfinished "
        "batch is replayed at the next start and applied once; a sub-task's next run does its work again")
    replay = DrainOutcome(10.0, 10.5, others=["the change feed's dead-letter replay"])
    assert not replay.complete and replay.line().endswith(
        "abandoned: the change feed's dead-letter replay. Nothing is lost: a dead-letter replay cut short leaves "
        "its letters pending, to replay again")


def test_a_close_that_does_not_return_is_named_and_does_not_hold_the_drain() -> None:
    from lakemirror.daemon.drain import drain
    from lakemirror.supervisor.subtasks.service import SubtaskService

    outcome = drain(PipelineRegistry(), SubtaskService([], jobs=lambda t: [], run=lambda r, j: None),  # type: ignore[arg-type, return-value]
                    0.2, {"the change feed's dead-letter replay": _NEVER.wait, "quick": lambda: None})
    assert list(outcome.others) == ["the change feed's dead-letter replay"] and dict(outcome.tables) == {}


def test_a_pipeline_whose_tick_holds_its_lock_is_reported_whole_and_its_lease_given_back(tmp_path: Path) -> None:
    """A pipeline whose stop cannot begin (its lock held by a stuck tick) does not hold the others:
    they drain, it is reported with all its tables, and its on_stopped (an API pipeline's lease
    release) is called all the same."""
    stuck = Supervisor(runner_factory=lambda t: table_runner(t), list_tables=lambda: ["a", "b"])
    stuck.start()
    released = threading.Event()
    registry = PipelineRegistry()
    held = PipelineHandle(settings(tmp_path / "one"), stuck, "api", on_stopped=released.set)
    fine = PipelineHandle(settings(tmp_path / "two").model_copy(update={"pipeline_id": "fine"}),
                          Supervisor(runner_factory=lambda t: table_runner(t), list_tables=lambda: []), "config")
    registry.add(held)
    registry.add(fine)
    held.lock.acquire()  # the tick, stuck in a call that does not return
    try:
        late = registry.shutdown_all(0.5)
    finally:
        held.lock.release()
    assert late == {"orders": ["a (its stop did not begin)", "b (its stop did not begin)"]}
    assert released.is_set() and fine.state == "stopped"


def test_the_exit_guard_ends_the_process_once_the_stop_has_outlasted_its_bound() -> None:
    stopping, exits, abandoned = threading.Event(), [], threading.Event()

    def abandon() -> int:
        abandoned.set()
        return EXIT_DRAIN_INCOMPLETE

    guard = ExitGuard(stopping.is_set, 0.2, abandon, exit=exits.append).start()
    assert not abandoned.wait(0.5), "no stop asked for: the guard waits"
    stopping.set()
    assert abandoned.wait(HANG)
    deadline = time.monotonic() + HANG
    while not exits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exits == [EXIT_DRAIN_INCOMPLETE]
    guard.disarm()


def test_a_disarmed_guard_never_fires() -> None:
    exits: list[int] = []
    guard = ExitGuard(lambda: True, 0.3, lambda: 99, exit=exits.append).start()
    guard.disarm()
    guard._thread.join(HANG)  # noqa: SLF001
    assert not guard._thread.is_alive() and exits == []  # noqa: SLF001


def test_end_process_flushes_what_was_written_before_it_exits(capsys: pytest.CaptureFixture[str]) -> None:
    exits: list[int] = []
    print("last words", end="")
    end_process(EXIT_DRAIN_INCOMPLETE, exit=exits.append)
    assert exits == [EXIT_DRAIN_INCOMPLETE] and capsys.readouterr().out == "last words"


def test_end_process_waits_for_no_exit_hook_nor_thread_of_another_library() -> None:
    """Spark Connect's client retries requests at exit for minutes when its server is gone: the
    process ends without running exit hooks or joining threads."""
    import subprocess
    import sys

    probe = ("import atexit, threading\n"
             "forever = threading.Event()\n"
             "atexit.register(forever.wait)\n"
             "threading.Thread(target=forever.wait).start()\n"
             "from lakemirror.daemon.drain import end_process\n"
             "print('bye', end='')\n"
             "end_process(124)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=HANG, check=False)
    assert (done.returncode, done.stdout) == (124, "bye")
