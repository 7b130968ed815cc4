"""The per-table state machine: a pure function of (status, event, now, policy).

States::

    STARTING ──bootstrap──▶ BOOTSTRAPPING ──▶ RUNNING
        ▲  │                                     │
        │  └────────────── failure ──────────────┴──▶ DEGRADED ──retry due──▶ STARTING
        │  STARTING, BOOTSTRAPPING, RUNNING ──waiting──▶ DEGRADED (no retry: the work goes on)
        │                   ◀──wait over / a batch applied──┘
        │                  fatal failure (e.g. change window expired, policy `fail`) ──▶ FAILED
        └── resync (new bootstrap epoch), from any state but STOPPED; resume also leaves FAILED
    PAUSED ◀── pause (from any state but STOPPED); resume ──▶ STARTING
    STOPPED ◀── stop (final)

``step`` returns the new status and the actions the runner must take; it never does I/O, and
time and randomness (jitter) arrive as arguments, so every transition is testable without Spark.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class TableState(str, enum.Enum):
    STARTING = "starting"
    BOOTSTRAPPING = "bootstrapping"
    RUNNING = "running"
    DEGRADED = "degraded"
    PAUSED = "paused"
    FAILED = "failed"       # needs a person (or a resync): never retried by itself
    STOPPED = "stopped"


class Action(str, enum.Enum):
    LAUNCH = "launch"   # prepare (bootstrap if needed) and start the table's stream
    HALT = "halt"       # stop the table's stream, letting the running batch finish
    RESYNC = "resync"   # forget the replica's progress: the next launch bootstraps a new epoch


@dataclass(frozen=True)
class RestartPolicy:
    """Exponential backoff with jitter for a failing table; visible state, not hidden sleeps.

    The n-th consecutive failure waits ``min(max_delay, base_delay * multiplier**(n-1))``,
    shortened by up to ``jitter`` (a fraction) so that tables failing together spread out.
    """

    base_delay_seconds: float = 2.0
    max_delay_seconds: float = 300.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int, rand: float) -> float:
        if attempt < 1:
            raise ValueError("attempt counts from 1")
        # Grow in log space so a table failing for days never overflows the float.
        exponent = min(attempt - 1, 64)
        raw = min(self.max_delay_seconds, self.base_delay_seconds * self.multiplier ** exponent)
        return raw * (1.0 - self.jitter * min(max(rand, 0.0), 1.0))


@dataclass(frozen=True)
class TableStatus:
    state: TableState = TableState.STARTING
    failures: int = 0                  # consecutive failures since the last good batch
    retries: int = 0                   # retries scheduled over the table's life
    next_retry_at: float | None = None
    last_error: str | None = None
    error_code: str | None = None
    quick_restarts: int = 0            # immediate restarts (additive schema change) without progress
    resync_on_retry: bool = False      # the retry that is due must start a new bootstrap epoch
    since: float = 0.0                 # when the state was entered
    #: Degraded by a wait (the destination does not answer, a lock): the state the table returns
    #: to when the wait is over. None: not waiting.
    waiting_from: TableState | None = None


# Events -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Launch:
    """Begin (or resume) replicating the table."""


@dataclass(frozen=True)
class BootstrapStarted:
    pass


@dataclass(frozen=True)
class StreamStarted:
    pass


@dataclass(frozen=True)
class BatchApplied:
    pass


@dataclass(frozen=True)
class Failed:
    error: str
    code: str = "error"
    restart_now: bool = False          # e.g. the source gained columns: restart without backoff
    fatal: bool = False                # no automatic retry: the table goes to FAILED
    resync: bool = False               # recover by a new bootstrap (e.g. change window expired)
    rand: float = 0.0                  # in [0, 1): the jitter draw, injected for purity


@dataclass(frozen=True)
class Waiting:
    """The table's work is held back by a wait it cannot end itself (the destination unreachable
    and retried, a lock another session holds): the table shows ``degraded`` with ``error`` while
    the work goes on; nothing is halted or retried by the supervisor."""

    error: str
    code: str = "waiting"


@dataclass(frozen=True)
class WaitOver:
    """The wait that :class:`Waiting` reported has ended (the work goes on, or failed)."""


@dataclass(frozen=True)
class Tick:
    """Time passed; a degraded table whose retry is due is relaunched."""


@dataclass(frozen=True)
class Pause:
    pass


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Resync:
    """An operator asked for a new bootstrap of the table."""


Event = (Launch | BootstrapStarted | StreamStarted | BatchApplied | Failed | Tick | Pause | Resume | Stop
         | Resync | Waiting | WaitOver)

#: An immediate restart that recurs this often without a good batch in between falls back to backoff.
MAX_QUICK_RESTARTS = 2


def _enter(status: TableStatus, state: TableState, now: float, **changes: object) -> TableStatus:
    ends_wait = status.waiting_from is not None and "waiting_from" not in changes
    if ends_wait:
        # Any other transition ends the wait's degraded state, and the wait's error with it.
        changes = {"last_error": None, "error_code": None, **changes, "waiting_from": None}
    since = now if state != status.state or ends_wait else status.since
    return replace(status, state=state, since=since, **changes)  # type: ignore[arg-type]


def step(status: TableStatus, event: Event, now: float,
         policy: RestartPolicy) -> tuple[TableStatus, tuple[Action, ...]]:
    """Return the table's next status and the actions to carry out."""
    s = status.state
    if isinstance(event, Waiting):
        if status.waiting_from is not None:  # still waiting: a newer account of the same wait
            return replace(status, last_error=event.error, error_code=event.code), ()
        if s in (TableState.STARTING, TableState.BOOTSTRAPPING, TableState.RUNNING):
            return _enter(status, TableState.DEGRADED, now, last_error=event.error, error_code=event.code,
                          next_retry_at=None, waiting_from=s), ()
        return status, ()
    if isinstance(event, WaitOver):
        if status.waiting_from is None:
            return status, ()
        return _enter(status, status.waiting_from, now, last_error=None, error_code=None, waiting_from=None), ()
    if s == TableState.STOPPED:
        return status, ()
    if isinstance(event, Stop):
        return _enter(status, TableState.STOPPED, now, next_retry_at=None), (Action.HALT,)
    if isinstance(event, Pause):
        if s == TableState.PAUSED:
            return status, ()
        return _enter(status, TableState.PAUSED, now, next_retry_at=None), (Action.HALT,)
    if isinstance(event, Resync):
        # The old epoch's error goes with it: the new bootstrap has none yet.
        return (_enter(status, TableState.STARTING, now, failures=0, quick_restarts=0, next_retry_at=None,
                       resync_on_retry=False, last_error=None, error_code=None),
                (Action.HALT, Action.RESYNC, Action.LAUNCH))
    if s in (TableState.PAUSED, TableState.FAILED):
        if isinstance(event, Resume):
            return _enter(status, TableState.STARTING, now, failures=0, quick_restarts=0), (Action.LAUNCH,)
        return status, ()
    if isinstance(event, Launch):
        if s in (TableState.STARTING, TableState.DEGRADED) and status.waiting_from is None:
            return _enter(status, TableState.STARTING, now, next_retry_at=None), (Action.LAUNCH,)
        return status, ()
    if isinstance(event, BootstrapStarted):
        return _enter(status, TableState.BOOTSTRAPPING, now), ()
    if isinstance(event, StreamStarted):
        # A table retrying after failures is not "running" until a batch (or an empty trigger)
        # succeeds: otherwise a table that fails every retry would flap running/degraded.
        if status.waiting_from is not None and status.failures == 0:  # it started after its wait
            return _enter(status, TableState.RUNNING, now), ()
        if s in (TableState.STARTING, TableState.BOOTSTRAPPING) and status.failures == 0:
            return _enter(status, TableState.RUNNING, now), ()
        if s == TableState.BOOTSTRAPPING:
            return _enter(status, TableState.STARTING, now), ()
        return status, ()
    if isinstance(event, BatchApplied):
        return _enter(status, TableState.RUNNING, now, failures=0, quick_restarts=0,
                      last_error=None, error_code=None, next_retry_at=None), ()
    if isinstance(event, Failed):
        if event.fatal:
            return _enter(status, TableState.FAILED, now, failures=status.failures + 1, next_retry_at=None,
                          last_error=event.error, error_code=event.code), (Action.HALT,)
        if event.resync and status.failures == 0:
            return _enter(status, TableState.STARTING, now, failures=1, retries=status.retries + 1,
                          last_error=event.error, error_code=event.code),\
                (Action.HALT, Action.RESYNC, Action.LAUNCH)
        if event.restart_now and status.quick_restarts < MAX_QUICK_RESTARTS:
            return _enter(status, TableState.STARTING, now, quick_restarts=status.quick_restarts + 1,
                          last_error=event.error, error_code=event.code), (Action.HALT, Action.LAUNCH)
        failures = status.failures + 1
        due = now + policy.delay(failures, event.rand)
        return _enter(status, TableState.DEGRADED, now, failures=failures, retries=status.retries + 1,
                      next_retry_at=due, last_error=event.error, error_code=event.code,
                      resync_on_retry=event.resync), (Action.HALT,)
    if isinstance(event, Tick):
        if s == TableState.DEGRADED and status.next_retry_at is not None and now >= status.next_retry_at:
            actions = (Action.RESYNC, Action.LAUNCH) if status.resync_on_retry else (Action.LAUNCH,)
            return _enter(status, TableState.STARTING, now, next_retry_at=None, resync_on_retry=False), actions
        return status, ()
    if isinstance(event, Resume):
        return status, ()
    raise TypeError(f"unknown event {event!r}")
