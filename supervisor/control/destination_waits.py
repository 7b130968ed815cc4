"""A replica's waits on its destination, as the state machine's events.

A table whose work waits on its destination (a PostgreSQL server that does not answer, a lock
another session holds: :mod:`lakemirror.sinks.postgres.waits`) is not failing, and its work goes
on by itself once the wait ends; but it is not running either, and its lag grows. The runner asks
:meth:`WaitReport.check` at each poll: a wait shows as :class:`~.table_state.Waiting` (``degraded``, with
the wait's reason as the table's error, no retry scheduled), its end as :class:`~.table_state.WaitOver`.
"""

from __future__ import annotations

from typing import Callable, Protocol

from lakemirror.sinks.waits import LockWait, ServerWait
from lakemirror.supervisor.control import table_state as sm


class Waits(Protocol):
    def wait(self, look_up: Callable[[int], LockWait | None] | None = None) -> ServerWait | None: ...


class WaitReport:
    """Reports the waits of one replica's calls (``calls``) through ``emit``, each change once."""

    def __init__(self, calls: Waits, emit: Callable[[sm.Event], None],
                 look_up: Callable[[int], LockWait | None] | None = None) -> None:
        self.calls = calls
        self.emit = emit
        self.look_up = look_up
        self.reported: ServerWait | None = None

    def check(self) -> ServerWait | None:
        """Emit :class:`~.table_state.Waiting` for a new or changed wait, :class:`~.table_state.WaitOver` when
        it has ended; the wait now (None: none)."""
        wait = self.calls.wait(self.look_up)
        if wait is not None and (self.reported is None or wait.reason != self.reported.reason):
            self.emit(sm.Waiting(wait.reason, wait.code))
        elif wait is None and self.reported is not None:
            self.emit(sm.WaitOver())
        self.reported = wait
        return wait
