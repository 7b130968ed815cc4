"""When the daemon's scheduled sub-tasks run: a pure scheduler with an injected clock.

Each sub-task has a frozen :class:`TaskPolicy` with one trigger: :class:`Every` (a fixed
interval, first run one interval after the daemon starts) or :class:`DailyAt` (once a day at
``HH:MM`` UTC). :class:`Scheduler` holds what it needs to decide and nothing else: no threads, no
I/O, no clock of its own; the caller passes ``now`` (Unix seconds) to every method.

Rules:

- :meth:`Scheduler.due` returns the tasks whose next run time has come and marks them running;
  a task that is still running is never returned again (no overlap of a task with itself).
- Missed runs collapse: however many run times passed while the task ran or the daemon was
  busy, the task runs once, and its next run time is the first one after ``now``.
- :meth:`Scheduler.finished` records the outcome; :meth:`Scheduler.views` is plain data for
  ``/status`` and metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Iterable, Sequence

SUCCESS = "success"
FAILED = "failed"


@dataclass(frozen=True)
class Every:
    """Run every ``seconds``, on a grid anchored at the daemon's start."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError("an interval must be > 0 seconds")

    def next_after(self, anchor: float, now: float) -> float:
        """The first grid point ``anchor + k * seconds`` (k >= 1) strictly after ``now``."""
        k = max(1, math.floor((now - anchor) / self.seconds) + 1)
        t = anchor + k * self.seconds
        return t if t > now else t + self.seconds

    def describe(self) -> str:
        return f"every {self.seconds:g} s"


@dataclass(frozen=True)
class DailyAt:
    """Run once a day at ``hour:minute`` UTC."""

    hour: int
    minute: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.hour <= 23 and 0 <= self.minute <= 59):
            raise ValueError("a daily time is HH:MM with 00 <= HH <= 23 and 00 <= MM <= 59")

    @classmethod
    def parse(cls, text: str) -> "DailyAt":
        """``"02:30"`` -> ``DailyAt(2, 30)``; raises ValueError for anything else."""
        parts = text.strip().split(":")
        if len(parts) != 2 or not all(p.isdigit() and len(p) == 2 for p in parts):
            raise ValueError(f"{text!r} is not a time of day HH:MM (24-hour, UTC), e.g. '02:30'")
        return cls(int(parts[0]), int(parts[1]))

    def next_after(self, anchor: float, now: float) -> float:
        """The first ``HH:MM`` UTC strictly after ``now`` (``anchor`` is not used)."""
        moment = datetime.fromtimestamp(now, timezone.utc)
        candidate = moment.replace(hour=self.hour, minute=self.minute, second=0, microsecond=0)
        if candidate.timestamp() <= now:
            candidate += timedelta(days=1)
        return candidate.timestamp()

    def describe(self) -> str:
        return f"daily at {self.hour:02d}:{self.minute:02d} UTC"


Trigger = Every | DailyAt


@dataclass(frozen=True)
class TaskPolicy:
    """One scheduled sub-task: its name (unique in the pipeline) and when it runs."""

    name: str
    trigger: Trigger


@dataclass(frozen=True)
class TaskView:
    """What ``/status`` shows of one sub-task (times are Unix seconds)."""

    task: str
    schedule: str
    running: bool
    next_run_at: float | None
    last_started_at: float | None
    last_finished_at: float | None
    last_outcome: str | None        # success | failed | None (never ran)
    last_error: str | None
    last_success_at: float | None
    runs: int


@dataclass(frozen=True)
class _State:
    next_run_at: float
    running: bool = False
    last_started_at: float | None = None
    last_finished_at: float | None = None
    last_outcome: str | None = None
    last_error: str | None = None
    last_success_at: float | None = None
    runs: int = 0


class Scheduler:
    """See the module docstring. Not thread-safe: the owner serialises calls."""

    def __init__(self, policies: Iterable[TaskPolicy], start: float) -> None:
        self.policies = {p.name: p for p in policies}
        self.anchor = start
        self._state = {name: _State(p.trigger.next_after(start, start)) for name, p in self.policies.items()}

    def due(self, now: float) -> list[TaskPolicy]:
        """Tasks to start now, in name order; each is marked running until :meth:`finished`."""
        out = []
        for name in sorted(self._state):
            st = self._state[name]
            if st.running or st.next_run_at > now:
                continue
            trigger = self.policies[name].trigger
            self._state[name] = replace(st, running=True, last_started_at=now,
                                        next_run_at=trigger.next_after(self.anchor, now))
            out.append(self.policies[name])
        return out

    def finished(self, name: str, now: float, *, ok: bool, error: str | None = None) -> None:
        st = self._state[name]
        self._state[name] = replace(st, running=False, last_finished_at=now, runs=st.runs + 1,
                                    last_outcome=SUCCESS if ok else FAILED, last_error=None if ok else error,
                                    last_success_at=now if ok else st.last_success_at)

    def next_wakeup(self) -> float | None:
        """The earliest next run time of a task that is not running (None: nothing to wait for)."""
        times = [st.next_run_at for st in self._state.values() if not st.running]
        return min(times) if times else None

    def views(self, names: Sequence[str] | None = None) -> list[TaskView]:
        out = []
        for name in sorted(names if names is not None else self._state):
            st = self._state[name]
            out.append(TaskView(task=name, schedule=self.policies[name].trigger.describe(), running=st.running,
                                next_run_at=st.next_run_at, last_started_at=st.last_started_at,
                                last_finished_at=st.last_finished_at, last_outcome=st.last_outcome,
                                last_error=st.last_error, last_success_at=st.last_success_at, runs=st.runs))
        return out
