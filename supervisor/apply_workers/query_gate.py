"""Where a table's always-on query waits for its turn: inside its own batch function.

A turn that starts the table's query and lets it run to its end pays, every turn, for the query's
start and stop, and for the snapshots of the source that Delta builds at every start (each one a
Spark job on a source without ``.crc`` files, which is how delta-rs leaves a table). Instead the
query stays up, and its batch function waits at this gate twice:

- **before applying** a batch, until the table is granted a turn (a batch Spark planned on its
  own, after a turn that found nothing new);
- **after applying** it, until the table's next turn, before returning to Spark. Spark commits
  the batch only then and plans the next one at once, so that batch holds everything committed
  to the source up to the start of the turn, as a query started for the turn would.

A turn that finds nothing new is withdrawn (:meth:`TurnGate.withdraw`); the query then looks for
new commits by itself, at its trigger interval, and its next batch waits before applying. A crash
while a batch waits after applying re-runs that batch at the next start: its transaction id makes
the re-run a replay. :meth:`TurnGate.open` lets every wait go for good, so that a stopping query is
never held in Python.

Plain threading, no Spark: the runner's batch function calls :meth:`TurnGate.pass_batch` on the
stream's thread, and the turn pool's worker calls ``grant``, ``wait_ended`` and ``withdraw``.
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol


class Gate(Protocol):
    """What a turn's worker needs of a table's gate: this module's :class:`TurnGate`, or over Spark
    Connect a gate of files the server's batch function waits at
    (:class:`lakemirror.sinks.merge.connect_gate.FileTurnGate`)."""

    @property
    def ready(self) -> bool: ...
    @property
    def waiting(self) -> bool: ...
    @property
    def held_batch(self) -> int | None: ...
    @property
    def applying(self) -> bool: ...

    def grant(self) -> int: ...
    def wait_ended(self, since: int, timeout: float) -> bool: ...
    def withdraw(self) -> bool: ...
    def open(self) -> None: ...


class TurnGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._granted = False          # a turn is granted and no batch has taken it yet
        self._applying = False         # a batch is being applied in its turn
        self._waiting = False          # a batch waits for a turn before applying
        self._held: int | None = None  # the batch that waits, applied, for the next turn
        self._ended = 0                # batches that have left the gate (applied or failed)
        self._opened = False           # stopping: nothing waits any more

    # -- what the turn pool sees --------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """A turn would be taken at once: a batch waits before applying, or one holds the query."""
        with self._cond:
            return not self._opened and not self._granted and (self._waiting or self._held is not None)

    @property
    def waiting(self) -> bool:
        """A batch Spark already planned waits for its turn (so there is something to apply)."""
        with self._cond:
            return self._waiting

    @property
    def held_batch(self) -> int | None:
        with self._cond:
            return self._held

    @property
    def applying(self) -> bool:
        with self._cond:
            return self._applying

    # -- the turn pool's worker ----------------------------------------------------------------

    def grant(self) -> int:
        """Give the table its turn; returns the count to pass to :meth:`wait_ended`."""
        with self._cond:
            self._granted = True
            self._cond.notify_all()
            return self._ended

    def wait_ended(self, since: int, timeout: float) -> bool:
        """Whether a batch has left the gate since :meth:`grant` returned ``since`` (waits up to
        ``timeout`` seconds for it)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._ended > since, timeout)

    def withdraw(self) -> bool:
        """Take back a turn no batch has begun in; False if a batch took it meanwhile (wait for it)."""
        with self._cond:
            if not self._granted:
                return False
            self._granted = False
            return True

    def open(self) -> None:
        """Let every wait go, now and later: the query is stopping."""
        with self._cond:
            self._opened = True
            self._cond.notify_all()

    # -- the stream's thread (the batch function) ----------------------------------------------

    def pass_batch(self, apply: Callable[[], None], batch_id: int) -> None:
        """Run ``apply`` for batch ``batch_id`` in a turn, then hold the query until the next one.

        A failed ``apply`` ends its turn and is raised at once, without holding the query."""
        self._enter()
        try:
            apply()
        finally:
            self._leave()
        self._hold(batch_id)

    def _enter(self) -> None:
        """Before applying a batch: wait for a turn and take it."""
        with self._cond:
            self._held = None
            self._waiting = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._granted or self._opened)
            self._waiting = False
            self._granted = False
            self._applying = True

    def _leave(self) -> None:
        """The batch is applied, or failed: its turn is over."""
        with self._cond:
            self._applying = False
            self._ended += 1
            self._cond.notify_all()

    def _hold(self, batch_id: int) -> None:
        """After a batch is applied: keep the query here until the table's next turn.

        The grant is left for the batch Spark plans next, which takes it in :meth:`_enter`."""
        with self._cond:
            self._held = batch_id
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._granted or self._opened)
            self._held = None
