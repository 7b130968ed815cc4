"""Triggered and snapshot PostgreSQL replicas as tables of ``/status``.

Those tables have no stream, so the supervisor does not know them; their cycles run as sub-tasks
(:mod:`lakemirror.sinks.postgres.cycles`, :mod:`.service`), whose status is per sub-task. :class:`CycleTables` keeps each
table's last cycle (from every sub-task run) and answers a :class:`~..control.loop.TableView` per
table, beside the streamed tables':

- ``running`` once a cycle has brought the replica up (in this process, or before it: the
  pipeline's state says which version the replica holds); ``starting`` before its first cycle;
- ``degraded`` when its last cycle failed (the error is the cycle's; the next cycle retries it), or
  while its cycle waits on the server (an outage, a lock: the wait's reason, as a streamed table's);
- ``applied_through``: the source version the replica holds; ``rows_applied`` / ``batches``: rows
  and cycles in this process; ``detail``: the mode, the next cycle and what the last one did.

Lag is not measured for these tables (it would read the source between cycles): ``None``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from lakemirror.checkpoints.audit import SUCCESS
from lakemirror.sinks.waits import ServerWait
from lakemirror.supervisor.control.loop import TableView
from lakemirror.supervisor.subtasks.service import Subtask, SubtaskRun


@dataclass
class _Cycles:
    mode: str
    task: str
    last_at: float | None = None
    ok: bool | None = None
    error: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    failures: int = 0
    cycles: int = 0
    rows: int = 0
    version: int | None = None
    last_ok_at: float | None = None


class CycleTables:
    """See the module docstring. ``tables``: the cycled tables known from the configuration, with
    their mode; ``tasks``: each mode's sub-task name; ``next_run``: a sub-task's next run;
    ``holds``: the source version a table's replica holds by the pipeline's state (None: none)."""

    def __init__(self, tables: Mapping[str, str], tasks: Mapping[str, str], *,
                 next_run: Callable[[str], float | None], holds: Callable[[str], int | None],
                 waits: Callable[[str], ServerWait | None] = lambda table: None,
                 clock: Callable[[], float] = time.time) -> None:
        self._modes = {task: mode for mode, task in tasks.items()}
        self._waits = waits
        self._next_run = next_run
        self._holds = holds
        self._clock = clock
        self._lock = threading.Lock()
        self._tables = {t: _Cycles(mode, tasks[mode]) for t, mode in tables.items() if mode in tasks}
        self._held: dict[str, int | None] = {}

    def record_run(self, task: Subtask, run: SubtaskRun) -> None:
        """What one run of a sub-task did to each of its tables (a cycle sub-task's; others are not
        this view's)."""
        mode = self._modes.get(task.name)
        if mode is None:
            return
        now = self._clock()
        with self._lock:
            for o in run.summary.outcomes:
                name = o.job.source.table
                t = self._tables.setdefault(name, _Cycles(mode, task.name))
                t.last_at, t.ok, t.details = now, o.status == SUCCESS, dict(o.details)
                t.cycles += 1
                if t.ok:
                    t.failures, t.error, t.last_ok_at = 0, None, now
                    d = o.details
                    t.rows += sum(int(d.get(k) or 0) for k in ("rows_loaded", "rows_inserted", "rows_updated",
                                                               "rows_deleted"))
                    if d.get("version") is not None:
                        t.version = int(d["version"])
                else:
                    t.failures, t.error = t.failures + 1, o.error

    def views(self) -> list[TableView]:
        with self._lock:
            tables = {name: _Cycles(**t.__dict__) for name, t in self._tables.items()}
        out = []
        for name, t in sorted(tables.items()):
            held = t.version if t.version is not None else self._held_version(name)
            wait = self._wait(name)
            error = t.error
            if wait is not None:
                state, error = "degraded", wait.reason
            elif t.ok is False:
                state = "degraded"
            else:
                state = "running" if held is not None else "starting"
            next_at = self._next_run(t.task)
            out.append(TableView(
                table=name, state=state, lag_seconds=None, versions_behind=None, applied_through=held,
                rows_applied=t.rows, batches=t.cycles if t.ok is not None else 0, failures=t.failures, retries=0,
                next_retry_at=next_at if t.ok is False and wait is None else None, last_error=error,
                last_batch_at=t.last_ok_at,
                detail={"mode": t.mode, "sub_task": t.task, "next_cycle_at": next_at,
                        "last_cycle": dict(t.details) or None}))
        return out

    def _wait(self, table: str) -> ServerWait | None:
        try:
            return self._waits(table)
        except Exception:  # noqa: BLE001 (a view must never fail)
            return None

    def _held_version(self, table: str) -> int | None:
        if table not in self._held:  # read once: cycles report their version afterwards
            try:
                self._held[table] = self._holds(table)
            except Exception:  # noqa: BLE001 (unknown: the table shows starting until its first cycle)
                return None
        return self._held[table]
