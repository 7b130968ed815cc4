"""A Real-Time Mode query whose batches have stopped finishing, told as a wait.

In Real-Time Mode the PostgreSQL writers run on the executors (:mod:`lakemirror.sinks.postgres.foreach`):
a writer whose server does not answer retries each flush for up to ``retry_seconds``, one held by a
lock waits in the server; meanwhile its task, and so the real-time batch, cannot end, and the
daemon sees no error at all. Batches end every ``checkpoint_interval_seconds`` whether or not
messages come, so a query whose last batch ended long ago is held back: :class:`RealTimeStall`
says so once that has lasted ``stall_after`` seconds and the server (asked from the driver, at most
every ``PROBE_SECONDS``) names a cause: it does not answer, or one of lakemirror's sessions waits for
a lock (named with its holders). When it answers and no writer waits for a lock, the writers are
slow: that is reported only after ``SLOW_FACTOR`` times as long, and never before the query's first
batch (starting Python workers on a busy machine takes longer than an interval).
"""

from __future__ import annotations

import time
from typing import Callable

from lakemirror.sinks.postgres.waits import CODE_LOCK, CODE_UNAVAILABLE, LockWait, ServerWait, lock_reason

#: A real-time query with no finished batch for this long, at least, is held back.
MIN_STALL_SECONDS = 10.0
#: The server is asked this often, at most, while the query is held back.
PROBE_SECONDS = 5.0
CODE_STALLED = "real_time_stalled"
#: A stall with no cause the server names (it answers, no writer waits for a lock) is reported only
#: after this many times ``stall_after``, and only once a batch has finished since the query started.
SLOW_FACTOR = 3

#: What the server says: why it cannot be reached (None: it answers), and a lock a writer waits for.
Probe = Callable[[], tuple[str | None, LockWait | None]]


class RealTimeStall:
    """Watches one Real-Time Mode query's finished batches (see the module docstring)."""

    def __init__(self, label: str, interval_seconds: float, probe: Probe, *, retry_seconds: float,
                 statement_timeout_seconds: float, clock: Callable[[], float] = time.time,
                 stall_after: float | None = None) -> None:
        self.label = label
        self.interval = interval_seconds
        self.probe = probe
        self.retry_seconds = retry_seconds
        self.statement_timeout_seconds = statement_timeout_seconds
        self.clock = clock
        self.stall_after = stall_after if stall_after is not None else max(MIN_STALL_SECONDS, 5 * interval_seconds)
        self._last: float | None = None      # the query started, or its last batch ended
        self._finished_one = False           # a batch has finished since the query started
        self._probed_at: float | None = None
        self._wait: ServerWait | None = None

    def started(self) -> None:
        self._last, self._probed_at, self._wait, self._finished_one = self.clock(), None, None, False

    def batch_finished(self) -> None:
        self._last, self._probed_at, self._wait, self._finished_one = self.clock(), None, None, True

    def stopped(self) -> None:
        self._last, self._probed_at, self._wait = None, None, None

    def wait(self, look_up: object = None) -> ServerWait | None:
        """The wait holding the query back now, or None (``look_up`` is not used: the writers'
        sessions are found by the probe)."""
        if self._last is None:
            return None
        now = self.clock()
        if now - self._last < self.stall_after:
            return None
        if self._probed_at is not None and now - self._probed_at < PROBE_SECONDS:
            return self._wait
        self._probed_at = now
        try:
            unreachable, lock = self.probe()
        except Exception:  # noqa: BLE001 (a probe that fails says nothing: the stall still shows)
            unreachable, lock = None, None
        since = self._wait.since if self._wait is not None else self._last + self.stall_after
        held = (f"{self.label}: no real-time batch has finished for over {self.stall_after:g} s (one ends every "
                f"{self.interval:g} s)")
        if unreachable is not None:
            reason = (f"{held}: the writers cannot reach PostgreSQL ({unreachable}) and retry each flush for up to "
                      f"retry_seconds={self.retry_seconds:g} s, then the source restarts with backoff")
            code = CODE_UNAVAILABLE
        elif lock is not None:
            reason = f"{held}: " + lock_reason(self.label, lock, self.statement_timeout_seconds,
                                               "a writer is").split(": ", 1)[1]
            code = CODE_LOCK
        elif self._finished_one and now - self._last >= SLOW_FACTOR * self.stall_after:
            reason = (f"{held}, though PostgreSQL answers: the writers are slow or held (their sessions are named "
                      f"lakemirror in pg_stat_activity)")
            code = CODE_STALLED
        else:
            # No cause found yet: a first batch (Python workers starting) or a busy machine is
            # slower than the interval; only a named cause, or a long stall, is reported.
            self._wait = None
            return None
        self._wait = ServerWait(since, reason, code)
        return self._wait
