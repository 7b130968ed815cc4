"""How the supervisor reports what happens, without knowing about Prometheus.

The daemon implements :class:`Observer` with Prometheus metrics; tests use the recording twin.
Lower layers return results; only the supervisor calls the observer.
"""

from __future__ import annotations

from typing import Protocol

from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.supervisor.change_feed.table_runner import BatchReport
from lakemirror.supervisor.control.lag import CommittedAt, HeldVersion, LagReading
from lakemirror.supervisor.control.table_state import TableStatus


class Observer(Protocol):
    def state_changed(self, table: str, status: TableStatus) -> None: ...
    def batch_applied(self, table: str, report: BatchReport) -> None: ...
    def lag_measured(self, table: str, reading: LagReading, held: HeldVersion | None = None,
                     committed_at: CommittedAt | None = None) -> None:
        """A new reading of ``table``'s lag; ``held``, where given, says which version its replica holds
        at any later moment, so that what is reported later counts the batches applied since, and
        ``committed_at`` whether the source has committed a version since (``as_of``)."""
    def retry_scheduled(self, table: str, status: TableStatus) -> None: ...
    def bootstrap_progressed(self, table: str, progress: BootstrapProgress) -> None: ...


class NoopObserver:
    def state_changed(self, table: str, status: TableStatus) -> None:
        pass

    def batch_applied(self, table: str, report: BatchReport) -> None:
        pass

    def lag_measured(self, table: str, reading: LagReading, held: HeldVersion | None = None,
                     committed_at: CommittedAt | None = None) -> None:
        pass

    def retry_scheduled(self, table: str, status: TableStatus) -> None:
        pass

    def bootstrap_progressed(self, table: str, progress: BootstrapProgress) -> None:
        pass


class Observers:
    """Several observers as one: each event reaches every one of them, in order."""

    def __init__(self, *observers: Observer) -> None:
        self.observers = observers

    def state_changed(self, table: str, status: TableStatus) -> None:
        for o in self.observers:
            o.state_changed(table, status)

    def batch_applied(self, table: str, report: BatchReport) -> None:
        for o in self.observers:
            o.batch_applied(table, report)

    def lag_measured(self, table: str, reading: LagReading, held: HeldVersion | None = None,
                     committed_at: CommittedAt | None = None) -> None:
        for o in self.observers:
            o.lag_measured(table, reading, held, committed_at)

    def retry_scheduled(self, table: str, status: TableStatus) -> None:
        for o in self.observers:
            o.retry_scheduled(table, status)

    def bootstrap_progressed(self, table: str, progress: BootstrapProgress) -> None:
        for o in self.observers:
            o.bootstrap_progressed(table, progress)
