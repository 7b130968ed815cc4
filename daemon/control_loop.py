"""The daemon's control loop, on a thread of its own (:meth:`lakemirror.daemon.context.DaemonContext.run`).

Every half second it ticks every pipeline (:meth:`~lakemirror.daemon.pipelines.PipelineRegistry.tick_all`)
and the scheduled sub-tasks. The thread that started the daemon only waits for the stop
(:meth:`ControlLoop.wait`), so the stop is seen at once and the drain runs under its deadline even
while a tick is stuck in a call to a server that is gone (over Spark Connect, a query's
``isActive`` is a request its client retries for minutes): that tick holds its pipeline's lock, and
the drain reports the pipeline's tables as not stopped (:mod:`lakemirror.daemon.drain`).

Lifecycle: the loop starts when built; :meth:`ControlLoop.stop` ends it after the tick in progress;
an exception of a tick ends it too and is raised by :meth:`ControlLoop.raise_failure` once the
daemon has drained. The thread is a daemon thread: a stuck tick never keeps the process alive.
"""

from __future__ import annotations

import threading
from typing import Callable

from lakemirror.daemon.pipelines import PipelineRegistry
from lakemirror.supervisor.subtasks.service import SubtaskService


class ControlLoop:
    """Ticks until ``stopping`` says so or :meth:`stop` is called (see the module docstring)."""

    def __init__(self, pipelines: PipelineRegistry, subtasks: SubtaskService, stopping: Callable[[], bool],
                 on_tick: Callable[[], None] | None) -> None:
        self.pipelines, self.subtasks, self.stopping, self.on_tick = pipelines, subtasks, stopping, on_tick
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="control", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and not self.stopping():
                self.pipelines.tick_all()
                self.subtasks.tick()  # starts due sub-tasks on their own threads; never blocks
                if self.on_tick is not None:
                    self.on_tick()
                self._stop.wait(0.5)
        except BaseException as exc:  # noqa: BLE001 (raised by run() once the daemon has drained)
            self.failure = exc
            self._stop.set()

    def wait(self) -> None:
        """Return once a stop is asked for or the loop has failed."""
        while not self._stop.wait(0.1):
            if self.stopping():
                return

    def stop(self) -> None:
        self._stop.set()

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure
