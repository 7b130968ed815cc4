"""A PostgreSQL replica's waits on its server (sinks.postgres.waits) and how they reach the table's
state (supervisor.destination_wait): an outage at once, a lock only when the server says so."""

from __future__ import annotations

from lakemirror.sinks.postgres.waits import CODE_LOCK, CODE_UNAVAILABLE, LockWait, ServerCalls
from lakemirror.supervisor import state as sm
from lakemirror.supervisor.destination_wait import WaitReport


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def calls(clock: Clock) -> ServerCalls:
    return ServerCalls("src.sales.t", retry_seconds=60, statement_timeout_seconds=90, clock=clock, check_after=5)


def test_a_server_that_does_not_answer_is_a_wait_from_the_first_failed_connection():
    clock = Clock()
    c = calls(clock)
    assert c.wait() is None and not c.in_call
    c.begin()
    assert c.in_call and c.wait() is None
    c.retrying("cannot reach the server postgres://u@h:5432/db (schema s) (connection refused)")
    clock.now += 3
    c.retrying("cannot reach the server postgres://u@h:5432/db (schema s) (connection refused)")
    wait = c.wait()
    assert wait is not None and (wait.since, wait.code) == (1000.0, CODE_UNAVAILABLE)
    assert "connection refused" in wait.reason and "retry_seconds=60" in wait.reason and "src.sales.t" in wait.reason
    c.connected(4711)
    assert c.wait() is None, "the server answers again"
    c.end()
    assert not c.in_call and c.wait() is None


def test_a_long_statement_is_a_wait_only_when_the_server_says_it_waits_for_a_lock():
    clock, asked = Clock(), []
    c = calls(clock)
    answer: list[LockWait | None] = [None]

    def look_up(pid: int) -> LockWait | None:
        asked.append(pid)
        return answer[0]

    c.begin()
    c.connected(4711)
    clock.now += 4
    assert c.wait(look_up) is None and asked == [], "a statement under the check interval is not looked up"
    clock.now += 2
    assert c.wait(look_up) is None and asked == [4711], "a long statement doing work (a big COPY) is no wait"
    clock.now += 1
    assert c.wait(look_up) is None and asked == [4711], "looked up at most once per interval"
    answer[0] = LockWait('s."orders"', ("4242 (psql, user alice, idle in transaction since 2026-01-01 "
                                        "10:00:00 UTC)",))
    clock.now += 5
    wait = c.wait(look_up)
    assert wait is not None and wait.code == CODE_LOCK and wait.since == clock.now
    assert 'a lock on s."orders" held by PostgreSQL session 4242 (psql, user alice' in wait.reason
    assert "statement_timeout_seconds=90" in wait.reason
    since = wait.since
    clock.now += 1
    assert c.wait(look_up) == wait, "between look-ups the wait found stands"
    clock.now += 5
    assert c.wait(look_up).since == since  # type: ignore[union-attr]
    answer[0] = None
    clock.now += 5
    assert c.wait(look_up) is None, "the lock was released"
    c.end()


def test_a_look_up_that_fails_is_no_wait():
    clock = Clock()
    c = calls(clock)
    c.begin()
    c.connected(1)
    clock.now += 10

    def broken(pid: int) -> LockWait | None:
        raise OSError("no slot")

    assert c.wait(broken) is None


def test_each_change_of_a_wait_is_reported_once_and_its_end_too():
    clock = Clock()
    c, events = calls(clock), []
    report = WaitReport(c, events.append, lambda pid: LockWait(None, ()))
    report.check()
    assert events == []
    c.begin()
    c.retrying("refused")
    report.check()
    report.check()
    assert [type(e) for e in events] == [sm.Waiting] and events[0].code == CODE_UNAVAILABLE
    c.connected(7)
    clock.now += 6
    report.check()
    assert isinstance(events[-1], sm.Waiting) and events[-1].code == CODE_LOCK
    assert "waiting for a lock held by another session:" in events[-1].error
    c.end()
    report.check()
    report.check()
    assert [type(e) for e in events] == [sm.Waiting, sm.Waiting, sm.WaitOver]
