"""Where an event source's changes go, as the event runner sees it: the :class:`EventSink` protocol.

An event source (Kafka topics, JSON-lines files) carries the changes of many tables in one stream;
its runner (:class:`lakemirror.supervisor.events.stream_runner.EventStreamRunner`, one for every destination)
decodes each micro-batch into the change contract and hands it to the source's event sink, which
keeps one replica per table in one destination. The runner asks it, in this order:
:meth:`EventSink.prepare` each time the source's query starts, :meth:`EventSink.apply` for each
decoded batch under the batch's :class:`EventTxn`, :meth:`EventSink.letters` and
:meth:`EventSink.resolve_letters` for the operator's view of the dead letters (between two batches),
:meth:`EventSink.wait` at each poll, and :meth:`EventSink.close` when the source halts. A sink whose
writes run on the executors, inside the query (PostgreSQL's Real-Time Mode), says so with
:attr:`EventSink.executor_writes`: the runner then wires the query through it and applies nothing
on the driver.

Exactly once, whatever the destination: a batch replayed after a crash comes again with the same
:class:`EventTxn`, and every write a sink makes is either skipped by its transaction id (Delta) or
a no-op under the sequence guard (every destination: a change writes a row only if it is newer).

Implementations: the guarded event sink over Delta replicas
(:class:`lakemirror.sinks.events.guarded_sink.EventBatchApplier` with
:class:`lakemirror.sinks.events.guard_merge.GuardedDeltaSink` per table and the dead-letter Delta
table), the same sink over in-memory replicas (:func:`lakemirror.sinks.events.memory_sink.memory_event_sink`
over a :class:`~lakemirror.sinks.events.memory_sink.MemoryEventStore`: the twin unit tests use) and PostgreSQL's
(:class:`lakemirror.sinks.postgres.event_replicas.PostgresEventReplicas`). Which one a pipeline
takes is chosen once, by its destination's kind, in :mod:`lakemirror.daemon.destinations`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from lakemirror.sinks.events.dead_letters import DeadLetterRow, LetterReport, StoredLetter
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.waits import ServerWait
from lakemirror.sources.event_stream import DecodedBatch

if TYPE_CHECKING:
    from lakemirror.sources.event_source import EventSource


@dataclass(frozen=True)
class EventTxn:
    """A batch's transaction id: the epoch of the source's query checkpoint and the batch id.

    A sink derives each of its writes' ids from it (for a Delta replica the app id
    ``<prefix>/<table>/<epoch>`` with ``batch_id`` as the version), so a batch replayed after a
    crash repeats the same writes under the same ids. The epoch is renewed whenever the query's
    checkpoint starts empty, so batch ids counted from 0 again never pass for replays."""

    epoch: str
    batch_id: int


@dataclass(frozen=True)
class ReplicaBatch:
    """What one batch did to one replica (for metrics and status): rows by operation, guard drops,
    event-time lags, and what the batch said about its positions."""

    inserted: int
    updated: int
    deleted: int
    stale: int
    event_lags_seconds: tuple[float, ...]   # per change with a source ts_ms: replica commit time minus ts_ms
    replayed: bool = False                  # the write was skipped: committed before (a replayed batch)
    position_basis: str = ""                # what the changes' order is read from (the newest change's basis)
    last_ts_ms: int | None = None           # the newest source commit time among the changes applied


@dataclass(frozen=True)
class EventBatchResult:
    """What a sink did with one decoded batch."""

    events: int                                   # raw events read
    skipped: int                                  # tombstones, markers, tables not replicated
    dead_letters: int                             # letters this batch recorded (new or not)
    outcomes: Mapping[str, Any]                   # per table: the sink's own account of its write
    replicas: dict[str, ReplicaBatch] = field(default_factory=dict)
    letters: tuple[DeadLetterRow, ...] = ()       # the letters themselves (the runner counts the new ones)
    counts: ApplyCounts = field(default_factory=ApplyCounts)
    replayed: bool = False                        # every replica's write was skipped as already committed
    read: str | None = None                       # the apply path, for the batch's report (None: the default)
    write: str | None = None
    flush_seconds: tuple[float, ...] = ()         # the destination's commit times (where it measures them)


@dataclass(frozen=True)
class ExecutorBatch:
    """A batch the executors' writers finished, as the query's progress tells it."""

    batch_id: int
    rows: int
    duration_seconds: float
    read: str
    write: str
    processing_ms: float | None = None
    source_queuing_ms: float | None = None
    e2e_ms: float | None = None
    flush_seconds: tuple[float, ...] = ()


class LettersNotResolvable(Exception):
    """The operator's skip or replay is not offered for this destination's dead letters (the message
    says where they are kept)."""


class ExecutorWrites(Protocol):
    """Writes that run on the executors, inside the source's query (a ``foreach`` writer), instead of
    a batch function on the driver. Lifecycle, each launch: :meth:`check` before the query is made,
    :meth:`start` wires it and :meth:`started` follows its start; :meth:`finished` at each poll;
    :meth:`stopped` when it halts."""

    def check(self, source: "EventSource[Any]") -> None:
        """Refuse (a clear error naming the fix) a source these writers cannot take as it is now."""
        ...

    def start(self, spark: Any, writer: Any, source: "EventSource[Any]") -> Any:
        """``writer`` (the query's DataStreamWriter, its checkpoint set) with the executors' writer
        and trigger."""
        ...

    def started(self) -> None: ...

    def finished(self, progress: Any) -> ExecutorBatch | None:
        """The batch ``progress`` (the query's last progress) reports finished, once; else None."""
        ...

    def stopped(self) -> None: ...


class EventSink(Protocol):
    """An event source's replicas in one destination, driven by the event runner (see the module
    docstring). Not thread-safe: the runner calls :meth:`apply` and :meth:`resolve_letters` under
    one lock, one at a time."""

    @property
    def executor_writes(self) -> ExecutorWrites | None:
        """The executors' writers when they apply the batches (None: :meth:`apply` on the driver)."""
        ...

    @property
    def resolves_letters(self) -> bool:
        """Whether the operator's skip and replay (:meth:`resolve_letters`) are offered."""
        ...

    @property
    def letters_elsewhere(self) -> str:
        """Where the dead letters are kept when :attr:`resolves_letters` is False, in words that follow
        "event source <name> writes" ('' when the operator resolves them through the daemon)."""
        ...

    def prepare(self) -> None:
        """Before each start of the source's query: make what every batch needs (a schema)."""
        ...

    def apply(self, batch: DecodedBatch, txn: EventTxn) -> EventBatchResult:
        """Apply ``batch`` (one micro-batch, decoded, in source order) to the replicas and record its
        dead letters, exactly once under ``txn``. A change a replica cannot hold becomes a dead
        letter, never a failed batch; a failure of the destination itself raises."""
        ...

    def letters(self, ids: Iterable[str] | None = None, messages: bool = True) -> list[StoredLetter]:
        """The recorded dead letters (those with ``ids`` when given), oldest first; without
        ``messages`` their raw keys and values are left out."""
        ...

    def resolve_letters(self, verb: str, ids: Sequence[str] | None, table: str | None = None) -> LetterReport:
        """Skip or replay the pending letters ``ids`` (None: every pending one, of ``table`` if given);
        :class:`LettersNotResolvable` where :attr:`resolves_letters` is False."""
        ...

    def wait(self) -> ServerWait | None:
        """What the sink's writes wait on in the destination's server now (None: nothing)."""
        ...

    def close(self) -> None:
        """Release connections and threads; a closed sink reopens them on its next use."""
        ...
