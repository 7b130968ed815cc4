"""The guarded event sink over Delta replicas: the event sink of the destination kind ``delta``.

Each table's replica is a Delta table (``locate(table)``) written by a
:class:`~lakemirror.sinks.events.guard_merge.GuardedDeltaSink` (current rows) or a
:class:`~lakemirror.sinks.events.history_merge.HistoryDeltaSink` (``history: scd2``), and the dead
letters go to a Delta table of their own (:class:`~lakemirror.sinks.events.dead_letters.DeadLetterTable`),
each in a Spark session of its own (:class:`SessionPerName`), under the
:class:`~lakemirror.sinks.events.guarded_sink.EventBatchApplier` that routes, folds and isolates.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from lakemirror.sinks.events.dead_letters import DeadLetterTable
from lakemirror.sinks.events.guard_merge import GuardedDeltaSink
from lakemirror.sinks.events.guarded_sink import EventBatchApplier, GuardedSinkSpec, GuardedTableWriter
from lakemirror.sinks.events.history_merge import HistoryDeltaSink
from lakemirror.sinks.events.history_plan import HISTORY_SCD2
from lakemirror.sources.change_event import Decoded
from lakemirror.sources.event_stream import RawEvent
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SessionPerName:
    """A Spark session of its own for each replica (and the dead letters), made on first use: a
    session's Delta transaction confs never race between replicas written side by side."""

    def __init__(self, spark: "SparkSession") -> None:
        self.spark = spark
        self._sessions: dict[str, "SparkSession"] = {}

    def __call__(self, name: str) -> "SparkSession":
        if name not in self._sessions:
            self._sessions[name] = self.spark.newSession()
        return self._sessions[name]


def delta_replicas(locate: Callable[[str], TableLocation], spec: GuardedSinkSpec,
                   clock: Callable[[], float] = time.time,
                   fault: Callable[[str], None] = lambda point: None) -> Callable[[str], GuardedTableWriter]:
    """Each table's writer into its Delta replica at ``locate(table)``: current rows, or every
    version of them (``history: scd2``). ``locate`` raises ValueError for a name the destination
    cannot hold."""
    def replica(table: str) -> GuardedTableWriter:
        kind = HistoryDeltaSink if spec.history == HISTORY_SCD2 else GuardedDeltaSink
        return kind(locate(table), spec.allow_schema_evolution, clock=clock, fault=fault,
                    driver_apply=spec.driver_apply)
    return replica


def delta_event_sink(spec: GuardedSinkSpec, decoder: Callable[[RawEvent], Decoded], pipeline_id: str,
                     spark: "SparkSession", locate: Callable[[str], TableLocation], dead_letters: TableLocation,
                     clock: Callable[[], float] = time.time, fault: Callable[[str], None] = lambda point: None,
                     on_prepare: Callable[[], None] = lambda: None) -> EventBatchApplier:
    """The guarded event sink over Delta replicas (``locate(table)``) and the dead-letter Delta table
    ``dead_letters``, each written in a Spark session of its own: the destination kind ``delta``."""
    return EventBatchApplier(spec, decoder, pipeline_id, delta_replicas(locate, spec, clock, fault),
                             DeadLetterTable(dead_letters), SessionPerName(spark), clock, fault, on_prepare)
