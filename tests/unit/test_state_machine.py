"""lakemirror.supervisor.control.table_state: the pure per-table state machine and its restart policy."""

from __future__ import annotations

import pytest

from lakemirror.supervisor.control.table_state import (
    MAX_QUICK_RESTARTS, Action, BatchApplied, BootstrapStarted, Failed, Launch, Pause, RestartPolicy, Resume,
    Stop, StreamStarted, TableState, TableStatus, Tick, step,
)

POLICY = RestartPolicy(base_delay_seconds=2.0, max_delay_seconds=60.0, multiplier=2.0, jitter=0.2)
S = TableState


def at(state: TableState, **kw: object) -> TableStatus:
    return TableStatus(state=state, since=0.0, **kw)  # type: ignore[arg-type]


def go(status: TableStatus, event: object, now: float = 100.0) -> tuple[TableStatus, tuple[Action, ...]]:
    return step(status, event, now, POLICY)  # type: ignore[arg-type]


# -- the transitions of the module docstring ---------------------------------------------------

@pytest.mark.parametrize("start, event, end, actions", [
    (S.STARTING, Launch(), S.STARTING, (Action.LAUNCH,)),
    (S.DEGRADED, Launch(), S.STARTING, (Action.LAUNCH,)),
    (S.RUNNING, Launch(), S.RUNNING, ()),
    (S.BOOTSTRAPPING, Launch(), S.BOOTSTRAPPING, ()),
    (S.STARTING, BootstrapStarted(), S.BOOTSTRAPPING, ()),
    (S.STARTING, StreamStarted(), S.RUNNING, ()),
    (S.BOOTSTRAPPING, StreamStarted(), S.RUNNING, ()),
    (S.DEGRADED, StreamStarted(), S.DEGRADED, ()),
    (S.STARTING, BatchApplied(), S.RUNNING, ()),
    (S.RUNNING, BatchApplied(), S.RUNNING, ()),
    (S.STARTING, Failed("x"), S.DEGRADED, (Action.HALT,)),
    (S.BOOTSTRAPPING, Failed("x"), S.DEGRADED, (Action.HALT,)),
    (S.RUNNING, Failed("x"), S.DEGRADED, (Action.HALT,)),
    (S.RUNNING, Tick(), S.RUNNING, ()),
    (S.RUNNING, Resume(), S.RUNNING, ()),
    (S.STARTING, Pause(), S.PAUSED, (Action.HALT,)),
    (S.BOOTSTRAPPING, Pause(), S.PAUSED, (Action.HALT,)),
    (S.RUNNING, Pause(), S.PAUSED, (Action.HALT,)),
    (S.DEGRADED, Pause(), S.PAUSED, (Action.HALT,)),
    (S.PAUSED, Pause(), S.PAUSED, ()),
    (S.PAUSED, Resume(), S.STARTING, (Action.LAUNCH,)),
    (S.PAUSED, Launch(), S.PAUSED, ()),
    (S.PAUSED, Failed("late"), S.PAUSED, ()),
    (S.PAUSED, BatchApplied(), S.PAUSED, ()),
    (S.PAUSED, Tick(), S.PAUSED, ()),
    (S.RUNNING, Stop(), S.STOPPED, (Action.HALT,)),
    (S.PAUSED, Stop(), S.STOPPED, (Action.HALT,)),
    (S.DEGRADED, Stop(), S.STOPPED, (Action.HALT,)),
])
def test_transition(start: TableState, event: object, end: TableState, actions: tuple[Action, ...]) -> None:
    after, acts = go(at(start), event)
    assert after.state == end
    assert acts == actions


@pytest.mark.parametrize("event", [Launch(), Resume(), Pause(), Stop(), Failed("x"), BatchApplied(), Tick(),
                                   StreamStarted(), BootstrapStarted()])
def test_stopped_is_final(event: object) -> None:
    stopped = at(S.STOPPED, last_error="kept")
    assert go(stopped, event) == (stopped, ())


def test_since_changes_only_when_the_state_changes() -> None:
    running = at(S.RUNNING)
    assert go(running, BatchApplied(), now=50.0)[0].since == 0.0
    assert go(running, Failed("x"), now=50.0)[0].since == 50.0


def test_unknown_event_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        go(at(S.RUNNING), object())


# -- backoff ------------------------------------------------------------------------------------

def test_failure_schedules_a_retry_and_records_the_error() -> None:
    after, acts = go(at(S.RUNNING), Failed("boom", code="transient", rand=0.0), now=100.0)
    assert after == TableStatus(state=S.DEGRADED, failures=1, retries=1, next_retry_at=102.0,
                                last_error="boom", error_code="transient", since=100.0)
    assert acts == (Action.HALT,)


def test_retry_only_when_due() -> None:
    degraded = at(S.DEGRADED, failures=1, next_retry_at=102.0)
    assert go(degraded, Tick(), now=101.999) == (degraded, ())
    after, acts = go(degraded, Tick(), now=102.0)
    assert (after.state, after.next_retry_at, after.failures, acts) == (S.STARTING, None, 1, (Action.LAUNCH,))


def test_delays_grow_exponentially_and_are_capped() -> None:
    status, now, delays = at(S.RUNNING), 0.0, []
    for _ in range(8):
        status, _ = go(status, Failed("x", rand=0.0), now=now)
        assert status.next_retry_at is not None
        delays.append(status.next_retry_at - now)
        now = status.next_retry_at
        status, _ = go(status, Tick(), now=now)  # relaunch, fails again
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert status.failures == 8 and status.retries == 8


@pytest.mark.parametrize("attempt", [1, 2, 3, 6, 20])
@pytest.mark.parametrize("rand", [0.0, 0.25, 0.5, 0.999, 1.0, -3.0, 7.0])
def test_jitter_shortens_by_at_most_the_jitter_fraction(attempt: int, rand: float) -> None:
    raw = min(60.0, 2.0 * 2.0 ** (attempt - 1))
    d = POLICY.delay(attempt, rand)
    assert raw * (1 - POLICY.jitter) - 1e-9 <= d <= raw
    assert d == pytest.approx(raw * (1 - 0.2 * min(max(rand, 0.0), 1.0)))


def test_delay_counts_attempts_from_one() -> None:
    with pytest.raises(ValueError):
        POLICY.delay(0, 0.0)


def test_delay_stays_capped_for_a_table_that_fails_for_days() -> None:
    assert RestartPolicy().delay(1100, 0.0) == 300.0


def test_batch_applied_resets_failures_but_not_retries() -> None:
    degraded = at(S.STARTING, failures=3, retries=5, quick_restarts=2, last_error="e", error_code="c")
    after, acts = go(degraded, BatchApplied(), now=7.0)
    assert after == TableStatus(state=S.RUNNING, failures=0, retries=5, next_retry_at=None, last_error=None,
                                error_code=None, quick_restarts=0, since=7.0)
    assert acts == ()
    again, _ = go(after, Failed("x", rand=0.0), now=10.0)
    assert again.next_retry_at == 12.0  # back to the base delay


# -- immediate restarts (additive schema change) ------------------------------------------------

def test_restart_now_is_limited_then_falls_back_to_backoff() -> None:
    assert MAX_QUICK_RESTARTS == 2
    status = at(S.RUNNING)
    for n in range(1, MAX_QUICK_RESTARTS + 1):
        status, acts = go(status, Failed("schema", code="schema_additive", restart_now=True), now=float(n))
        assert acts == (Action.HALT, Action.LAUNCH)
        assert (status.state, status.quick_restarts, status.failures, status.retries) == (S.STARTING, n, 0, 0)
        assert status.error_code == "schema_additive"
        status, _ = go(status, StreamStarted(), now=float(n))
    status, acts = go(status, Failed("schema", code="schema_additive", restart_now=True, rand=0.0), now=10.0)
    assert acts == (Action.HALT,)
    assert (status.state, status.failures, status.retries, status.next_retry_at) == (S.DEGRADED, 1, 1, 12.0)


def test_a_good_batch_re_arms_quick_restarts() -> None:
    status = at(S.RUNNING, quick_restarts=MAX_QUICK_RESTARTS)
    status, _ = go(status, BatchApplied())
    status, acts = go(status, Failed("schema", restart_now=True))
    assert acts == (Action.HALT, Action.LAUNCH) and status.quick_restarts == 1


# -- pause / resume / stop ----------------------------------------------------------------------

def test_pause_clears_a_pending_retry_and_resume_starts_fresh() -> None:
    degraded = at(S.DEGRADED, failures=4, retries=4, quick_restarts=1, next_retry_at=500.0)
    paused, acts = go(degraded, Pause(), now=200.0)
    assert (paused.state, paused.next_retry_at, acts) == (S.PAUSED, None, (Action.HALT,))
    assert go(paused, Tick(), now=10_000.0) == (paused, ())
    resumed, acts = go(paused, Resume(), now=300.0)
    assert (resumed.state, resumed.failures, resumed.quick_restarts, resumed.retries) == (S.STARTING, 0, 0, 4)
    assert acts == (Action.LAUNCH,)


def test_stop_clears_the_retry() -> None:
    after, acts = go(at(S.DEGRADED, next_retry_at=5.0), Stop(), now=1.0)
    assert (after.state, after.next_retry_at, acts) == (S.STOPPED, None, (Action.HALT,))


def test_a_retrying_table_is_not_running_until_a_batch_succeeds() -> None:
    retrying = at(S.STARTING, failures=2, retries=2, last_error="CHECK constraint violated")
    status, acts = go(retrying, StreamStarted(), now=5.0)
    assert (status.state, status.last_error, acts) == (S.STARTING, "CHECK constraint violated", ())
    status, _ = go(status, BatchApplied(), now=6.0)
    assert (status.state, status.failures, status.last_error) == (S.RUNNING, 0, None)


def test_a_retried_bootstrap_that_started_its_stream_waits_in_starting() -> None:
    status, _ = go(at(S.BOOTSTRAPPING, failures=1), StreamStarted())
    assert status.state == S.STARTING


# -- a wait that holds the work back (the destination unreachable, a lock) ------------------------

def test_a_wait_degrades_the_table_without_halting_it_and_its_end_restores_the_state():
    from lakemirror.supervisor.control.table_state import WaitOver, Waiting

    for before in (S.STARTING, S.BOOTSTRAPPING, S.RUNNING):
        waiting, actions = go(at(before), Waiting("waiting on PostgreSQL: cannot reach the server", "postgres_wait"))
        assert (waiting.state, actions, waiting.waiting_from) == (S.DEGRADED, (), before)
        assert (waiting.last_error, waiting.error_code, waiting.next_retry_at, waiting.failures) == \
            ("waiting on PostgreSQL: cannot reach the server", "postgres_wait", None, 0)
        assert go(waiting, Tick(), 10_000.0) == (waiting, ()), "a wait is never retried by the supervisor"
        assert go(waiting, Launch()) == (waiting, ()), "its work is still going on"
        newer, _ = go(waiting, Waiting("waiting for a lock held by session 42", "postgres_lock"), 120.0)
        assert (newer.last_error, newer.error_code, newer.since) == ("waiting for a lock held by session 42",
                                                                     "postgres_lock", 100.0)
        over, actions = go(newer, WaitOver(), 130.0)
        assert (over.state, over.last_error, over.error_code, over.waiting_from, over.since, actions) == \
            (before, None, None, None, 130.0, ())


def test_a_wait_ends_with_a_batch_a_start_a_failure_or_a_pause():
    from lakemirror.supervisor.control.table_state import Waiting

    waiting, _ = go(at(S.RUNNING), Waiting("w"))
    applied, _ = go(waiting, BatchApplied())
    assert (applied.state, applied.last_error, applied.waiting_from) == (S.RUNNING, None, None)
    started, _ = go(go(at(S.STARTING), Waiting("w"))[0], StreamStarted())
    assert (started.state, started.last_error, started.waiting_from) == (S.RUNNING, None, None)
    bootstrapping, _ = go(go(at(S.STARTING), Waiting("w"))[0], BootstrapStarted())
    assert (bootstrapping.state, bootstrapping.last_error) == (S.BOOTSTRAPPING, None)
    failed, actions = go(waiting, Failed("gave up after retry_seconds"), 150.0)
    assert (failed.state, failed.failures, failed.last_error, failed.waiting_from, failed.since, actions) == \
        (S.DEGRADED, 1, "gave up after retry_seconds", None, 150.0, (Action.HALT,))
    assert failed.next_retry_at is not None
    paused, _ = go(waiting, Pause())
    assert (paused.state, paused.last_error, paused.waiting_from) == (S.PAUSED, None, None)
    for other in (S.PAUSED, S.FAILED, S.STOPPED):
        assert go(at(other), Waiting("w")) == (at(other), ())
    retrying = at(S.DEGRADED, next_retry_at=500.0, failures=2, last_error="boom")
    assert go(retrying, Waiting("w")) == (retrying, ()), "a failed table's own error and retry stay"
