"""The daemon's scheduled sub-tasks: starts due batch runs on worker threads, never blocking.

:class:`SubtaskService` is driven by the daemon's main loop: :meth:`SubtaskService.tick` asks the
pure :class:`~lakemirror.supervisor.subtasks.scheduler.Scheduler` which sub-tasks are due and starts each
on a worker thread of its own, so a reconciliation that takes an hour never delays the streaming
supervisor's tick. A run is one :class:`~lakemirror.supervisor.subtasks.batch_runner.BatchRunner` run (the
``lakemirror replicate`` machinery: retries, timeouts, one audit row per attempt), built by the
composition root's ``run`` function. Outcomes go back to the scheduler (last run, last outcome)
and to an :class:`SubtaskObserver` (the daemon's metrics).

Lifecycle: ``tick()`` from one thread; ``views()`` from any; ``shutdown(timeout)`` waits for the
runs in flight (their threads are daemon threads: a forced exit does not wait for them).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from lakemirror.secrets import redact
from lakemirror.sinks.batch.reconcile_plan import ReconcileResult
from lakemirror.supervisor.subtasks.batch_runner import RunSummary, TableJob, TaskSettings
from lakemirror.supervisor.subtasks.scheduler import Scheduler, TaskPolicy, TaskView, Trigger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Subtask:
    """A scheduled sub-task: when, which operations, which tables (None: the pipeline's)."""

    name: str
    trigger: Trigger
    settings: TaskSettings                  # operations, timeout, retries, per-operation options
    tables: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SubtaskRun:
    """What one run of a sub-task produced."""

    summary: RunSummary
    reconciled: Mapping[str, ReconcileResult] = field(default_factory=dict)  # by source table name


class SubtaskObserver(Protocol):
    def subtask_scheduled(self, task: str, next_run_at: float | None) -> None: ...
    def subtask_finished(self, task: str, ok: bool, finished_at: float, next_run_at: float | None) -> None: ...
    def reconcile_measured(self, table: str, samples: Mapping[str, int]) -> None: ...


class NoopSubtaskObserver:
    def subtask_scheduled(self, task: str, next_run_at: float | None) -> None:
        pass

    def subtask_finished(self, task: str, ok: bool, finished_at: float, next_run_at: float | None) -> None:
        pass

    def reconcile_measured(self, table: str, samples: Mapping[str, int]) -> None:
        pass


#: (run id, jobs) -> the run's outcome; the composition root builds it on the real operations.
RunFn = Callable[[str, Sequence[TableJob]], SubtaskRun]
#: (sub-task) -> its table jobs now (the pipeline's tables when the sub-task names none).
JobsFn = Callable[[Subtask], list[TableJob]]


def _daemon_thread(target: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


class SubtaskService:
    def __init__(self, subtasks: Sequence[Subtask], *, jobs: JobsFn, run: RunFn,
                 observer: SubtaskObserver | None = None, clock: Callable[[], float] = time.time,
                 new_run_id: Callable[[], str] = lambda: uuid.uuid4().hex,
                 spawn: Callable[[Callable[[], None], str], threading.Thread] = _daemon_thread,
                 on_run: Callable[[Subtask, SubtaskRun], None] | None = None) -> None:
        self.subtasks = {s.name: s for s in subtasks}
        self._jobs, self._run = jobs, run
        #: Told of each run's result (its per-table outcomes), e.g. for the cycled tables' status.
        self.on_run = on_run
        self.observer = observer or NoopSubtaskObserver()
        self.clock = clock
        self.new_run_id = new_run_id
        self.spawn = spawn
        self._lock = threading.Lock()
        self.scheduler = Scheduler([TaskPolicy(s.name, s.trigger) for s in subtasks], start=clock())
        self._threads: dict[str, threading.Thread] = {}
        self._closing = False
        for view in self.scheduler.views():
            self.observer.subtask_scheduled(view.task, view.next_run_at)

    def tick(self) -> None:
        """Start every due sub-task on its own worker thread; returns at once."""
        with self._lock:
            if self._closing:
                return
            due = self.scheduler.due(self.clock())
            views = {v.task: v for v in self.scheduler.views([p.name for p in due])}
        for policy in due:
            task = self.subtasks[policy.name]
            self.observer.subtask_scheduled(task.name, views[task.name].next_run_at)
            run_id = self.new_run_id()
            log.info("sub-task %s: run %s started (%s)", task.name, run_id, ", ".join(task.settings.operations))
            self._threads[task.name] = self.spawn(self._job(task, run_id), f"subtask:{task.name}"[:60])

    def _job(self, task: Subtask, run_id: str) -> Callable[[], None]:
        return lambda: self._execute(task, run_id)

    def _execute(self, task: Subtask, run_id: str) -> None:
        error: str | None = None
        try:
            result = self._run(run_id, self._jobs(task))
            if self.on_run is not None:
                self.on_run(task, result)
            for table, rec in result.reconciled.items():
                self.observer.reconcile_measured(table, rec.metric_samples())
            failed = result.summary.failed
            if failed:
                first = failed[0]
                error = (f"{len(failed)} of {len(result.summary.outcomes)} operations failed; first: "
                         f"{first.operation} {first.job.source}: {first.error}")
        except Exception as exc:  # noqa: BLE001 — planning failed (e.g. listing tables): a failed run
            error = f"{type(exc).__name__}: {exc}"
        ok = error is None
        now = self.clock()
        with self._lock:
            self.scheduler.finished(task.name, now, ok=ok, error=redact(error) if error else None)
            [view] = self.scheduler.views([task.name])
        log.log(logging.INFO if ok else logging.WARNING, "sub-task %s: run %s %s%s", task.name, run_id,
                "succeeded" if ok else "failed", f": {error}" if error else "")
        self.observer.subtask_finished(task.name, ok, now, view.next_run_at)

    def views(self) -> list[TaskView]:
        with self._lock:
            return self.scheduler.views()

    def status(self) -> list[dict[str, object]]:
        """The ``subtasks`` section of ``/status``."""
        out: list[dict[str, object]] = []
        for v in self.views():
            task = self.subtasks[v.task]
            out.append({**v.__dict__, "operations": list(task.settings.operations),
                        "tables": None if task.tables is None else list(task.tables)})
        return out

    def shutdown(self, timeout_seconds: float = 60.0) -> list[str]:
        """Start nothing new; wait up to ``timeout_seconds`` in all for the runs in flight. Returns
        the sub-tasks still running then: they are abandoned (daemon threads), their next run does
        their work again."""
        with self._lock:
            self._closing = True
        deadline = time.monotonic() + timeout_seconds
        running = []
        for name, thread in list(self._threads.items()):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                running.append(name)
        return running
