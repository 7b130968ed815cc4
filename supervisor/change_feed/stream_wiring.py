"""A table's streaming query, wired: its change stream, checkpoint, batch function and trigger.

:func:`wire_stream` starts (or readies) the query of one epoch and returns what the runner holds
while it runs (:class:`Wiring`). The query reads the source's changes after the epoch's pinned
version from a checkpoint of the epoch's own, and calls the batch function with each micro-batch:

- in a session with its own JVM, the runner's :class:`~lakemirror.supervisor.change_feed.batch_apply.BatchApply`,
  on an always-on query; with ``apply_workers > 0`` each batch first waits for the table's turn
  inside the batch function (:class:`~lakemirror.supervisor.apply_workers.query_gate.TurnGate`);
- with ``apply_workers > 0``, a replica on the driver path and a source delta-rs reads, each turn
  first plans and applies the table's next batch from the source's commit files
  (:class:`~.commit_file_batches.FeedBatches`, no Spark job), and starts the query with a ``once``
  or ``availableNow`` trigger only for the batches Spark is to plan (:func:`feed_mode` says when a
  table runs so);
- through Spark Connect, a SQL-only batch function that runs on the server
  (:mod:`lakemirror.sinks.merge.connect_apply`) and writes each batch's outcome beside the query's
  checkpoint for the runner to read (:class:`~lakemirror.sinks.merge.connect_batches.ConnectBatches`),
  which records the rows; with ``apply_workers > 0`` it waits for the table's turns at a gate of
  files beside the checkpoint (:mod:`lakemirror.sinks.merge.connect_gate`), as in classic mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lakemirror.checkpoints import stream_dir
from lakemirror.errors import SchemaChangeRestart
from lakemirror.object_store import delta_rs_reader, is_s3a
from lakemirror.schema import Column, schema_change
from lakemirror.sinks.accelerator.batch_feed import BatchFeed
from lakemirror.sinks.merge.connect_batches import ConnectBatches, batch_job
from lakemirror.sinks.merge.connect_gate import FileTurnGate, gate_folder
from lakemirror.sinks.merge.planner import read_columns_change
from lakemirror.sinks.contract import TableReplica
from lakemirror.sinks.txn import TxnId, txn_app_id
from lakemirror.sources.contract import TableChangeSource
from lakemirror import tables
from lakemirror.supervisor.apply_workers.query_gate import Gate, TurnGate
from lakemirror.supervisor.change_feed.batch_apply import BatchApply
from lakemirror.supervisor.change_feed.commit_file_batches import FeedBatches
from lakemirror.supervisor.change_feed.prepare import Prepared
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec
from lakemirror.supervisor.offline import replica_transactions
from lakemirror.tables import TableLocation, has_own_jvm, is_local_path, is_local_table, local_dir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from lakemirror.checkpoints.round_rows import RoundRows

log = logging.getLogger(__name__)

#: The batch function's body: (sink, transaction, batch, epoch, source table id, driver reader).
ApplyBatch = Callable[[Any, TxnId, "DataFrame", int, "str | None", Any], None]


@dataclass
class Wiring:
    """What a started (or readied) query leaves the runner."""

    #: The always-on query (None: queries are started per turn).
    query: "StreamingQuery | None" = None
    #: Where the always-on query's batches wait for their turns (None: no turns, or queries started
    #: per turn); over Spark Connect a gate of files the server's batch functions wait at.
    gate: Gate | None = None
    #: Starts the query for one turn (True: a ``once`` trigger); with batches planned from the
    #: source's commit files only (``feed_batches``).
    turn_query: "Callable[[bool], StreamingQuery] | None" = None
    #: The batches the server-side batch function reported by outcome files (Spark Connect only).
    connect: ConnectBatches | None = None
    #: The driver path's delta-rs read of the batches (None: Spark reads every batch).
    batch_feed: BatchFeed | None = None
    #: The session the query is started in.
    stream_session: "SparkSession | None" = None
    #: The batch sink the batch function applies through (None over Spark Connect: it runs on the server).
    sink: Any = None
    #: The batches the daemon plans from the source's commit files (None: Spark plans every batch).
    feed_batches: FeedBatches | None = None


def stream_options(spec: PipelineSpec) -> dict[str, Any]:
    """The change stream's rate limits, as Delta's source options."""
    options: dict[str, Any] = {}
    if spec.max_files_per_trigger:
        options["maxFilesPerTrigger"] = spec.max_files_per_trigger
    if spec.max_bytes_per_trigger:
        options["maxBytesPerTrigger"] = spec.max_bytes_per_trigger
    return options


def wire_stream(session: "SparkSession", spec: PipelineSpec, slug: str, source: TableChangeSource[Any],
                replica: TableReplica[Any], destination: TableLocation, prepared: Prepared,
                apply_batch: ApplyBatch, recorded: Callable[[str], "int | None"],
                mark: Callable[[str], None] = lambda step: None, rows: "RoundRows | None" = None) -> Wiring:
    """Start the table's query for the epoch ``prepared`` names (see the module docstring); ``mark``
    is told when the change stream is made (``source``) and the apply path chosen (``choose``).
    ``recorded``: the last batch of a transaction app id the checkpoint table holds (Spark Connect:
    the batches after it have outcome files whose rows are to be recorded). ``rows``: the pipeline's
    row writer, which appends the checkpoint rows of the batches planned from commit files."""
    progress = prepared.progress
    assert progress.bootstrap_version is not None
    after_version = progress.bootstrap_version
    app_id = txn_app_id(spec.pipeline_id, slug, progress.epoch)
    checkpoint = replica_transactions.stream_checkpoint(spec.checkpoint_root, spec.pipeline_id, slug, progress.epoch)
    removed = stream_dir.remove_interrupted_writes(session, checkpoint)
    if removed:
        log.warning("table %s: removed %d unfinished checkpoint write(s) of a stopped or killed query: %s",
                    source.name, len(removed), ", ".join(removed))

    def open_stream() -> "tuple[DataStreamWriter, SparkSession]":
        """The change stream's writer and the session its query runs in. Delta's streaming source
        reads the source's snapshot here (seconds on a cold JVM)."""
        stream = source.changes(after_version, stream_options(spec))
        require_stream_columns(str(source.name), stream.columns, prepared.source_columns)
        stream_session = stream.sparkSession
        stream_dir.use_file_system_manager(stream_session, checkpoint)
        return (stream.writeStream.queryName(f"lakemirror:{spec.pipeline_id}:{source.name}")
                .option("checkpointLocation", checkpoint)), stream_session

    if not has_own_jvm(session):
        writer, stream_session = open_stream()
        mark("source")
        wiring = _connect_query(spec, source, replica, destination, prepared, app_id, writer, checkpoint, recorded)
        wiring.stream_session = stream_session
        return wiring

    sink = replica.batch_sink(prepared.plan, progress.epoch)
    # The apply path is chosen here, on the launch's thread, beside the other tables' launches: left
    # to the first batch, its Spark jobs on the replica would take turn time the tables share.
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
    from lakemirror.sinks.merge.row_isolation import IsolatingMergeSink

    if isinstance(sink, (DeltaMergeSink, IsolatingMergeSink)):
        sink.ensure_chosen()
        mark("choose")
    path = source.location.path
    remote = delta_rs_reader(session, path) if path is not None and is_s3a(path) else None
    feed = BatchFeed.for_stream(checkpoint, source.location, progress.bootstrap_version, remote)
    feed_batches: FeedBatches | None = None
    reach = feed_mode(spec, sink, source.location, remote, checkpoint, apply_batch)
    if isinstance(reach, str):
        if spec.apply_workers > 0:
            log.info("table %s: Spark's streaming source plans every batch: %s", source.name, reach)
    else:
        merge_sink = delta_merge_sink(sink)
        assert isinstance(apply_batch, BatchApply) and isinstance(merge_sink, DeltaMergeSink)
        feed_batches = FeedBatches(
            label=str(source.name), checkpoint=checkpoint, source=reach, sink=merge_sink, apply_batch=apply_batch,
            app_id=app_id, epoch=progress.epoch, after_version=progress.bootstrap_version,
            source_table_id=progress.source_table_id, live=apply_batch.live, session=session, rows=rows,
            read_range=lambda versions: tables.read(session, source.location, readChangeFeed="true",
                                                    startingVersion=str(versions.first),
                                                    endingVersion=str(versions.last)))
        log.info("table %s: batches of up to %d plain source versions are read from its commit files on the "
                 "driver; Spark's streaming source plans the others", source.name, feed_batches.window)
    gate = TurnGate() if spec.apply_workers > 0 and feed_batches is None else None

    def batch_function(batch: "DataFrame", batch_id: int) -> None:
        source.leave_kernel_mode(batch)

        def apply() -> None:
            apply_batch(sink, TxnId(app_id, batch_id), batch, progress.epoch, progress.source_table_id,
                        feed.reader(batch_id) if feed is not None else None)
        if gate is None:
            apply()
        else:
            gate.pass_batch(apply, batch_id)

    if feed_batches is not None:
        # Turns: the daemon's batches first; a query started for the turn for those Spark plans. A
        # restarted table whose checkpoint has logged batches applies its next ones from the commit
        # files, so its change stream is made at the first turn Spark plans, not here: its launch
        # does not wait for Delta's streaming source to read the source's snapshot. A new epoch's
        # first batch is Spark's: its stream is made now, beside the other tables' launches, not in
        # the turn the tables share. (A source read this way is never streamed through the
        # Kernel-based source, so its query runs in the daemon's own session.)
        stream_dir.use_file_system_manager(session, checkpoint)

        def make_writer() -> "DataStreamWriter":
            return open_stream()[0].foreachBatch(batch_function)

        def at_first_spark_turn() -> "DataStreamWriter":
            require_launch_schema(source, prepared.source_columns)
            return make_writer()

        if feed_batches.log.latest_offsets() is None:
            turn_query = TurnQuery(at_first_spark_turn, made=make_writer())
            mark("source")
        else:
            turn_query = TurnQuery(at_first_spark_turn)
        return Wiring(turn_query=turn_query, batch_feed=feed, stream_session=session, sink=sink,
                      feed_batches=feed_batches)
    writer, stream_session = open_stream()
    mark("source")
    query = writer.foreachBatch(batch_function).trigger(processingTime=f"{spec.trigger_interval_seconds} seconds").start()
    return Wiring(query=query, gate=gate, batch_feed=feed, stream_session=stream_session, sink=sink)


def require_launch_schema(source: TableChangeSource[Any], launched: "tuple[Column, ...]") -> None:
    """Raise :class:`~lakemirror.errors.SchemaChangeRestart` when the source's columns are no longer
    those its launch planned the table from.

    A change stream made at the launch reads the schema of that moment, and Delta's streaming source
    stops at a later commit that changes it (the table then relaunches and plans the new columns);
    a stream made later would read the new schema from its start, and its batches would carry
    columns the launch's plan does not write. Described the same way as at the launch (from the
    source's log), so an unchanged table never differs."""
    if not launched:
        return
    change = schema_change(launched, tuple(source.describe().columns))
    if change is not None:
        raise SchemaChangeRestart(f"{source.name}: the source's schema changed since the table's launch ({change}); "
                                  f"restarting the stream to read it", table=str(source.name))


def require_stream_columns(table: str, stream_columns: "Sequence[str]", launched: "tuple[Column, ...]") -> None:
    """Raise :class:`~lakemirror.errors.SchemaChangeRestart` when the change stream's data columns are
    not those the table's launch planned from. Pure.

    Delta's streaming source reads the source's schema when the stream is made, and a later version
    that only adds a column its read schema already has does not stop it: a column added after the
    launch described the source (while its first snapshot was copied, or between that description
    and the stream) would be in every batch and written by no plan. The stream's own columns are
    compared, not a second description, so no commit can fall between the two."""
    if not launched:
        return
    change = read_columns_change(stream_columns, launched)
    if change is not None:
        raise SchemaChangeRestart(f"{table}: the source's schema changed since the table's launch "
                                  f"({change}); restarting the stream to read it", table=table)


class TurnQuery:
    """Starts the table's query for one turn (True: a ``once`` trigger). Its writer (and so the
    change stream) is ``made`` already, or made by ``make_writer`` at the first start."""

    def __init__(self, make_writer: "Callable[[], DataStreamWriter]", made: "DataStreamWriter | None" = None) -> None:
        self._make_writer = make_writer
        self._writer = made

    @property
    def opened(self) -> bool:
        """Whether the change stream has been made."""
        return self._writer is not None

    def open(self) -> "DataStreamWriter":
        if self._writer is None:
            self._writer = self._make_writer()
        return self._writer

    def __call__(self, once: bool) -> "StreamingQuery":
        writer = self.open()
        return (writer.trigger(once=True) if once else writer.trigger(availableNow=True)).start()


def feed_mode(spec: PipelineSpec, sink: Any, source: TableLocation, remote: "tuple[str, dict[str, str]] | None",
              checkpoint: str, apply_batch: Any) -> "tuple[str, dict[str, str]] | str":
    """How delta-rs reads the source when the daemon plans the table's batches from its commit files
    (:class:`~.commit_file_batches.FeedBatches`), or why Spark plans every batch.

    It takes turns (``apply_workers > 0``), a replica the driver applies to (which chooses the apply
    path now: two small Spark jobs on the replica), a source delta-rs reads (on the driver's file
    system, or S3 through the session's s3a settings), a local checkpoint, no rate limits of the
    table's own (Spark splits batches by them) and Delta's ``DeltaSource`` (not the Kernel-based
    source under test)."""
    if not spec.commit_file_batches:
        return "commit_file_batches is off"
    if spec.apply_workers <= 0:
        return "the tables do not take turns (apply_workers: 0)"
    if spec.kernel_change_feed:
        return "kernel_change_feed streams the source"
    if spec.max_files_per_trigger or spec.max_bytes_per_trigger:
        return "the table has rate limits of its own (max_files_per_trigger, max_bytes_per_trigger)"
    merge_sink = delta_merge_sink(sink)
    if merge_sink is None or not isinstance(apply_batch, BatchApply):
        return "the replica is not a Delta table"
    if not is_local_path(checkpoint):
        return "the stream's checkpoint is not on the driver's file system"
    if remote is not None and remote[1]:
        target = remote
    elif source.path is not None and is_local_table(source.path):
        target = (str(local_dir(source.path)), {})
    else:
        return "the source is neither on the driver's file system nor in S3 through the session's s3a settings"
    merge_sink.ensure_chosen()
    if merge_sink.driver is None:
        return "the replica is not applied on the driver"
    return target


def delta_merge_sink(sink: Any) -> Any:
    """The :class:`~lakemirror.sinks.merge.delta_merge.DeltaMergeSink` a batch sink is or wraps (the row
    isolation of :mod:`lakemirror.sinks.merge.row_isolation`); None for any other sink."""
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink

    for candidate in (sink, getattr(sink, "inner", None)):
        if isinstance(candidate, DeltaMergeSink):
            return candidate
    return None


def apply_detail(sink: Any, feed: BatchFeed | None, planned: FeedBatches | None = None) -> dict[str, Any] | None:
    """How a table's batches reach its replica, for ``/status`` (``detail.apply``): the path its sink
    takes and why (:mod:`lakemirror.sinks.merge.apply_choice`), why the latest batch took another one
    if it did, how many batches delta-rs read instead of Spark, and how many the daemon planned from
    the source's commit files (and why Spark planned the latest other). None before a path is chosen."""
    merge_sink = delta_merge_sink(sink)
    choice = merge_sink.choice if merge_sink is not None else None
    if choice is None:
        return None
    out: dict[str, Any] = {"path": choice.path, "reason": choice.reason}
    note = merge_sink.batch_note
    if note:
        out["latest_batch"] = note
    if feed is not None:
        out["batches_read_by_delta_rs"] = feed.read_by_delta_rs
        out["batches_read_by_spark"] = feed.read_by_spark
    if planned is not None:
        out["batches_from_commit_files"] = planned.counts.from_commit_files
        out["turns_planned_by_spark"] = planned.counts.by_spark
        if planned.counts.last_spark_reason:
            out["latest_spark_plan"] = planned.counts.last_spark_reason
    return out


def _connect_query(spec: PipelineSpec, source: TableChangeSource[Any], replica: TableReplica[Any],
                   destination: TableLocation, prepared: Prepared, app_id: str, writer: "DataStreamWriter",
                   checkpoint: str, recorded: Callable[[str], "int | None"]) -> Wiring:
    """Spark Connect: the batch function runs on the server, in SQL only, and writes each batch's
    outcome beside the query's checkpoint; the runner reads those files and records the rows. A Delta
    replica's refused rows are dead-lettered by the batch function, as on the local path."""
    from lakemirror.sinks.merge.delta_replica import DeltaReplica

    if not is_local_path(checkpoint):
        raise ValueError(f"runtime.mode connect needs checkpoint_volume on a file system the daemon and the server "
                         f"share at the same path (each batch's outcome is written there); got {checkpoint}")
    letters = replica.dead_letters() if isinstance(replica, DeltaReplica) else None
    job = batch_job(target=destination, plan=prepared.plan, app_id=app_id, checkpoint=checkpoint, letters=letters,
                    label=replica.source if isinstance(replica, DeltaReplica) else str(source.name))
    batches = ConnectBatches(job)
    batches.start_after(recorded(app_id))
    gate: FileTurnGate | None = None
    if spec.apply_workers > 0:
        # Turns as in classic mode: the batch function waits at a gate of files beside the checkpoint.
        # Owned before the query starts, so that a query an earlier daemon left on the server stops.
        gate = FileTurnGate(gate_folder(checkpoint))
        job = replace(job, gate_dir=str(gate.folder), gate_generation=gate.take_over())
    query = writer.foreachBatch(job.bound()).trigger(processingTime=f"{spec.trigger_interval_seconds} seconds").start()
    return Wiring(query=query, gate=gate, connect=batches)
