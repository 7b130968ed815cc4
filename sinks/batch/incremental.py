"""Incremental Sync: a periodic change-feed sweep per table, through the stream's apply path.

A sweep is the continuous stream run with ``trigger(availableNow=True)``: the CDF rows committed
since the last sweep are read in micro-batches and each batch goes through the same
:class:`~lakemirror.sinks.merge.delta_merge.DeltaMergeSink` as the stream, under a Delta transaction id
``lakemirror-incremental/<namespace>/<replica>/e<epoch>-v<start>`` (version = batch id). The
sweep has its own checkpoint location, ``<checkpoint root>/<namespace>/incremental/<replica>/
e<epoch>``, and its own state (:class:`~lakemirror.checkpoints.state.FileStateStore` under
``…/incremental``), so it never shares an offset or a transaction id with a continuous stream.
A sweep interrupted anywhere is finished by the next one; a batch it already committed is skipped
by Delta.

Where a sweep starts (:func:`plan_sweep`, pure): its own epoch when it has one for the same
source table; else the version a cloned replica records (``lakemirror.cloneSourceVersion`` of
the same source id, same schema: no copy at all); else a snapshot at the source's current version
replaces the replica (a new epoch). After each sweep the replica's ``lakemirror.cloneSourceVersion``
says which source version it now mirrors, so a reconciliation compares it with the right version.
A replica owned by a continuous pipeline is refused: a sweep would race its stream.

Over Spark Connect the sweep is the same: a server session of its own, the same batch function
(it runs on the server, where its SQL ``MERGE`` needs no Delta plugin), and the outcomes read back
from the replica's log (:mod:`lakemirror.sinks.batch.sweep_batches`). Its checkpoint folder is
written by the server, so ``checkpoint_volume`` must be a path the server sees.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

from lakemirror import tables
from lakemirror.checkpoints import layout
from lakemirror.checkpoints.state import StateStore, TableProgress
from lakemirror.delta_log.stream_offsets import applied_through_from_offset
from lakemirror.errors import DestinationConflict, TerminalError, TransientError
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.batch import snapshot_copy
from lakemirror.sinks.batch.clone import CLONE_SOURCE_ID_PROPERTY, CLONE_VERSION_PROPERTY, clone_properties
from lakemirror.sinks.batch.operations import BatchJob, Operations
from lakemirror.sinks.batch.sweep_batches import SweepBatches, server_outcomes
from lakemirror.sinks.merge.connect_batches import server_batch_cause
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.planner import ColumnSelection, diff_schema, plan_merge, read_columns_change
from lakemirror.sources import change_feed
from lakemirror.sources.catalog import Catalog
from lakemirror.sources.keys import choose_key

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

Action = Literal["stream", "adopt", "bootstrap"]
#: How often one sweep is planned when the source's columns change while it is planned.
PLANNINGS = 3


@dataclass(frozen=True)
class SweepFacts:
    progress: TableProgress            # the sweep's own state for this replica
    source_id: str | None
    source_version: int
    replica_exists: bool
    mirrored_version: int | None = None
    mirrored_source_id: str | None = None
    schema_breaking: bool = False      # the replica cannot take the source's schema by adding columns


@dataclass(frozen=True)
class SweepPlan:
    action: Action    # stream: continue the epoch; adopt: new epoch at the clone's version; bootstrap: copy
    start_version: int
    reason: str


def plan_sweep(f: SweepFacts) -> SweepPlan:
    """Where the sweep starts; see the module docstring."""
    p = f.progress
    if f.schema_breaking:
        return SweepPlan("bootstrap", f.source_version, "the replica's schema cannot follow the source's")
    if p.bootstrapped and p.bootstrap_version is not None and f.replica_exists and p.source_table_id == f.source_id:
        return SweepPlan("stream", p.bootstrap_version, f"epoch {p.epoch} continues")
    if (f.replica_exists and f.mirrored_version is not None and f.mirrored_source_id == f.source_id
            and f.mirrored_version <= f.source_version):
        return SweepPlan("adopt", f.mirrored_version, f"the replica mirrors source version {f.mirrored_version}")
    if not f.replica_exists:
        return SweepPlan("bootstrap", f.source_version, "the replica does not exist")
    if p.source_table_id is not None and p.source_table_id != f.source_id:
        return SweepPlan("bootstrap", f.source_version, "the source was replaced (another table id)")
    return SweepPlan("bootstrap", f.source_version, "the replica records no usable mirrored source version")


def sweep_app_id(namespace: str, replica_slug: str, epoch: int, start_version: int) -> str:
    """Never equal to the continuous stream's ``lakemirror/<pipeline>/<table>/e<epoch>``."""
    return f"lakemirror-incremental/{namespace}/{replica_slug}/e{epoch}-v{start_version}"


@dataclass(frozen=True)
class SweepResult:
    source: str
    replica: str
    action: Action
    epoch: int
    start_version: int
    mirrored_version: int
    batches: int
    rows_read: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    batches_replayed: int

    def details(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("source", "replica")}


class IncrementalSweep:
    """Runs sweeps; :meth:`cancel` stops the sweep of one attempt tag (its query stops)."""

    def __init__(self, spark: "SparkSession", catalog: Catalog, states: StateStore, checkpoint_root: str,
                 namespace: str) -> None:
        self.spark = spark
        self.catalog = catalog
        self.states = states
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self.namespace = namespace
        self._lock = threading.Lock()
        self._queries: dict[str, "StreamingQuery"] = {}
        self._cancelled: set[str] = set()

    def cancel(self, tag: str) -> None:
        with self._lock:
            self._cancelled.add(tag)
            query = self._queries.get(tag)
        if query is not None:
            try:
                query.stop()
            except Exception as exc:  # already stopped
                log.debug("stopping sweep %s: %s", tag, exc)

    def sweep(self, source: TableName, target: TableName, *, keys: Sequence[str] = (),
              columns: ColumnSelection = ColumnSelection(), tag: str = "") -> SweepResult:
        """Apply the source's changes since the last sweep to ``target``; see the module docstring."""
        try:
            return self._sweep(source, target, keys, columns, tag)
        finally:
            with self._lock:
                self._cancelled.discard(tag)

    def _sweep(self, source: TableName, target: TableName, keys: Sequence[str], columns: ColumnSelection,
               tag: str) -> SweepResult:
        spark = tables.own_session(self.spark)
        try:
            return self._sweep_in(spark, source, target, keys, columns, tag)
        finally:
            tables.release_session(spark, self.spark)

    def _sweep_in(self, spark: "SparkSession", source: TableName, target: TableName, keys: Sequence[str],
                  columns: ColumnSelection, tag: str) -> SweepResult:
        """One sweep, planned again when the source's columns change between its description and
        the frames it reads (:class:`ColumnsMoved`), at most :data:`PLANNINGS` times."""
        for attempt in range(1, PLANNINGS + 1):
            try:
                return self._sweep_planned(spark, source, target, keys, columns, tag)
            except ColumnsMoved as moved:
                if attempt == PLANNINGS:
                    raise TransientError(f"{source}: the source's columns changed while each of {PLANNINGS} "
                                         f"sweeps was planned ({moved}); the next sweep tries again",
                                         table=str(source)) from None
                log.info("incremental %s -> %s: the source's columns changed while the sweep was planned (%s); "
                         "planning it again", source, target, moved)
        raise AssertionError("unreachable")

    def _sweep_planned(self, spark: "SparkSession", source: TableName, target: TableName, keys: Sequence[str],
                       columns: ColumnSelection, tag: str) -> SweepResult:
        src, dst = self.catalog.locate(source), self.catalog.locate(target)
        # The version first: a snapshot at it has no column the description, read after it, lacks.
        version = tables.latest_version(spark, src)
        info = self.catalog.describe(spark, source)
        if not info.cdf_enabled:
            raise TerminalError(f"{source}: Change Data Feed is not enabled; an incremental sweep reads it. Run: "
                                f"ALTER TABLE {info.location.sql} SET TBLPROPERTIES "
                                f"('delta.enableChangeDataFeed' = 'true')", table=str(source))
        key = choose_key(str(source), info.columns, configured=tuple(keys), declared=info.declared_key)
        plan = plan_merge(info.columns, key.columns, columns)
        exists = tables.exists(spark, dst)
        props = snapshot_copy.replica_properties(spark, dst) if exists else {}
        owner = props.get(snapshot_copy.PIPELINE_PROPERTY)
        if owner:
            raise DestinationConflict(f"{target} is replicated continuously by pipeline {owner!r}; an incremental "
                                      f"sweep into it would race that stream", table=str(source))
        diff = diff_schema(plan.columns, snapshot_copy.replica_columns(spark, dst)) if exists else None
        raw = props.get(CLONE_VERSION_PROPERTY)
        mirrored = int(raw) if raw and raw.isdigit() else None
        slug = target.slug
        progress = self.states.load(slug)
        decided = plan_sweep(SweepFacts(progress, info.table_id, version, exists, mirrored,
                                        props.get(CLONE_SOURCE_ID_PROPERTY),
                                        schema_breaking=diff is not None and not diff.is_additive))
        log.info("incremental %s -> %s: %s (%s)", source, target, decided.action, decided.reason)
        if decided.action != "stream":
            snapshot = None
            if decided.action == "bootstrap":
                snapshot = change_feed.snapshot(spark, src, decided.start_version)
                require_read_columns(snapshot.columns, info.columns)
            progress = progress.next_epoch(decided.start_version, info.table_id)
            self.states.save(slug, progress)
            if snapshot is not None:
                self.catalog.ensure_schema(spark, target.catalog, target.schema)
                snapshot_copy.write_snapshot(snapshot, dst, plan.columns,
                                             clone_properties(str(source), info.table_id, decided.start_version),
                                             info.properties)
                mirrored = decided.start_version
            progress = replace(progress, bootstrapped=True)
            self.states.save(slug, progress)
        elif diff is not None and not diff.is_empty:
            snapshot_copy.add_columns(spark, dst, diff.added)
        return self._stream(spark, source, target, plan, info.columns, progress, -1 if mirrored is None else mirrored,
                            version, decided.action, tag)

    def _stream(self, spark: "SparkSession", source: TableName, target: TableName, plan: Any,
                described: Sequence[Column], progress: TableProgress, mirrored: int, head: int, action: Action,
                tag: str) -> SweepResult:
        assert progress.bootstrap_version is not None
        start = progress.bootstrap_version
        src, dst = self.catalog.locate(source), self.catalog.locate(target)
        sink = DeltaMergeSink(dst, plan, stable_source=True)
        app_id = sweep_app_id(self.namespace, target.slug, progress.epoch, start)
        checkpoint = layout.incremental_checkpoint(self.checkpoint_root, self.namespace, target.slug, progress.epoch)
        batches = SweepBatches(sink, app_id)
        # Over Spark Connect the batch function runs on the server: its outcomes are read back from
        # the replica's log after the query, and commits up to this version were there before it.
        in_process = tables.has_own_jvm(spark)
        replica_before = -1 if in_process else tables.latest_version(spark, dst)
        stream = change_feed.change_stream(spark, src, start)
        require_read_columns(stream.columns, described)
        with self._lock:
            if tag and tag in self._cancelled:
                raise TerminalError(f"{source}: the incremental sweep was cancelled", table=str(source))
            query = (stream.writeStream.queryName(f"lakemirror-incremental:{self.namespace}:{source}")
                     .option("checkpointLocation", checkpoint).trigger(availableNow=True)
                     .foreachBatch(batches).start())
            if tag:
                self._queries[tag] = query
        try:
            query.awaitTermination()
        except Exception as exc:
            cause = server_batch_cause(exc)  # over Spark Connect: the batch function's own error
            if cause is exc:
                raise
            raise cause from exc
        finally:
            with self._lock:
                self._queries.pop(tag, None)
        error = query.exception()
        if error is not None:  # awaitTermination raises it already; kept for runtimes that do not
            raise error
        with self._lock:
            if tag in self._cancelled:
                raise TerminalError(f"{source}: the incremental sweep was cancelled", table=str(source))
        applied = (batches.applied if in_process
                   else server_outcomes(spark, dst, app_id, query.recentProgress, replica_before))
        outcomes = [o for _, o in applied]
        last = max((int(o.stats.last_version) for o in outcomes if o.stats.last_version is not None), default=-1)
        through = max(head, last, _offset_through(query.lastProgress))
        if through > mirrored:
            snapshot_copy.set_properties(spark, dst, {CLONE_VERSION_PROPERTY: str(through)})
        return SweepResult(str(source), str(target), action, progress.epoch, start, max(through, mirrored),
                           len(outcomes), sum(o.stats.rows_read for o in outcomes),
                           sum(o.counts.inserted for o in outcomes), sum(o.counts.updated for o in outcomes),
                           sum(o.counts.deleted for o in outcomes), sum(int(o.replayed) for o in outcomes))


class ColumnsMoved(Exception):
    """A frame the sweep read has other columns than the description its plan was made from."""


def require_read_columns(read: Sequence[str], described: Sequence[Column]) -> None:
    """Raise :class:`ColumnsMoved` when a frame read from the source (a snapshot, a change stream)
    has other data columns than ``described``: a commit between the description and the read
    changed them, and rows of a column the plan lacks would be applied without it. Pure."""
    change = read_columns_change(read, described)
    if change is not None:
        raise ColumnsMoved(change)


def _offset_through(progress: Any) -> int:
    """The source version an availableNow run ended at, from its last progress (-1 if unknown).
    Read from the progress's JSON: over Spark Connect its items are not all reachable by key."""
    if not progress:
        return -1
    payload: Mapping[str, Any] = json.loads(progress.json) if hasattr(progress, "json") else progress
    ends = [applied_through_from_offset(s.get("endOffset")) for s in payload.get("sources", [])]
    return max((e for e in ends if e is not None), default=-1)


class IncrementalOperations:
    """The ``incremental`` operation of the batch runner (an
    :class:`~lakemirror.sinks.batch.operations.Operations`)."""

    def __init__(self, sweep: IncrementalSweep) -> None:
        self.sweeper = sweep

    def run(self, operation: str, job: BatchJob, tag: str) -> Mapping[str, Any]:
        opts = job.settings.options.get("incremental", {})
        selection = ColumnSelection(tuple(opts.get("include_columns", ())), tuple(opts.get("exclude_columns", ())))
        return self.sweeper.sweep(job.source, job.target, keys=job.settings.keys, columns=selection,
                                  tag=tag).details()

    def cancel(self, tag: str) -> None:
        self.sweeper.cancel(tag)


class WithIncremental:
    """``incremental`` goes to the sweep, every other operation to ``base``."""

    def __init__(self, base: Operations, incremental: Operations) -> None:
        self.base = base
        self.incremental = incremental

    def run(self, operation: str, job: BatchJob, tag: str) -> Mapping[str, Any]:
        return (self.incremental if operation == "incremental" else self.base).run(operation, job, tag)

    def cancel(self, tag: str) -> None:
        self.base.cancel(tag)
        self.incremental.cancel(tag)
