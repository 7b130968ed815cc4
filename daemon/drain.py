"""The daemon's stop, bounded for real: what runs between SIGTERM (or a lost lease) and the exit.

The drain (:func:`drain`) halts every pipeline's tables at once and waits for the scheduled
sub-tasks, all under one deadline, ``drain_timeout_seconds``; whatever has not finished by then (a
query whose ``stop()`` waits on a Spark Connect server that is gone, a batch waiting on a PostgreSQL
server or a Kafka broker that does not answer) is abandoned on its own thread and named in one line
(:meth:`DrainOutcome.line`). Abandoning is safe: it leaves what a process killed at that moment
leaves, which the torture tests kill the daemon at on every path (the change feed in local mode and
over Spark Connect, a chunked bootstrap, PostgreSQL replicas, Kafka event sources), each time with
every replica exact afterwards. A table's unfinished batch is replayed at the next start and
applied once: Delta skips a write whose transaction id (app id and batch id) it holds, a PostgreSQL
replica's progress row (written in the batch's transaction) makes its replay a no-op, and over Spark
Connect the batch's outcome file is read again. A sub-task's run is done again by its next run
(its writes carry transaction ids too).

Then the lease is released (bounded too: :data:`LEASE_RELEASE_SECONDS`; a lease left behind is
taken over at once by the next daemon on this host, whose holder is dead, and expires elsewhere).

The process then ends at once (:func:`end_process`), without waiting for other libraries' exit
work: Spark Connect's client sends requests at exit that it retries for ten minutes and more when
its server is gone. And from the moment the stop is asked for, :class:`ExitGuard` holds the
process to ``drain_timeout_seconds`` + :data:`EXIT_GRACE_SECONDS` whatever it is stuck in (a start
that hangs in Spark, a control loop tick waiting on a server): past that, it says where the daemon
was stuck, removes ``daemon.json``, releases the lease and exits :data:`EXIT_DRAIN_INCOMPLETE`.

Exit codes of ``lakemirror run``: :mod:`lakemirror.daemon.exit_codes`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from lakemirror.bounded import all_within, call_within
from lakemirror.daemon.exit_codes import EXIT_DRAIN_INCOMPLETE

if TYPE_CHECKING:
    from lakemirror.checkpoints.pipeline_lease import PipelineLease
    from lakemirror.daemon.pipelines import PipelineRegistry
    from lakemirror.supervisor.subtasks.service import SubtaskService

log = logging.getLogger(__name__)

#: The longest the lease's release may take at the end of a drain (its store may be what hangs).
LEASE_RELEASE_SECONDS = 5.0
#: How long past ``drain_timeout_seconds`` (counted from the stop's request) the process may live.
EXIT_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class DrainOutcome:
    """What a drain finished, and what it abandoned at its deadline."""

    timeout_seconds: float
    seconds: float
    #: Pipeline id -> its tables whose halt had not finished, each with what it was waiting for.
    tables: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: Sub-tasks still running at the deadline.
    subtasks: Sequence[str] = ()
    #: Other work of the daemon still running at the deadline (a dead-letter replay).
    others: Sequence[str] = ()

    @property
    def complete(self) -> bool:
        return not self.tables and not self.subtasks and not self.others

    def line(self) -> str:
        """One line: the drain's time, or what did not finish and what becomes of it."""
        if self.complete:
            return f"drained in {self.seconds:.1f}s"
        parts = [f"pipeline {pid}: {', '.join(names)}" for pid, names in self.tables.items()]
        if self.subtasks:
            parts.append(f"sub-task{'s' if len(self.subtasks) > 1 else ''} {', '.join(self.subtasks)}")
        parts.extend(self.others)
        fate = []
        if self.tables:
            fate.append("each table's unfinished batch is replayed at the next start and applied once")
        if self.subtasks:
            fate.append("a sub-task's next run does its work again")
        if self.others:
            fate.append("a dead-letter replay cut short leaves its letters pending, to replay again")
        return (f"drain incomplete: not finished within drain_timeout_seconds ({self.timeout_seconds:g}s) and "
                f"abandoned: {'; '.join(parts)}. Nothing is lost: {'; '.join(fate)}")


def drain(pipelines: "PipelineRegistry", subtasks: "SubtaskService", timeout_seconds: float,
          closing: Mapping[str, Callable[[], object]] | None = None,
          clock: Callable[[], float] = time.monotonic) -> DrainOutcome:
    """Halt every pipeline's tables, wait for the sub-tasks in flight, then close ``closing`` (by
    name: work of the daemon's that ends after the tables), returning within ``timeout_seconds``
    (and a second of slack) with what did not finish. Starts nothing."""
    started = clock()
    tables = pipelines.shutdown_all(timeout_seconds)
    running = subtasks.shutdown(max(0.0, started + timeout_seconds - clock()))
    # Half a second at least: a close with nothing in flight returns at once, and is not to be named as cut short.
    others = all_within(dict(closing or {}), max(0.5, started + timeout_seconds - clock()), prefix="close")
    return DrainOutcome(timeout_seconds, clock() - started, tables, running, others)


def release_lease(lease: "PipelineLease", seconds: float = LEASE_RELEASE_SECONDS) -> bool:
    """Release the lease, waiting at most ``seconds``; False (said in the log) when its store did
    not answer in time: the release goes on in the background until the process exits."""
    try:
        if call_within(lease.release, seconds, f"lease:{lease.pipeline_id}:release"):
            return True
    except Exception as exc:  # noqa: BLE001 (the lease then expires by itself)
        log.warning("pipeline %s: releasing the lease failed: %s", lease.pipeline_id, exc)
        return False
    log.warning("pipeline %s: the lease was not released within %.0fs; the next daemon on this host takes it "
                "over at once (this process will be gone), a daemon elsewhere once it expires (lease.ttl_seconds)",
                lease.pipeline_id, seconds)
    return False


def end_process(code: int, exit: Callable[[int], object] = os._exit) -> None:
    """Flush the log and the standard streams, then end the process with ``code`` at once: other
    libraries' exit hooks and threads are not waited for (see the module docstring). Returns only
    with an ``exit`` that returns (tests)."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 S110 (a closed stream: nothing left to flush)
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 S110
            pass
    exit(code)


def where(thread: threading.Thread | None) -> str:
    """Where ``thread`` is now: the innermost frame's file, line and function (for the guard's line)."""
    frame: FrameType | None = sys._current_frames().get(thread.ident) if thread is not None and thread.ident else None  # noqa: SLF001
    if frame is None:
        return "nowhere (it has ended)"
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


class ExitGuard:
    """Ends the process ``seconds`` after a stop is asked for if it has not ended by then.

    ``stopping`` is polled (a signal's flag, a lost lease); once it is true the guard waits
    ``seconds``, then calls ``abandon`` (which says what did not finish, removes what says the
    daemon runs and returns the exit code) and :func:`end_process`. :meth:`disarm` once the daemon
    has stopped by itself. The thread is a daemon thread: it never keeps the process alive."""

    POLL_SECONDS = 0.2

    def __init__(self, stopping: Callable[[], bool], seconds: float, abandon: Callable[[], int], *,
                 exit: Callable[[int], object] = os._exit) -> None:
        self.stopping = stopping
        self.seconds = seconds
        self.abandon = abandon
        self.exit = exit
        self._disarmed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="exit-guard", daemon=True)

    def start(self) -> "ExitGuard":
        self._thread.start()
        return self

    def disarm(self) -> None:
        self._disarmed.set()

    def _watch(self) -> None:
        while not self.stopping():
            if self._disarmed.wait(self.POLL_SECONDS):
                return
        if self._disarmed.wait(self.seconds):
            return
        try:
            code = self.abandon()
        except BaseException:  # noqa: BLE001 (the exit must happen whatever the clean-up did)
            log.exception("exit guard: the clean-up before the exit failed")
            code = EXIT_DRAIN_INCOMPLETE
        end_process(code, self.exit)
