"""A PostgreSQL replica's waits on its server (sinks.postgres.waits) and how they reach the table's
state (supervisor.control.destination_waits): an outage at once, a lock only when the server says so."""

from __future__ import annotations

from lakemirror.sinks.postgres.waits import CODE_LOCK, CODE_UNAVAILABLE, LockWait, ServerCalls
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.destination_waits import WaitReport


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
    assert c.wait() is None and not c.in_call()
    c.begin()
    assert c.in_call() and c.wait() is None
    c.retrying("cannot reach the server postgres://u@h:5432/db (schema s) (connection refused)")
    clock.now += 3
    c.retrying("cannot reach the server postgres://u@h:5432/db (schema s) (connection refused)")
    wait = c.wait()
    assert wait is not None and (wait.since, wait.code) == (1000.0, CODE_UNAVAILABLE)
    assert "connection refused" in wait.reason and "retry_seconds=60" in wait.reason and "src.sales.t" in wait.reason
    c.connected(4711)
    assert c.wait() is None, "the server answers again"
    c.end()
    assert not c.in_call() and c.wait() is None


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
    assert "the batch is waiting for a lock held by another session:" in events[-1].error
    c.end()
    report.check()
    report.check()
    assert [type(e) for e in events] == [sm.Waiting, sm.Waiting, sm.WaitOver]


def test_a_real_time_query_whose_batches_stop_finishing_is_held_and_says_by_what():
    from lakemirror.sinks.postgres.real_time_stall import CODE_STALLED, RealTimeStall

    clock = Clock()
    said: list[tuple[str | None, LockWait | None]] = [("cannot reach the server postgres://u@h:1/d (schema s) "
                                                       "(connection refused)", None)]
    probes = []

    def probe() -> tuple[str | None, LockWait | None]:
        probes.append(clock.now)
        return said[0]

    stall = RealTimeStall("events:shop", 1.0, probe, retry_seconds=60, statement_timeout_seconds=90, clock=clock)
    assert stall.stall_after == 10 and stall.wait() is None, "not started"
    stall.started()
    clock.now += 9
    assert stall.wait() is None and probes == [], "batches end every second: 9 s is not yet a stall"
    clock.now += 2
    wait = stall.wait()
    assert wait is not None and wait.code == CODE_UNAVAILABLE and wait.since == 1010.0
    assert "no real-time batch has finished for over 10 s (one ends every 1 s)" in wait.reason
    assert "connection refused" in wait.reason and "retry_seconds=60" in wait.reason
    clock.now += 1
    assert stall.wait() == wait and len(probes) == 1, "the server is asked at most every few seconds"
    said[0] = (None, LockWait("r.accounts", ("77 (psql, user bob, idle in transaction since x)",)))
    clock.now += 5
    locked = stall.wait()
    assert locked is not None and locked.code == CODE_LOCK and locked.since == 1010.0
    assert "a writer is waiting for a lock on r.accounts held by PostgreSQL session 77 (psql" in locked.reason
    said[0] = (None, None)
    clock.now += 5
    assert stall.wait() is None, "no cause named, before the first batch: a slow start, not a stall"
    stall.batch_finished()
    assert stall.wait() is None
    clock.now += 20
    assert stall.wait() is None, "after a batch, a slow one with no cause named is reported later"
    clock.now += 10
    assert stall.wait().code == CODE_STALLED  # type: ignore[union-attr]
    stall.batch_finished()
    assert stall.wait() is None
    stall.stopped()
    clock.now += 100
    assert stall.wait() is None, "a stopped query is not held back"
    assert RealTimeStall("x", 4.0, probe, retry_seconds=1, statement_timeout_seconds=1).stall_after == 20


def test_a_refused_login_or_a_missing_database_names_the_settings_to_check_and_no_secret():
    import psycopg

    from lakemirror.errors import TerminalError, TransientError
    from lakemirror.sinks.postgres.executor import Connector, PostgresTarget, _not_worth_retrying

    connector = Connector(PostgresTarget("db", 5432, "app", "r", "lm", "s3cret-pw"))
    for text in ('connection failed: FATAL:  password authentication failed for user "lm" (pw s3cret-pw)',
                 'connection failed: FATAL:  role "lm" does not exist', "fe_sendauth: no password supplied"):
        err = connector.translate(psycopg.OperationalError(text), "src.sales.t")
        assert isinstance(err, TerminalError) and err.code == "postgres_login", text
        assert "refused the login" in str(err) and "destination.user" in str(err) and "password_file" in str(err)
        assert "s3cret-pw" not in str(err) and "cannot reach" not in str(err)
        assert _not_worth_retrying(psycopg.OperationalError(text)), "a refused login is not retried at once"
    missing = connector.translate(psycopg.OperationalError('FATAL:  database "app" does not exist'), "t")
    assert isinstance(missing, TerminalError) and "destination.database" in str(missing)
    down = connector.translate(psycopg.OperationalError("connection refused"), "t")
    assert isinstance(down, TransientError) and "cannot reach the server postgres://lm@db:5432/app" in str(down)
