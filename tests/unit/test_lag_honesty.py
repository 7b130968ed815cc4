"""lakemirror_lag_seconds tells the truth between two readings of the source, on every path.

Each test fails for one cause of the disagreement ``make bench ONLY=production`` showed between the
daemon's lag and the outside measure (daemon higher at 16 tables, lower over Spark Connect):

- the gauge held the value of the last probe: between probes (a round of many tables' probes, or a
  supervisor tick held up by Spark calls, as over Connect) the oldest unapplied commit kept ageing
  while the gauge stood still;
- a batch applied after a probe left the gauge (and ``status``) pricing lag from a commit the
  replica already held, until the next probe round;
- every table of a probe round was priced at the round's start, seconds before its own reading;
- a batch counted only at the supervisor's next tick (and, on the driver path, only once its
  checkpoint row was written after the replica's commit): the daemon read higher than outside by
  about that much on every object-store row; an event source's reading, which a batch cannot
  reprice, kept counting from a message the replicas held until the next probe round.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from lakemirror.daemon.metrics import Metrics
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.lag import LagReading, compute_lag
from lakemirror.supervisor.control.loop import Supervisor
from tests.unit.test_supervisor import POLICY, FakeClock, FakeRunner, RecordingObserver


def scraped_gauge(metrics: Metrics, name: str, table: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(name + "{") and f'table="{table}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {table}")


def scraped_lag(metrics: Metrics, table: str) -> float:
    return scraped_gauge(metrics, "lakemirror_lag_seconds", table)


class World:
    def __init__(self, *tables: str, lag_interval: float = 2.0) -> None:
        self.clock = FakeClock()
        self.runners: dict[str, FakeRunner] = {}
        self.metrics = Metrics("p", CollectorRegistry(), clock=self.clock)
        self.sup = Supervisor(runner_factory=self.make, list_tables=lambda: list(tables), policy=POLICY,
                              observer=self.metrics, clock=self.clock, rand=lambda: 0.0,
                              lag_interval_seconds=lag_interval)
        self.sup.start()
        for r in self.runners.values():
            r.pending.append(sm.StreamStarted())

    def make(self, name: str) -> FakeRunner:
        self.runners[name] = FakeRunner(name)
        return self.runners[name]


def behind(applied: int, commits: dict[int, float], now: float) -> LagReading:
    return compute_lag(applied_through=applied, latest_version=max(commits), commit_times=commits, now=now)


def test_the_scraped_lag_keeps_ageing_between_probes() -> None:
    w = World("a", lag_interval=2.0)
    t0 = w.clock.now
    a = w.runners["a"]
    a.applied_through = 10
    a.lag_to_report = behind(10, {11: t0 - 5.0, 12: t0 - 1.0}, t0)
    w.sup.tick()
    assert scraped_lag(w.metrics, "a") == 5.0
    # No probe for 25 s (a slow round of probes, or a tick held up by Spark calls over Connect):
    # the commit of version 11 is 30 s old, and a scrape says so.
    w.clock.now += 25.0
    assert scraped_lag(w.metrics, "a") == 30.0


def test_a_batch_applied_after_the_probe_lowers_the_lag_at_the_next_tick() -> None:
    w = World("a", lag_interval=60.0)
    t0 = w.clock.now
    a = w.runners["a"]
    a.applied_through = 10
    a.lag_to_report = behind(10, {11: t0 - 40.0, 12: t0 - 20.0, 13: t0 - 2.0}, t0)
    w.sup.tick()
    assert scraped_lag(w.metrics, "a") == 40.0
    # A batch applies 11 and 12 one second later; the next probe is a minute away.
    w.clock.now += 1.0
    a.applied_through = 12
    w.sup.tick()
    assert a.probes == 1
    assert scraped_lag(w.metrics, "a") == 3.0  # from version 13's commit, 2 s before the probe
    view = {v.table: v for v in w.sup.views()}["a"]
    assert (view.lag_seconds, view.versions_behind) == (3.0, 1)
    # Then everything the probe saw is applied: 0, not a lag counted from a commit the replica holds.
    w.clock.now += 1.0
    a.applied_through = 13
    w.sup.tick()
    assert scraped_lag(w.metrics, "a") == 0.0
    assert {v.table: v.lag_seconds for v in w.sup.views()}["a"] == 0.0


def test_a_batch_counts_at_the_next_scrape_without_waiting_for_a_tick() -> None:
    w = World("a", lag_interval=60.0)
    t0 = w.clock.now
    a = w.runners["a"]
    a.applied_through = 10
    a.lag_to_report = behind(10, {11: t0 - 4.0, 12: t0 - 3.0, 13: t0 - 1.0}, t0)
    w.sup.tick()
    assert scraped_lag(w.metrics, "a") == 4.0
    w.clock.now += 0.3
    a.applied_through = 12  # a batch lands; no tick runs before the scrape
    assert scraped_lag(w.metrics, "a") == pytest.approx(1.3)
    assert scraped_gauge(w.metrics, "lakemirror_versions_behind", "a") == 1.0
    assert scraped_gauge(w.metrics, "lakemirror_last_applied_version", "a") == 12.0
    a.applied_through = 13
    assert scraped_lag(w.metrics, "a") == 0.0
    assert scraped_gauge(w.metrics, "lakemirror_versions_behind", "a") == 0.0


def test_each_table_is_priced_at_its_own_probe() -> None:
    """Probes of a round run one after the other; a slow read of one table's head must not price the
    next table at the round's start."""
    w = World("a", "b", lag_interval=2.0)
    seen: dict[str, float] = {}

    def slow_probe(runner: FakeRunner) -> Any:
        def probe(now: float) -> LagReading:
            seen[runner.name] = now
            w.clock.now += 4.0  # this table's head takes 4 s to read
            runner.probes += 1
            runner.last_lag = LagReading(0.0, 0, 5, 5)
            return runner.last_lag
        return probe

    for r in w.runners.values():
        r.applied_through = 5
        r.probe_lag = slow_probe(r)  # type: ignore[method-assign]
    start = w.clock.now
    w.sup.tick()
    assert seen == {"a": start, "b": start + 4.0}


def test_an_event_source_reading_is_not_repriced_by_batch_ids() -> None:
    """An event source's runner counts batches, not offsets: its reading only ages."""
    from lakemirror.supervisor.events.stream_runner import EventLagReading

    reading = EventLagReading(10.0, 5, 100, 95, oldest_unapplied_at=990.0)
    assert reading.repriced(1_000, 1_000.0) == EventLagReading(10.0, 5, 100, 95, oldest_unapplied_at=990.0)
    observer = RecordingObserver()
    clock = FakeClock()
    runner = FakeRunner("e")
    sup = Supervisor(runner_factory=lambda name: runner, list_tables=lambda: ["e"], policy=POLICY,
                     observer=observer, clock=clock, lag_interval_seconds=60.0)
    sup.start()
    runner.applied_through, runner.lag_to_report = 3, reading
    sup.tick()
    runner.applied_through = 4_000
    clock.now += 1
    sup.tick()
    assert [c for c in observer.calls if c[0] == "lag"] == [("lag", "e", 10.0)]


def test_an_event_source_is_probed_again_as_soon_as_a_batch_lands() -> None:
    """Its reading cannot be repriced by the batch; without a new reading the lag would keep counting
    from a message the replicas now hold until the next probe round."""
    from lakemirror.supervisor.events.stream_runner import EventLagReading

    w = World("e", lag_interval=60.0)
    e = w.runners["e"]
    e.applied_through, e.lag_to_report = 3, EventLagReading(10.0, 5, 100, 95, oldest_unapplied_at=w.clock.now - 10.0)
    w.sup.tick()
    assert e.probes == 1 and scraped_lag(w.metrics, "e") == 10.0
    w.clock.now += 1.0
    e.lag_to_report = EventLagReading(0.0, 0, 100, 100)
    w.sup.tick()
    assert e.probes == 1, "no batch: no probe before the round"
    e.batch(4, rows=5, at=w.clock.now)
    w.sup.tick()
    assert e.probes == 2 and scraped_lag(w.metrics, "e") == 0.0
    # A change feed's reading is repriced by the batch instead: no probe.
    w2 = World("a", lag_interval=60.0)
    a = w2.runners["a"]
    a.applied_through, a.lag_to_report = 10, behind(10, {11: w2.clock.now - 3.0}, w2.clock.now)
    w2.sup.tick()
    a.batch(11, rows=1, at=w2.clock.now)
    w2.sup.tick()
    assert a.probes == 1 and scraped_lag(w2.metrics, "a") == 0.0


def test_a_commit_made_after_a_caught_up_reading_counts_at_the_next_scrape() -> None:
    """With batches faster than the probe interval, a commit made after one probe is applied before
    the next: the gauge and the status read 0 the whole time unless the next version is looked for
    when asked (``committed_at``), and then count from its commit."""
    w = World("a", lag_interval=60.0)
    t0 = w.clock.now
    a = w.runners["a"]
    a.applied_through = 12
    a.lag_to_report = behind(12, {12: t0 - 9.0}, t0)  # caught up
    committed: dict[int, float] = {}
    asked: list[int] = []

    def committed_at(version: int) -> float | None:
        asked.append(version)
        return committed.get(version)

    a.committed_at = committed_at  # type: ignore[attr-defined]
    w.sup.tick()
    assert scraped_lag(w.metrics, "a") == 0.0 and asked[-1] == 13
    committed[13] = t0 + 1.0  # the source commits version 13; the next probe is a minute away
    w.clock.now = t0 + 1.4
    assert scraped_lag(w.metrics, "a") == pytest.approx(0.4)
    assert scraped_gauge(w.metrics, "lakemirror_versions_behind", "a") == 1.0
    view = {v.table: v for v in w.sup.views()}["a"]
    assert view.lag_seconds == pytest.approx(0.4) and view.versions_behind == 1
    a.applied_through = 13  # applied: 0 again, and version 14 is what is looked for
    assert scraped_lag(w.metrics, "a") == 0.0 and asked[-1] == 14


def test_a_reading_that_knows_of_unapplied_commits_looks_for_no_other() -> None:
    w = World("a", lag_interval=60.0)
    t0 = w.clock.now
    a = w.runners["a"]
    a.applied_through = 10
    a.lag_to_report = behind(10, {11: t0 - 2.0}, t0)
    asked: list[int] = []
    a.committed_at = lambda version: asked.append(version) or None  # type: ignore[attr-defined]
    w.sup.tick()
    assert scraped_lag(w.metrics, "a") == 2.0 and asked == []
