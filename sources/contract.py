"""Where a table's changes come from, as the table runner sees it: the :class:`ChangeSource` protocol.

A change source serves one source table. It describes the table (columns, declared key, identity,
properties), says how far its history reaches (:meth:`ChangeSource.head`), hands out the table as
of one position (the bootstrap snapshot) and the changes after a position (the stream the replica
follows from there). Positions are the source's own orderable sequence: a Delta table's commit
versions here.

Every change a source yields normalises to one contract, :class:`~lakemirror.sources.change_event.ChangeEvent`:
keys, an orderable :class:`~lakemirror.sources.change_event.Position`, an operation, columns. A
Delta change-feed row maps to it with :func:`change_from_cdf_row` (pure).

Sources that deliver many tables' change events in one stream (Kafka / Debezium, the simple event
form, JSON-lines files) plug in through the counterpart protocol,
:class:`lakemirror.sources.event_source.EventSource`: a stream of raw messages and the decoder of
each message to the same contract.

Implementations: :class:`lakemirror.sources.change_feed.DeltaChangeFeed` (a Delta table's Change
Data Feed, read by Spark) and :class:`lakemirror.sources.memory.MemoryChangeSource`, its in-memory
twin for unit tests. ``Frame`` is what a snapshot or a change stream is made of: a Spark DataFrame
for the Delta feed, a list of row dicts for the twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, TypeVar

from lakemirror.sources.change_event import DELETE, STREAM, UPSERT, ChangeEvent, Position

if TYPE_CHECKING:
    from lakemirror.delta_log.commit_times import CommitLog
    from lakemirror.identifiers import TableName
    from lakemirror.sources.catalog import TableInfo
    from lakemirror.sources.change_feed import SourceHead
    from lakemirror.tables import TableLocation

Frame = TypeVar("Frame")

#: A Delta change-feed row's bookkeeping columns (the rest are the table's own columns).
CDF_CHANGE_TYPE, CDF_COMMIT_VERSION, CDF_COMMIT_TIMESTAMP = "_change_type", "_commit_version", "_commit_timestamp"
#: Change-feed change types and the contract's operation for each; ``update_preimage`` carries none.
CDF_OPERATIONS = {"insert": UPSERT, "update_postimage": UPSERT, "delete": DELETE}
CDF_PREIMAGE = "update_preimage"


class ChangeSource(Protocol[Frame]):
    """One source table's history: its description, its head, a snapshot, and the changes after it.

    Lifecycle: none of its own; a source holds no resources between calls. The runner calls
    :meth:`describe` when the table starts, :meth:`head` to pin a bootstrap position and to
    measure lag, :meth:`snapshot` once per epoch and :meth:`changes` each time the table's
    stream starts.
    """

    def describe(self) -> "TableInfo":
        """Columns, declared key, table identity and properties (refreshed on every call)."""
        ...

    def head(self, since_version: int, window: int = 32) -> "SourceHead":
        """The latest position, with the commit times of the newest ``window`` positions and of
        every position after ``since_version`` that the history still holds."""
        ...

    def snapshot(self, version: int) -> Frame:
        """The table's rows exactly as of ``version``."""
        ...

    def changes(self, after_version: int, options: Mapping[str, Any] | None = None) -> Frame:
        """The change rows of every position after ``after_version``, with no gap and no overlap
        with :meth:`snapshot` of ``after_version``."""
        ...

    def identity(self, batch: Frame) -> str | None:
        """The identity of the table ``batch`` was read from, read after the batch was planned: a
        table dropped and recreated under the same name has a new one."""
        ...

    def commit_log(self) -> "CommitLog | None":
        """The source's commit files for cheap head checks, or None where they cannot be read directly."""
        ...

    def enable_change_feed(self) -> None:
        """Turn the table's change data feed on (one commit on the source: a table property); asked
        for by ``enable_change_data_feed: true`` only."""
        ...


class TableChangeSource(ChangeSource[Frame], Protocol[Frame]):
    """A change source as the table runner holds it: a named table at a location, whose stream's
    batch function first calls :meth:`leave_kernel_mode` on each batch
    (:class:`~lakemirror.sources.delta_source.DeltaChangeFeed`; the twin
    :class:`~lakemirror.sources.memory.MemoryChangeSource`). Made per table by the pipeline's
    factory: ``source_for(table, session)``."""

    @property
    def name(self) -> "TableName": ...

    @property
    def location(self) -> "TableLocation": ...

    def leave_kernel_mode(self, batch: Frame) -> None:
        """Leave the session state a streaming source's read of ``batch`` needed (a no-op for most)."""
        ...


def change_from_cdf_row(table: str, row: Mapping[str, Any], keys: Sequence[str]) -> ChangeEvent | None:
    """One Delta change-feed row as the change contract; None for an ``update_preimage`` row.

    The position is the commit version (a whole commit is one position: inside one commit a
    delete is ordered before an upsert of the same key, as :meth:`ChangeEvent.order` ranks them).
    """
    kind = row[CDF_CHANGE_TYPE]
    if kind == CDF_PREIMAGE:
        return None
    op = CDF_OPERATIONS.get(kind)
    if op is None:
        raise ValueError(f"{table}: unknown change type {kind!r} (known: {', '.join([*CDF_OPERATIONS, CDF_PREIMAGE])})")
    bookkeeping = (CDF_CHANGE_TYPE, CDF_COMMIT_VERSION, CDF_COMMIT_TIMESTAMP)
    columns = {} if op == DELETE else {k: v for k, v in row.items() if k not in bookkeeping}
    stamp = row.get(CDF_COMMIT_TIMESTAMP)
    ts_ms = None if stamp is None else int(stamp.timestamp() * 1000)
    return ChangeEvent(table=table, op=op, keys=tuple((k, row[k]) for k in keys),
                       position=Position(STREAM, int(row[CDF_COMMIT_VERSION])), columns=columns,
                       basis="delta commit version", ts_ms=ts_ms)
