"""What a replica's calls to PostgreSQL are waiting on, so that a wait that holds replication back
shows (state, error, lag) instead of passing for a running table.

Two waits hold a table's replication back without failing it at once:

- **the server does not answer** (stopped, restarting, unreachable): each call retries its
  connection with backoff for up to ``retry_seconds`` (:meth:`~.executor.PostgresReplica._run`);
- **a lock another session holds** on the replica (``LOCK TABLE``, a long transaction, a
  migration): the call's statement waits in the server until the lock is released or
  ``statement_timeout_seconds`` ends it.

:class:`ServerCalls` records a replica's call in flight (thread-safe; the clock is injected): its
start, its connection's server process, the connection failures it is retrying. The supervisor's
side asks :meth:`ServerCalls.wait` on its own thread: a connection being retried is a wait at once;
a statement running longer than ``LOCK_CHECK_SECONDS`` is looked up in ``pg_stat_activity``
(:func:`lock_wait_query`, run by :meth:`~.executor.Connector.lock_wait`), and is a wait only when
the server says it waits for a lock, naming the sessions that hold it. A statement that is merely
long (a large batch, a bootstrap's COPY) is work, not a wait.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from psycopg import sql

from lakemirror.sinks.waits import LockWait, ServerWait

__all__ = ["CODE_LOCK", "CODE_UNAVAILABLE", "LOCK_CHECK_SECONDS", "LockWait", "ServerCalls", "ServerWait",
           "lock_reason", "lock_wait_query", "waiting_sessions_query"]

#: A statement running this long is looked up in ``pg_stat_activity`` (at most this often).
LOCK_CHECK_SECONDS = 5.0
CODE_UNAVAILABLE = "postgres_unavailable"
CODE_LOCK = "postgres_lock"


def lock_wait_query(pid: int) -> sql.Composed:
    """Whether server process ``pid`` waits for a lock: the relation and each blocking session
    (process id, application, user, state and since when). No row: it does not wait for a lock."""
    return sql.SQL(
        "SELECT (SELECT l.relation::regclass::text FROM pg_locks l WHERE l.pid = a.pid AND NOT l.granted "
        "AND l.relation IS NOT NULL LIMIT 1), "
        "ARRAY(SELECT format('%s (%s, user %s, %s since %s)', b.pid, coalesce(nullif(b.application_name, ''), "
        "'no application name'), b.usename, coalesce(b.state, 'unknown state'), "
        "to_char(b.state_change AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC')) "
        "FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(a.pid)) ORDER BY b.pid) "
        "FROM pg_stat_activity a WHERE a.pid = {} AND a.wait_event_type = 'Lock'").format(sql.Literal(pid))


def waiting_sessions_query(application_name: str) -> sql.Composed:
    """The server processes of ``application_name`` in this database that wait for a lock."""
    return sql.SQL("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = {} "
                   "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() ORDER BY pid").format(
        sql.Literal(application_name))


def lock_reason(label: str, found: LockWait, statement_timeout_seconds: float, what_waits: str) -> str:
    """A lock wait told: the relation, who holds it, what ends it."""
    what = f"a lock on {found.relation}" if found.relation else "a lock"
    plural = "s" if len(found.holders) > 1 else ""
    holders = f"PostgreSQL session{plural} {'; '.join(found.holders)}" if found.holders else "another session"
    return (f"{label}: {what_waits} waiting for {what} held by {holders}: the replica takes no change until it is "
            f"released; statement_timeout_seconds={statement_timeout_seconds:g} ends the wait, and the write is "
            f"retried")


class ServerCalls:
    """A replica's call to PostgreSQL in flight, as :class:`~.executor.PostgresReplica` reports it.

    One call at a time per replica (a batch, a bootstrap, a refresh, a preparation); a call that
    begins while another is recorded replaces it."""

    def __init__(self, label: str, *, retry_seconds: float, statement_timeout_seconds: float,
                 clock: Callable[[], float] = time.time, check_after: float = LOCK_CHECK_SECONDS) -> None:
        self.label = label
        self.retry_seconds = retry_seconds
        self.statement_timeout_seconds = statement_timeout_seconds
        self._clock = clock
        self._check_after = check_after
        self._lock = threading.Lock()
        self._started: float | None = None        # the call in flight began
        self._pid: int | None = None              # its connection's server process, once connected
        self._connected_at: float | None = None
        self._failing_since: float | None = None  # its connection attempts fail since (being retried)
        self._failure: str | None = None
        self._checked_at: float | None = None
        self._lock_wait: ServerWait | None = None

    # -- the executor's side ------------------------------------------------------------------------

    def begin(self) -> None:
        with self._lock:
            self._started, self._pid, self._connected_at = self._clock(), None, None
            self._failing_since, self._failure, self._checked_at, self._lock_wait = None, None, None, None

    def connected(self, pid: int | None) -> None:
        """The call has a connection (to server process ``pid``): the server answers again."""
        with self._lock:
            self._pid, self._connected_at = pid, self._clock()
            self._failing_since, self._failure, self._checked_at, self._lock_wait = None, None, None, None

    def retrying(self, failure: str) -> None:
        """The call lost its connection (or could not open one) and retries: ``failure`` says why."""
        with self._lock:
            if self._failing_since is None:
                self._failing_since = self._clock()
            self._failure, self._pid, self._connected_at, self._lock_wait = failure, None, None, None

    def end(self) -> None:
        with self._lock:
            self._started, self._pid, self._connected_at = None, None, None
            self._failing_since, self._failure, self._checked_at, self._lock_wait = None, None, None, None

    def in_call(self) -> bool:
        """A call is in flight: the replica's work is on the server (or waits for it)."""
        with self._lock:
            return self._started is not None

    # -- the supervisor's side ----------------------------------------------------------------------

    def wait(self, look_up: Callable[[int], LockWait | None] | None = None) -> ServerWait | None:
        """The wait that holds the call back now, or None. ``look_up`` asks the server whether a
        process waits for a lock (:meth:`~.executor.Connector.lock_wait`); it is called only for a
        statement running longer than the check interval, at most once per interval."""
        now = self._clock()
        with self._lock:
            if self._started is None:
                return None
            if self._failing_since is not None:
                return ServerWait(self._failing_since, self._unavailable(), CODE_UNAVAILABLE)
            pid, connected_at = self._pid, self._connected_at
            due = (look_up is not None and pid is not None and connected_at is not None
                   and now - connected_at >= self._check_after
                   and (self._checked_at is None or now - self._checked_at >= self._check_after))
            if not due:
                return self._lock_wait
            self._checked_at = now
        try:
            found = look_up(pid) if look_up is not None and pid is not None else None
        except Exception:  # noqa: BLE001 (the look-up is best effort: the work goes on)
            found = None
        with self._lock:
            if self._pid != pid:  # the call moved on meanwhile
                return self._lock_wait
            if found is None:
                self._lock_wait = None
            elif self._lock_wait is None or self._lock_wait.reason != self._locked(found):
                since = self._lock_wait.since if self._lock_wait is not None else now
                self._lock_wait = ServerWait(since, self._locked(found), CODE_LOCK)
            return self._lock_wait

    def _unavailable(self) -> str:
        return (f"{self.label}: waiting for PostgreSQL: {self._failure}; each call is retried for up to "
                f"retry_seconds={self.retry_seconds:g} s, then the table restarts with backoff")

    def _locked(self, found: LockWait) -> str:
        return lock_reason(self.label, found, self.statement_timeout_seconds, "the batch is")
