"""Group commit: rows handed in by many threads at once are written in one call.

Every table's stream appends a checkpoint row after each batch, and each append is a Delta commit
whose cost barely depends on how many rows it carries. With N tables landing batches at the same
time, one commit carrying all of their rows replaces N. No background thread: the first caller to
find no write in progress writes everything queued (its own row included); callers arriving
meanwhile wait, and the next of them writes what queued up during that write. ``submit`` returns
only when the caller's item is written (or raises the error of the write that carried it), so a
caller may rely on its row being durable exactly as with a direct append. Pure: no Spark.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Ticket(Generic[T]):
    item: T
    done: bool = False
    error: BaseException | None = None


class GroupCommit(Generic[T]):
    def __init__(self, write: Callable[[list[T]], None]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._queue: list[_Ticket[T]] = []
        self._writing = False
        #: Sizes of the groups written so far (observability and tests).
        self.group_sizes: list[int] = []

    def submit(self, item: T) -> None:
        self.submit_all([item])

    def submit_all(self, items: list[T]) -> None:
        """Submit ``items`` together: they are written in one call (with whatever else is queued)."""
        tickets = [_Ticket(item) for item in items]
        if not tickets:
            return
        ticket = tickets[-1]
        with self._cond:
            self._queue.extend(tickets)
            while self._writing and not ticket.done:
                self._cond.wait()
            if ticket.done:
                if ticket.error is not None:
                    raise ticket.error
                return
            self._writing = True
            group, self._queue = self._queue, []
        error: BaseException | None = None
        try:
            self._write([t.item for t in group])
        except BaseException as exc:  # noqa: BLE001 (handed to every caller of the group)
            error = exc
        with self._cond:
            for t in group:
                t.done, t.error = True, error
            self.group_sizes.append(len(group))
            self._writing = False
            self._cond.notify_all()
        if error is not None:
            raise error
