"""A table's streaming query, wired: its change stream, checkpoint, batch function and trigger.

:func:`wire_stream` starts (or readies) the query of one epoch and returns what the runner holds
while it runs (:class:`Wiring`). The query reads the source's changes after the epoch's pinned
version from a checkpoint of the epoch's own, and calls the batch function with each micro-batch:

- in a session with its own JVM, the runner's :class:`~lakemirror.supervisor.batch_apply.BatchApply`,
  on an always-on query; with ``apply_workers > 0`` each batch first waits for the table's turn
  inside the batch function (:class:`~lakemirror.supervisor.turn_gate.TurnGate`);
- through Spark Connect, a SQL-only batch function that runs on the server
  (:mod:`lakemirror.sinks.merge.connect_apply`) and writes each batch's outcome beside the query's
  checkpoint for the runner to read (:class:`~lakemirror.sinks.merge.connect_batches.ConnectBatches`),
  which records the rows; with ``apply_workers > 0`` it waits for the table's turns at a gate of
  files beside the checkpoint (:mod:`lakemirror.sinks.merge.connect_gate`), as in classic mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from lakemirror.checkpoints import stream_dir
from lakemirror.sinks.accelerator.batch_feed import BatchFeed
from lakemirror.sinks.merge.connect_batches import ConnectBatches, batch_job
from lakemirror.sinks.merge.connect_gate import FileTurnGate, gate_folder
from lakemirror.sinks.contract import TableReplica
from lakemirror.sinks.txn import TxnId, txn_app_id
from lakemirror.sources.delta_source import DeltaChangeFeed
from lakemirror.supervisor import replica_record
from lakemirror.supervisor.prepare import Prepared
from lakemirror.supervisor.spec import PipelineSpec
from lakemirror.supervisor.turn_gate import Gate, TurnGate
from lakemirror.tables import TableLocation, has_own_jvm, is_local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger(__name__)

#: The batch function's body: (sink, transaction, batch, epoch, source table id, driver reader).
ApplyBatch = Callable[[Any, TxnId, "DataFrame", int, "str | None", Any], None]


@dataclass
class Wiring:
    """What a started (or readied) query leaves the runner."""

    #: The always-on query (None: queries are started per turn).
    query: "StreamingQuery | None" = None
    #: Where the always-on query's batches wait for their turns (None: no turns, or Connect).
    gate: Gate | None = None
    #: Starts the query for one turn (True: a ``once`` trigger); Connect with turns only.
    turn_query: "Callable[[bool], StreamingQuery] | None" = None
    #: The batches the server-side batch function recorded (Spark Connect only).
    connect: ConnectBatches | None = None
    #: The driver path's delta-rs read of the batches (None: Spark reads every batch).
    batch_feed: BatchFeed | None = None
    #: The session the query is started in.
    stream_session: "SparkSession | None" = None


def stream_options(spec: PipelineSpec) -> dict[str, Any]:
    """The change stream's rate limits, as Delta's source options."""
    options: dict[str, Any] = {}
    if spec.max_files_per_trigger:
        options["maxFilesPerTrigger"] = spec.max_files_per_trigger
    if spec.max_bytes_per_trigger:
        options["maxBytesPerTrigger"] = spec.max_bytes_per_trigger
    return options


def wire_stream(session: "SparkSession", spec: PipelineSpec, slug: str, source: DeltaChangeFeed,
                replica: TableReplica[Any], destination: TableLocation, prepared: Prepared,
                apply_batch: ApplyBatch, recorded: Callable[[str], "int | None"]) -> Wiring:
    """``recorded``: the last batch of a transaction app id the checkpoint table holds (Spark
    Connect: the batches after it have outcome files whose rows are to be recorded)."""
    """Start the table's query for the epoch ``prepared`` names (see the module docstring)."""
    progress = prepared.progress
    assert progress.bootstrap_version is not None
    stream = source.changes(progress.bootstrap_version, stream_options(spec))
    app_id = txn_app_id(spec.pipeline_id, slug, progress.epoch)
    checkpoint = replica_record.stream_checkpoint(spec.checkpoint_root, spec.pipeline_id, slug, progress.epoch)
    stream_session = stream.sparkSession
    stream_dir.use_file_system_manager(stream_session, checkpoint)
    removed = stream_dir.remove_interrupted_writes(session, checkpoint)
    if removed:
        log.warning("table %s: removed %d unfinished checkpoint write(s) of a stopped or killed query: %s",
                    source.name, len(removed), ", ".join(removed))
    writer = (stream.writeStream.queryName(f"lakemirror:{spec.pipeline_id}:{source.name}")
              .option("checkpointLocation", checkpoint))
    if not has_own_jvm(session):
        wiring = _connect_query(spec, source, destination, prepared, app_id, writer, checkpoint, recorded)
        wiring.stream_session = stream_session
        return wiring

    sink = replica.batch_sink(prepared.plan, progress.epoch)
    gate = TurnGate() if spec.apply_workers > 0 else None
    feed = BatchFeed.for_stream(checkpoint, source.location, progress.bootstrap_version)

    def batch_function(batch: "DataFrame", batch_id: int) -> None:
        source.leave_kernel_mode(batch)

        def apply() -> None:
            apply_batch(sink, TxnId(app_id, batch_id), batch, progress.epoch, progress.source_table_id,
                        feed.reader(batch_id) if feed is not None else None)
        if gate is None:
            apply()
        else:
            gate.pass_batch(apply, batch_id)

    query = writer.foreachBatch(batch_function).trigger(processingTime=f"{spec.trigger_interval_seconds} seconds").start()
    return Wiring(query=query, gate=gate, batch_feed=feed, stream_session=stream_session)


def _connect_query(spec: PipelineSpec, source: DeltaChangeFeed, destination: TableLocation, prepared: Prepared,
                   app_id: str, writer: "DataStreamWriter", checkpoint: str,
                   recorded: Callable[[str], "int | None"]) -> Wiring:
    """Spark Connect: the batch function runs on the server, in SQL only, and writes each batch's
    outcome beside the query's checkpoint; the runner reads those files and records the rows."""
    if not is_local_path(checkpoint):
        raise ValueError(f"runtime.mode connect needs checkpoint_volume on a file system the daemon and the server "
                         f"share at the same path (each batch's outcome is written there); got {checkpoint}")
    job = batch_job(target=destination, plan=prepared.plan, app_id=app_id, checkpoint=checkpoint)
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
