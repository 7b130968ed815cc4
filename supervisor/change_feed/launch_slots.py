"""How many tables launch at once: their description, replica checks and stream start.

Every table's launch does Spark work on the one driver. Launched all at once, 16 tables on the
2-core machine each got a sixteenth of it: every stream started at about the same moment, when the
last launch ended (145-150 s into a restart), and only then did the first batches begin, one turn
after another (``make bench ONLY=startup``). A few at a time, a table streams as soon as its own
launch is done, and the first tables' batches are applied while the others still launch.

A bootstrap gives its slot back while it copies (its chunks have slots of their own,
``bootstrap.parallel_chunks``): a long copy never holds the other tables' launches back.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator


def default_launch_slots(cores: int | None = None) -> int:
    """Launches at once by default: two per core of the driver, at least four (a launch also waits
    for the file system or the object store)."""
    return max(4, 2 * (cores if cores is not None else (os.cpu_count() or 1)))


class LaunchSlots:
    """At most ``slots`` launches hold a slot at once."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("launches need at least one slot")
        self.slots = slots
        self._semaphore = threading.BoundedSemaphore(slots)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold a slot for the block (waiting for one to be free)."""
        self._semaphore.acquire()
        try:
            yield
        finally:
            self._semaphore.release()

    @contextmanager
    def given_back(self) -> Iterator[None]:
        """Inside :meth:`held`: give the slot back for the block, and wait for one again after it."""
        self._semaphore.release()
        try:
            yield
        finally:
            self._semaphore.acquire()
