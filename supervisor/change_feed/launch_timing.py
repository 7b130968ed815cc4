"""Where a table's launch spends its time, step by step, for the log line its runner writes once the
table streams: a restart's lag grows until each table applies its first batch, and the line says
whether the source's description, the bootstrap, the replica's schema or the stream's start held it.

Pure: the clock is injected; :class:`LaunchTimer` only records and words what it was told.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class LaunchTimer:
    """Marks the end of each step of one launch; :meth:`describe` words them."""

    clock: Callable[[], float] = time.monotonic
    steps: list[tuple[str, float]] = field(default_factory=list)
    started: float = field(init=False)
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self._last = self.clock()

    def mark(self, step: str) -> None:
        """The step ``step`` ended now (it began where the previous one ended)."""
        now = self.clock()
        self.steps.append((step, now - self._last))
        self._last = now

    @property
    def last_mark(self) -> float:
        """When the latest step ended (the launch's start before any)."""
        return self._last

    def describe(self) -> str:
        """``"2.4s (describe 1.2s, replica 0.9s, stream 0.3s)"``: the total, then each step."""
        total = self._last - self.started
        parts = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in self.steps)
        return f"{total:.1f}s ({parts})" if parts else f"{total:.1f}s"


def first_batch_line(label: str, batch_id: int, *, launch_began: float, stream_started: float | None,
                     apply_began: float, ended: float) -> str:
    """The log line of a launch's first batch: how long after the launch began it was applied, and
    how that splits into waiting for the batch (Spark's plan of it and its turn) and applying it.
    Times are on one clock (the batch's own, wall-clock seconds)."""
    waited = "" if stream_started is None else f"; {max(0.0, apply_began - stream_started):.1f}s from the stream's start to the apply"
    return (f"table {label}: first batch {batch_id} applied {max(0.0, ended - launch_began):.1f}s after the launch "
            f"began{waited}, the apply {max(0.0, ended - apply_began):.1f}s")
