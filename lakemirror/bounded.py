"""Calls that may block for good, made on threads of their own so that the caller waits at most
until a deadline.

What blocks for good at a stop is another system's client waiting on a server that is gone: a
Spark query's ``stop()`` over a Spark Connect server that went away (its client retries every call
for ten minutes and more), a PostgreSQL or Kafka client on a dead connection, a JVM that does not
answer. A call still running at the deadline is abandoned: its thread is a daemon thread, so it
never keeps the process alive, and the caller goes on. Use these only where abandoning the call
leaves what a process killed at that moment would leave, which every write of lakemirror survives
(its batches are idempotent and replayed at the next start).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Generic, Mapping, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Call(Generic[T]):
    """One call on a daemon thread: its result or exception once it returns."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name[:60], daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller)
            self.error = exc
        finally:
            self.done.set()


def call_within(fn: Callable[[], object], timeout: float, name: str) -> bool:
    """Call ``fn`` and wait at most ``timeout`` seconds for it: True once it has returned (its
    exception, if it raised one, is raised here), False when it is still running at the deadline
    (it is left to finish, or not, on its own daemon thread). ``name`` names the thread."""
    call = _Call(fn, name)
    if not call.done.wait(max(0.0, timeout)):
        return False
    if call.error is not None:
        raise call.error
    return True


def all_within(calls: Mapping[str, Callable[[], object]], timeout: float, prefix: str = "call") -> list[str]:
    """Start every call at once, each on a thread of its own, and wait at most ``timeout`` seconds
    in all; return the names of those still running then (in the mapping's order). A call that
    raised is finished: its exception is logged with its name, the others go on."""
    deadline = time.monotonic() + max(0.0, timeout)
    started = {name: _Call(fn, f"{prefix}:{name}") for name, fn in calls.items()}
    running = []
    for name, call in started.items():
        if not call.done.wait(max(0.0, deadline - time.monotonic())):
            running.append(name)
        elif call.error is not None:
            log.error("%s %s failed: %s: %s", prefix, name, type(call.error).__name__, call.error,
                      exc_info=call.error)
    return running
