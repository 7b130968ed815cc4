"""The one thread that runs the control API's Spark work, so that HTTP threads never call Spark.

An HTTP handler that needs Spark (start a pipeline, stop one, describe a schema's tables) hands a
callable to :meth:`CommandWorker.call` and waits for it at most ``timeout`` seconds; on timeout it
answers 504 while the command finishes on the worker (a command that has not started yet is
cancelled instead). Commands run one at a time, in the order they were queued.

Lifecycle: ``start`` is implicit (the thread starts with the first command); ``close(wait)``
refuses new commands, cancels the queued ones and, with ``wait``, joins the running one.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from typing import Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WorkerTimeout(Exception):
    """The command did not finish in time; it keeps running on the worker unless it had not started."""

    def __init__(self, what: str, timeout: float, started: bool) -> None:
        self.what = what
        self.timeout = timeout
        self.started = started
        state = "still running on the worker" if started else "cancelled before it started"
        super().__init__(f"{what} did not finish within {timeout:.0f}s ({state})")


class WorkerClosed(Exception):
    """The daemon is shutting down and accepts no more commands."""


class CommandWorker:
    def __init__(self, name: str = "api-worker") -> None:
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._closed = False

    def submit(self, what: str, fn: Callable[[], T]) -> "cf.Future[T]":
        if self._closed:
            raise WorkerClosed(f"{what}: the daemon is shutting down")

        def run() -> T:
            log.debug("worker: %s", what)
            return fn()

        try:
            return self._pool.submit(run)
        except RuntimeError as exc:  # the pool was shut down between the check and the submit
            raise WorkerClosed(f"{what}: the daemon is shutting down") from exc

    def call(self, what: str, fn: Callable[[], T], timeout: float) -> T:
        """Run ``fn`` on the worker and return its result; its exception is raised here."""
        future = self.submit(what, fn)
        try:
            return future.result(timeout)
        except cf.TimeoutError:
            if future.done():  # fn itself raised a TimeoutError: that is its answer, not ours
                raise
            started = not future.cancel()
            raise WorkerTimeout(what, timeout, started) from None

    def close(self, wait: bool = True) -> None:
        self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=True)
