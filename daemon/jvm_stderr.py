"""The JVM's standard error, passed through without PySpark's tracebacks of Python workers stopped
mid-task.

Real-Time Mode's ``foreach`` writer runs in Python workers that Spark forks from its worker daemon.
Stopping a real-time query (a drain at SIGTERM, a restart) interrupts the tasks those workers
serve; Spark then closes each worker's socket before the end-of-stream mark the worker waits for,
and PySpark's daemon prints the worker's ``EOFError`` with its whole traceback, on the JVM's
standard error (which Spark copies the Python daemon's output to). Nothing failed: the batch is
replayed from its offsets at the next start, exactly (docs/postgres.md, "Real-Time Mode").

:class:`WorkerStopFilter` reads the JVM's standard error line by line and writes everything on,
except such a traceback: one that ends in a bare ``EOFError`` raised in PySpark's worker protocol
(its frames in ``pyspark/daemon.py`` or ``pyspark/worker.py``). Each one left out is counted and
logged at DEBUG. Any other traceback, and every other line, passes unchanged and in order.
"""

from __future__ import annotations

import logging
import threading
from typing import IO, Callable, Iterable

log = logging.getLogger(__name__)

_TRACEBACK = "Traceback (most recent call last):"
_WORKER_FRAMES = ("pyspark/daemon.py", "pyspark/worker.py")


class WorkerStopFilter:
    """Feed it lines (with their line ends); ``write`` gets every line to keep, in order."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.left_out = 0
        self._block: list[str] = []

    def feed(self, line: str) -> None:
        if self._block:
            self._block.append(line)
            if line.strip() and not line[:1].isspace() and not line.startswith(_TRACEBACK):
                self._end_block(line)  # the exception line: the traceback is complete
            return
        if line.startswith(_TRACEBACK):
            self._block = [line]
            return
        self.write(line)

    def close(self) -> None:
        """Write out a traceback left incomplete (the stream ended inside it)."""
        block, self._block = self._block, []
        for line in block:
            self.write(line)

    def _end_block(self, last: str) -> None:
        block, self._block = self._block, []
        if last.strip() == "EOFError" and any(frame in line for line in block for frame in _WORKER_FRAMES):
            self.left_out += 1
            log.debug("a Spark Python worker was stopped mid-task (its query stopped); its EOFError is not shown")
            return
        for line in block:
            self.write(line)


def pump(lines: Iterable[bytes], out: IO[str]) -> WorkerStopFilter:
    """Pass ``lines`` (the JVM's standard error) to ``out`` through a :class:`WorkerStopFilter` on a
    daemon thread, until they end."""
    def write(text: str) -> None:
        out.write(text)
        out.flush()

    keep = WorkerStopFilter(write)

    def run() -> None:
        try:
            for raw in lines:
                keep.feed(raw.decode("utf-8", errors="replace"))
        except (OSError, ValueError) as exc:  # the pipe closed under us: the JVM is gone
            log.debug("the JVM's standard error ended: %s", exc)
        finally:
            keep.close()

    threading.Thread(target=run, name="jvm-stderr", daemon=True).start()
    return keep
