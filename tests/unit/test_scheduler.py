"""The pure scheduler of the daemon's sub-tasks: next run times, no overlap, missed runs collapse."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from lakemirror.supervisor.subtasks.scheduler import DailyAt, Every, Scheduler, TaskPolicy

T0 = 1_000_000.0


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def test_an_interval_task_first_runs_one_interval_after_start_then_on_its_grid() -> None:
    s = Scheduler([TaskPolicy("rec", Every(60))], start=T0)
    assert s.views()[0].next_run_at == T0 + 60
    assert s.due(T0 + 59.9) == []
    assert [p.name for p in s.due(T0 + 60.5)] == ["rec"]
    assert s.views()[0].running and s.views()[0].next_run_at == T0 + 120
    s.finished("rec", T0 + 70, ok=True)
    view = s.views()[0]
    assert (view.running, view.last_outcome, view.last_success_at, view.runs) == (False, "success", T0 + 70, 1)
    assert s.due(T0 + 119) == [] and [p.name for p in s.due(T0 + 120)] == ["rec"]


def test_a_running_task_is_never_started_again() -> None:
    s = Scheduler([TaskPolicy("slow", Every(10))], start=T0)
    assert len(s.due(T0 + 10)) == 1
    for t in range(11, 100):
        assert s.due(T0 + t) == [], "a task overlapped itself"


def test_missed_runs_run_once_not_n_times() -> None:
    s = Scheduler([TaskPolicy("slow", Every(10))], start=T0)
    s.due(T0 + 10)
    s.finished("slow", T0 + 95, ok=False, error="boom")      # 8 run times passed meanwhile
    assert [p.name for p in s.due(T0 + 95)] == ["slow"]       # one catch-up run ...
    assert s.views()[0].next_run_at == T0 + 100              # ... and back on the grid
    s.finished("slow", T0 + 96, ok=True)
    assert s.due(T0 + 99) == []
    # a daemon that was stalled long (e.g. suspended) also runs once
    s2 = Scheduler([TaskPolicy("x", Every(10))], start=T0)
    assert len(s2.due(T0 + 10_000.5)) == 1
    assert s2.views()[0].next_run_at == T0 + 10_010


def test_failures_are_recorded_and_a_success_clears_the_error() -> None:
    s = Scheduler([TaskPolicy("t", Every(5))], start=T0)
    s.due(T0 + 5)
    s.finished("t", T0 + 6, ok=False, error="no key")
    v = s.views()[0]
    assert (v.last_outcome, v.last_error, v.last_success_at) == ("failed", "no key", None)
    s.due(T0 + 10)
    s.finished("t", T0 + 11, ok=True)
    v = s.views()[0]
    assert (v.last_outcome, v.last_error, v.last_success_at, v.runs) == ("success", None, T0 + 11, 2)


def test_daily_runs_at_the_given_utc_time() -> None:
    start = utc("2026-03-01T10:00:00")
    s = Scheduler([TaskPolicy("nightly", DailyAt(2, 30)), TaskPolicy("late", DailyAt(23, 0))], start=start)
    by_name = {v.task: v for v in s.views()}
    assert by_name["nightly"].next_run_at == utc("2026-03-02T02:30:00")
    assert by_name["late"].next_run_at == utc("2026-03-01T23:00:00")
    assert by_name["nightly"].schedule == "daily at 02:30 UTC"
    assert s.next_wakeup() == utc("2026-03-01T23:00:00")
    assert [p.name for p in s.due(utc("2026-03-03T05:00:00"))] == ["late", "nightly"]  # both missed: once each
    assert {v.task: v.next_run_at for v in s.views()} == {"late": utc("2026-03-03T23:00:00"),
                                                         "nightly": utc("2026-03-04T02:30:00")}
    assert s.next_wakeup() is None  # both running


def test_due_exactly_at_the_time_and_the_next_one_is_a_day_later() -> None:
    at = utc("2026-03-02T02:30:00")
    s = Scheduler([TaskPolicy("n", DailyAt(2, 30))], start=at - 1)
    assert len(s.due(at)) == 1
    assert s.views()[0].next_run_at == at + 86400


@pytest.mark.parametrize("text", ["2:30", "24:00", "12:60", "1230", "", "aa:bb", "12:30:00"])
def test_bad_daily_times_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        DailyAt.parse(text)


def test_good_daily_times_parse_and_bad_intervals_are_refused() -> None:
    assert DailyAt.parse("00:00") == DailyAt(0, 0) and DailyAt.parse(" 23:59 ") == DailyAt(23, 59)
    with pytest.raises(ValueError):
        Every(0)
