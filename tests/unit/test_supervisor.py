"""lakemirror.supervisor.control.loop: the control loop, driven by fake runners and a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.sinks.merge.delta_merge import BatchStats, MergeOutcome
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.supervisor.change_feed.table_runner import BatchReport
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.lag import LagReading
from lakemirror.supervisor.control.loop import Supervisor, TableView

POLICY = sm.RestartPolicy(base_delay_seconds=10.0, max_delay_seconds=100.0, jitter=0.2)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """Implements the Runner protocol; the test scripts what poll() returns."""

    def __init__(self, name: str, paused: bool = False) -> None:
        self.name = name
        self.resyncs: list[str] = []
        self.applied_through: int | None = None
        self.last_batch_at: float | None = None
        self.last_lag: LagReading | None = None
        self.launches = 0
        self.halts: list[float] = []
        self.pending: list[Any] = []
        self.paused = paused
        self.lag_to_report: LagReading | None = None
        self.probes = 0
        self.exists = True

    def launch(self) -> None:
        self.launches += 1

    def halt(self, timeout: float = 60.0) -> None:
        self.halts.append(timeout)

    def poll(self) -> list[Any]:
        out, self.pending = self.pending, []
        return out

    def probe_lag(self, now: float) -> LagReading | None:
        self.probes += 1
        self.last_lag = self.lag_to_report
        return self.lag_to_report

    def pause_persisted(self, paused: bool) -> None:
        self.paused = paused

    def resync(self, reason: str) -> None:
        self.resyncs.append(reason)

    def persisted_pause(self) -> bool:
        return self.paused

    def source_exists(self) -> bool:
        return self.exists

    def batch(self, batch_id: int, rows: int, at: float) -> None:
        outcome = MergeOutcome(BatchStats(rows, 1, 1, None), ApplyCounts(inserted=rows), replayed=False)
        self.pending += [BatchReport(self.name, batch_id, outcome, 0.5, at), sm.BatchApplied()]
        self.applied_through, self.last_batch_at = batch_id, at


class RecordingObserver:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def state_changed(self, table: str, status: sm.TableStatus) -> None:
        self.calls.append(("state", table, status.state.value))

    def batch_applied(self, table: str, report: BatchReport) -> None:
        self.calls.append(("batch", table, report.batch_id))

    def lag_measured(self, table: str, reading: LagReading, held: Any = None, committed_at: Any = None) -> None:
        self.calls.append(("lag", table, reading.lag_seconds))

    def retry_scheduled(self, table: str, status: sm.TableStatus) -> None:
        self.calls.append(("retry", table, status.next_retry_at))

    def bootstrap_progressed(self, table: str, progress: Any) -> None:
        self.calls.append(("bootstrap", table, progress.chunks_done))


class World:
    def __init__(self, tables: list[str], paused: tuple[str, ...] = (), discover: float | None = None) -> None:
        self.clock = FakeClock()
        self.tables = list(tables)
        self.runners: dict[str, FakeRunner] = {}
        self.observer = RecordingObserver()
        self.paused = paused
        self.list_error: Exception | None = None
        self.sup = Supervisor(runner_factory=self.make, list_tables=self.list_tables, policy=POLICY,
                              observer=self.observer, clock=self.clock, rand=lambda: 0.0,
                              lag_interval_seconds=5.0, discover_interval_seconds=discover)

    def list_tables(self) -> list[str]:
        if self.list_error is not None:
            raise self.list_error
        return list(self.tables)

    def make(self, name: str) -> FakeRunner:
        self.runners[name] = FakeRunner(name, paused=name in self.paused)
        return self.runners[name]

    def state(self, name: str) -> str:
        return {v.table: v.state for v in self.sup.views()}[name]


def started(tables: list[str]) -> World:
    w = World(tables)
    w.sup.start()
    for r in w.runners.values():
        r.pending.append(sm.StreamStarted())
    w.sup.tick()
    return w


def test_start_launches_every_table() -> None:
    w = started(["a", "b"])
    assert {n: (r.launches, r.halts) for n, r in w.runners.items()} == {"a": (1, []), "b": (1, [])}
    assert [v.state for v in w.sup.views()] == ["running", "running"]


def test_failing_table_backs_off_while_the_other_keeps_running() -> None:
    w = started(["a", "b"])
    a, b = w.runners["a"], w.runners["b"]
    a.pending.append(sm.Failed("boom", code="transient", rand=0.0))
    b.batch(0, rows=3, at=w.clock.now)
    w.sup.tick()
    assert (w.state("a"), w.state("b")) == ("degraded", "running")
    assert a.halts == [60.0]
    view_a = {v.table: v for v in w.sup.views()}["a"]
    assert (view_a.failures, view_a.retries, view_a.next_retry_at, view_a.last_error) == (1, 1, 1010.0, "boom")
    assert view_a.retry_delay_seconds == 10.0
    assert ("retry", "a", 1010.0) in w.observer.calls

    w.clock.now = 1009.9
    b.batch(1, rows=2, at=w.clock.now)
    w.sup.tick()
    assert (w.state("a"), a.launches) == ("degraded", 1)
    assert {v.table: (v.batches, v.rows_applied) for v in w.sup.views()}["b"] == (2, 5)

    w.clock.now = 1010.0
    w.sup.tick()
    assert (w.state("a"), a.launches) == ("starting", 2)
    assert {v.table: v for v in w.sup.views()}["a"].retry_delay_seconds is None
    assert b.launches == 1 and b.halts == []
    assert [c for c in w.observer.calls if c[0] == "batch"] == [("batch", "b", 0), ("batch", "b", 1)]


def test_pause_and_resume_commands() -> None:
    w = started(["a", "b"])
    a = w.runners["a"]
    w.sup.pause("a")
    w.sup.pause("nope")  # unknown tables are ignored
    w.sup.tick()
    assert (w.state("a"), a.halts, a.paused) == ("paused", [60.0], True)
    w.clock.now += 1000
    w.sup.tick()
    assert (w.state("a"), a.launches) == ("paused", 1)
    w.sup.resume("a")
    w.sup.tick()
    assert (w.state("a"), a.launches, a.paused) == ("starting", 2, False)
    assert w.state("b") == "running" and w.runners["b"].halts == []


def test_command_queues_for_known_tables_and_refuses_unknown_ones() -> None:
    w = started(["a"])
    assert w.sup.command("pause", "nope") is False
    assert w.sup.command("pause", "a") is True
    w.sup.tick()
    assert w.state("a") == "paused"
    assert w.sup.command("resync", "a") is True
    w.sup.tick()
    assert w.runners["a"].resyncs
    with pytest.raises(ValueError):
        w.sup.command("drop", "a")


def test_a_resync_of_a_paused_table_starts_it_and_forgets_the_pause() -> None:
    w = started(["a"])
    w.sup.command("pause", "a")
    w.sup.tick()
    assert (w.state("a"), w.runners["a"].paused) == ("paused", True)
    w.sup.command("resync", "a")
    w.sup.tick()
    # a restarted daemon must not find the table paused again after the operator's resync started it
    assert (w.state("a"), w.runners["a"].paused, len(w.runners["a"].resyncs)) == ("starting", False, 1)


def _boot(done: int, total: int = 10) -> BootstrapProgress:
    return BootstrapProgress(version=7, chunks_total=total, chunks_done=done, rows_total=None, rows_copied=done * 10,
                             started_at=0.0, now=1.0)


def test_a_resync_drops_the_old_epochs_figures_and_error_at_once() -> None:
    """The new epoch's bootstrap shows no figures of the old one (it pins and plans before its own
    first report) and an operator's resync leaves no error of the old epoch behind."""
    w = started(["a"])
    r = w.runners["a"]
    r.pending.append(sm.Failed(error="boom"))
    w.sup.tick()
    r.pending += [sm.BootstrapStarted(), _boot(6)]
    w.sup.tick()
    view = w.sup.views()[0]
    assert (view.state, view.last_error, view.bootstrap["chunks_done"]) == ("bootstrapping", "boom", 6)  # type: ignore[index]
    w.sup.command("resync", "a")
    w.sup.tick()
    view = w.sup.views()[0]
    assert (view.state, view.last_error, view.bootstrap) == ("starting", None, None)
    # Figures the old bootstrap reported before it stopped are not shown for the new one either.
    r.pending += [_boot(7), sm.BootstrapStarted()]
    w.sup.tick()
    view = w.sup.views()[0]
    assert (view.state, view.bootstrap) == ("bootstrapping", None)
    r.pending.append(_boot(0, total=4))
    w.sup.tick()
    assert w.sup.views()[0].bootstrap["chunks_total"] == 4  # type: ignore[index]


def test_persisted_pause_keeps_a_table_paused_at_start() -> None:
    w = World(["a", "b"], paused=("a",))
    w.sup.start()
    w.sup.tick()
    assert (w.state("a"), w.runners["a"].launches) == ("paused", 0)
    assert (w.state("b"), w.runners["b"].launches) == ("starting", 1)


def test_discovery_adds_new_tables_on_its_interval() -> None:
    w = World(["a"], discover=30.0)
    w.sup.start()
    w.tables.append("b")
    w.clock.now += 29.0
    w.sup.tick()
    assert list(w.runners) == ["a"]
    w.clock.now += 1.0
    w.sup.tick()
    assert list(w.runners) == ["a", "b"]
    assert (w.state("b"), w.runners["b"].launches) == ("starting", 1)
    assert w.runners["a"].launches == 1


def test_no_discovery_without_an_interval() -> None:
    w = World(["a"])
    w.sup.start()
    w.tables.append("b")
    w.clock.now += 10_000
    w.sup.tick()
    assert list(w.runners) == ["a"]


def test_listing_failure_keeps_what_runs() -> None:
    w = World(["a"], discover=1.0)
    w.sup.start()
    w.list_error = OSError("catalog unreachable")
    w.clock.now += 5
    w.sup.tick()
    assert [(v.table, v.state) for v in w.sup.views()] == [("a", "starting")]
    w.list_error = None
    w.tables.append("b")
    w.clock.now += 1
    w.sup.tick()
    assert [v.table for v in w.sup.views()] == ["a", "b"]


def test_views_content_and_lag_probe() -> None:
    w = started(["b", "a"])
    a = w.runners["a"]
    a.lag_to_report = LagReading(12.5, 3, 40, 37)
    a.batch(4, rows=7, at=1000.0)
    w.sup.tick()  # same instant as the first lag probe: next probe is due 5s later
    w.clock.now += 5
    w.sup.tick()
    views = w.sup.views()
    assert [v.table for v in views] == ["a", "b"]
    assert views[0] == TableView(table="a", state="running", lag_seconds=12.5, versions_behind=3, applied_through=4,
                                 rows_applied=7, batches=1, failures=0, retries=0, next_retry_at=None,
                                 last_error=None, last_batch_at=1000.0)
    assert views[1].lag_seconds is None and views[1].batches == 0
    assert ("lag", "a", 12.5) in w.observer.calls


def test_lag_is_probed_once_per_interval_whatever_the_state_but_stopped() -> None:
    """A table restarting its stream (starting), retrying or failed still falls behind: its lag
    keeps counting."""
    w = World(["a"])
    w.sup.start()
    w.sup.tick()  # starting: probed too
    assert w.runners["a"].probes == 1
    w.runners["a"].pending.append(sm.StreamStarted())
    w.clock.now += 4.9
    w.sup.tick()
    assert w.runners["a"].probes == 1
    w.clock.now += 0.1
    w.runners["a"].pending.append(sm.Failed("restart for a new column", restart_now=True))
    w.sup.tick()
    assert (w.state("a"), w.runners["a"].probes) == ("starting", 2)
    w.sup.shutdown(1.0)
    w.clock.now += 5
    w.sup.tick()
    assert w.runners["a"].probes == 2


def test_shutdown_halts_every_runner() -> None:
    w = started(["a", "b", "c"])
    w.sup.pause("c")
    w.sup.tick()
    w.sup.shutdown(30.0)
    assert [v.state for v in w.sup.views()] == ["stopped", "stopped", "stopped"]
    assert [len(w.runners[n].halts) for n in "abc"] == [1, 1, 2]
    w.sup.tick()
    assert all(r.launches == 1 for r in w.runners.values())


def test_shutdown_honours_the_drain_timeout() -> None:
    w = started(["a", "b"])
    w.sup.shutdown(10.0)
    assert all(t <= 10.0 for r in w.runners.values() for t in r.halts)


def test_a_missing_table_stays_failed_without_retries_and_discovery_starts_it_once_it_exists() -> None:
    from lakemirror.sources.catalog import TableMissing
    from lakemirror.supervisor.control.failure_policy import failed_event

    w = World(["a"], discover=30.0)
    w.sup.start()
    a = w.runners["a"]
    a.exists = False
    a.pending.append(failed_event(TableMissing("table c.s.a does not exist (no Delta table at /x)", table="c.s.a"),
                                  table="a", allow_schema_evolution=True, change_window_policy="fail", rand=0.0))
    w.sup.tick()
    view = {v.table: v for v in w.sup.views()}["a"]
    assert (view.state, view.next_retry_at, view.retries) == ("failed", None, 0)
    assert "Create the table, or remove 'a' from `tables:`" in (view.last_error or "")
    for _ in range(3):  # no retries while it is missing, however long it takes
        w.clock.now += 1000
        w.sup.tick()
    assert (w.state("a"), a.launches) == ("failed", 1)
    a.exists = True
    w.clock.now += 30
    w.sup.tick()
    assert (w.state("a"), a.launches) == ("starting", 2)


def test_tables_known_from_the_records_are_listed_at_once_with_their_applied_version_and_lag() -> None:
    """Runners need Spark (a minute to start); the records need none, and are shown meanwhile."""
    from lakemirror.supervisor.offline.recorded_tables import RecordedTable

    clock = FakeClock(1000.0)
    recorded = {"a": RecordedTable("a", applied_through=187, latest_version=190, oldest_unapplied_at=850.0,
                                   batches=5, rows_applied=40),
                "b": RecordedTable("b", applied_through=8, latest_version=8, oldest_unapplied_at=None, batches=2)}
    observer = RecordingObserver()
    seen_while_starting: list[list[TableView]] = []
    runners: dict[str, FakeRunner] = {}

    def make(name: str) -> FakeRunner:
        seen_while_starting.append(sup.views())  # what /status shows while the JVM starts
        runners[name] = FakeRunner(name)
        return runners[name]

    sup = Supervisor(runner_factory=make, list_tables=lambda: ["a", "b"], policy=POLICY, observer=observer,
                     clock=clock, lag_interval_seconds=5.0, recorded=lambda: recorded)
    sup.start()
    first = {v.table: v for v in seen_while_starting[0]}
    assert {n: (v.state, v.applied_through, v.versions_behind, v.lag_seconds, v.batches) for n, v in first.items()} \
        == {"a": ("starting", 187, 3, 150.0, 5), "b": ("starting", 8, 0, 0.0, 2)}
    assert ("state", "a", "starting") in observer.calls and ("lag", "a", 150.0) in observer.calls
    # Once the runners exist, and until they measure anything, the records still answer; lag keeps counting.
    clock.now += 10
    sup.tick()
    views = {v.table: v for v in sup.views()}
    assert (views["a"].applied_through, views["a"].lag_seconds, views["a"].batches) == (187, 160.0, 5)
    assert ("lag", "a", 160.0) in observer.calls


def test_the_batch_count_counts_batches_with_a_checkpoint_row() -> None:
    """A replay the replica skipped whole was counted when first applied; an empty batch writes no
    checkpoint row; a replay that applied rows (an event source's replicas that had not committed
    before a crash) did work, and counts as the metrics count it."""
    w = started(["a"])
    a = w.runners["a"]
    a.batch(0, rows=3, at=w.clock.now)
    empty = MergeOutcome(BatchStats(0, None, None, None), ApplyCounts(), replayed=False)
    skipped = MergeOutcome(BatchStats(2, 1, 1, None), ApplyCounts(), replayed=True)
    partly = MergeOutcome(BatchStats(2683, 2, 2, None), ApplyCounts(inserted=2000, updated=506), replayed=True)
    a.pending += [BatchReport("a", 1, empty, 0.1, w.clock.now), BatchReport("a", 2, skipped, 0.1, w.clock.now),
                  BatchReport("a", 3, partly, 0.1, w.clock.now)]
    w.sup.tick()
    view = {v.table: v for v in w.sup.views()}["a"]
    assert (view.batches, view.rows_applied) == (2, 3 + 2506)


@pytest.mark.parametrize("verb", ["pause", "resume", "resync"])
def test_a_command_accepted_just_before_the_shutdown_is_recorded_for_the_next_start(verb: str) -> None:
    """A resume accepted 0.2 s before SIGTERM used to be lost with the queue (the table stayed
    paused): the drain records what is still queued once the tables have stopped, starting nothing."""
    w = World(["a", "b"], paused=("a",) if verb != "pause" else ())
    w.sup.start()
    w.sup.tick()
    a = w.runners["a"]
    launches = a.launches
    assert w.sup.command(verb, "a") is True  # accepted (202) ...
    w.sup.shutdown(30.0)  # ... and the drain begins before the next tick
    assert a.paused is (verb == "pause")
    assert len(a.resyncs) == (1 if verb == "resync" else 0)
    assert a.launches == launches, "nothing is started during the drain"
    assert w.state("a") == "stopped" and w.runners["b"].paused is False


def test_commands_are_refused_once_the_shutdown_has_begun() -> None:
    from lakemirror.supervisor.control.loop import Draining

    w = started(["a"])
    w.sup.shutdown(30.0)
    for verb in ("pause", "resume", "resync"):
        with pytest.raises(Draining, match="shutting down"):
            w.sup.command(verb, "a")
    with pytest.raises(Draining):
        w.sup.pause("a")
    assert w.sup.command("pause", "nope") is False  # an unknown table is still a 404, not a 503
    assert w.runners["a"].paused is False


def test_a_replay_of_a_batch_whose_checkpoint_row_was_read_at_start_is_not_counted_twice() -> None:
    """Killed after the checkpoint row, before Spark's commit: the row (batch 7) is in the counts the
    table starts with; its replay reports the batch's counts again and adds nothing. Killed between
    the replica's commit and the row (batch 8): the replay writes the row, and counts."""
    from lakemirror.supervisor.offline.recorded_tables import RecordedTable

    clock = FakeClock(1000.0)
    runners: dict[str, FakeRunner] = {}

    def make(name: str) -> FakeRunner:
        runners[name] = FakeRunner(name)
        return runners[name]

    recorded = {"a": RecordedTable("a", 10, 10, None, batches=8, rows_applied=80, counted_through=7)}
    sup = Supervisor(runner_factory=make, list_tables=lambda: ["a"], policy=POLICY, clock=clock,
                     recorded=lambda: recorded)
    sup.start()
    again = MergeOutcome(BatchStats(10, 10, 10, None), ApplyCounts(inserted=10), replayed=True)
    runners["a"].pending += [BatchReport("a", 7, again, 0.1, clock.now), BatchReport("a", 8, again, 0.1, clock.now)]
    sup.tick()
    view = {v.table: v for v in sup.views()}["a"]
    assert (view.batches, view.rows_applied) == (9, 90)


def test_while_a_table_starts_its_source_position_is_read_again_and_lag_never_freezes() -> None:
    """No runner reading yet (the JVM starts, a bootstrap runs): versions behind follow the source,
    lag counts from the oldest unapplied commit, never from the process start."""
    from dataclasses import replace

    from lakemirror.supervisor.offline.recorded_tables import RecordedTable

    clock = FakeClock(1000.0)
    source = {"latest": 190, "oldest": 850.0}
    reads: list[str] = []

    def refresh(known: RecordedTable) -> RecordedTable:
        reads.append(known.table)
        return replace(known, latest_version=source["latest"], oldest_unapplied_at=source["oldest"])

    recorded = {"a": RecordedTable("a", applied_through=187, latest_version=188, oldest_unapplied_at=850.0),
                "new": RecordedTable("new", None, None, None, started=False)}
    sup = Supervisor(runner_factory=FakeRunner, list_tables=lambda: ["a"], policy=POLICY, clock=clock,
                     lag_interval_seconds=2.0, recorded=lambda: recorded, refresh_recorded=refresh)
    sup.start()
    views = {v.table: v for v in sup.views()}
    assert (views["a"].versions_behind, views["a"].lag_seconds) == (3, 150.0)
    assert (views["new"].state, views["new"].versions_behind) == ("starting", None), "listed from the first second"
    source["latest"] = 200
    clock.now += 1  # within the interval: not read again
    assert {v.table: v.versions_behind for v in sup.views()}["a"] == 3
    clock.now += 1
    views = {v.table: v for v in sup.views()}
    assert (views["a"].versions_behind, views["a"].lag_seconds) == (13, 152.0)
    assert reads.count("a") == 2
    # The runner learns from the replica's own record that more is applied: priced from there at once.
    sup._tables["a"].runner.applied_through = 195  # type: ignore[misc]  # noqa: SLF001
    source["oldest"] = 990.0
    views = {v.table: v for v in sup.views()}
    assert (views["a"].applied_through, views["a"].versions_behind, views["a"].lag_seconds) == (195, 5, 12.0)


def test_a_reading_that_is_not_renewed_keeps_counting_lag() -> None:
    w = started(["a"])
    a = w.runners["a"]
    w.clock.now += 5
    a.lag_to_report = LagReading(20.0, 3, 13, 10, oldest_unapplied_at=w.clock.now - 20.0)
    w.sup.tick()
    assert a.probes == 2
    w.clock.now += 30  # no tick, no new reading: a probe that stalls
    assert {v.table: v.lag_seconds for v in w.sup.views()}["a"] == 50.0


def test_a_table_listed_from_the_records_takes_commands_while_its_runner_is_being_made() -> None:
    """/status lists the configured tables while the JVM starts; pause must not answer 'no such table'."""
    from lakemirror.supervisor.offline.recorded_tables import RecordedTable

    runners: dict[str, FakeRunner] = {}
    answers: list[bool] = []

    def make(name: str) -> FakeRunner:
        answers.append(sup.command("pause", name))  # an HTTP thread, while the JVM starts
        runners[name] = FakeRunner(name)
        return runners[name]

    sup = Supervisor(runner_factory=make, list_tables=lambda: ["a"], policy=POLICY, clock=FakeClock(),
                     recorded=lambda: {"a": RecordedTable("a", None, None, None, started=False)})
    sup.start()
    assert answers == [True]
    sup.tick()
    assert runners["a"].paused and {v.table: v.state for v in sup.views()}["a"] == "paused"
