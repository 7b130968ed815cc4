"""A table's bootstrap as chunks interleaved with its change feed (Airbyte's WASS, for Delta).

The snapshot at a pinned version V is split into chunks of the source's data files at V
(:mod:`lakemirror.sources.chunks`). Each chunk is one replica commit under a Delta transaction id of
its own, so a killed bootstrap resumes at the chunks the replica's transaction records do not
name, and no chunk is ever written twice. After a copying budget, or at once when the change
window would close before the next chunk is expected to end (:mod:`lakemirror.sinks.batch.bootstrap_plan`),
the table applies its change feed from the last applied version through the source's latest
(a *catch-up round*: one MERGE, as a stream batch applies it) and records every key the round
touched in a Delta table of its own. Later chunks drop rows whose key is touched: a snapshot row
at V is older than any change after V, so a changed key is never overwritten by an older copy and
a deleted one never comes back. When every chunk is committed, the replica holds the source as of
the last round's end W, and the table's stream starts after W.

A table of one chunk is copied as before: one snapshot read, one overwrite commit.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Mapping

from lakemirror import tables
from lakemirror.checkpoints import layout
from lakemirror.checkpoints.bootstrap_state import BootstrapStore
from lakemirror.errors import PinnedVersionAged
from lakemirror.sinks.batch import snapshot_copy
from lakemirror.sinks.batch.bootstrap_plan import (
    CATCH_UP, BootstrapPlan, BootstrapPolicy, BootstrapProgress, CatchUpRound, Step, next_step,
)
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.planner import CHANGE_TYPE, UPDATE_PRE, MergePlan
from lakemirror.sinks.txn import TxnId, txn_app_id
from lakemirror.sources import change_feed, snapshot_files
from lakemirror.sources.chunks import Chunk, bootstrap_app_id, chunk_app_id, chunk_number
from lakemirror.sources.retention import RetentionWindow, headroom_seconds, time_travel_refused
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Chunk waves in a row whose reads Delta may refuse (each followed by a catch-up round that moves
#: the read version to the source's latest) before the bootstrap gives up.
REFUSED_WAVES = 3


@dataclass
class BootstrapJob:
    """One table's bootstrap: what it copies, where, and under which transaction ids."""

    spark: "SparkSession"
    name: str                    # the source's name, for logs
    slug: str
    source: TableLocation
    replica: TableLocation
    plan: MergePlan
    epoch: int
    version: int                 # the pinned snapshot version V
    stream_app_id: str           # the table epoch's stream app id (bootstrap ids derive from it)
    touched_path: str            # the touched-keys Delta table of this epoch
    source_properties: Mapping[str, str]


class BootstrapInterrupted(Exception):
    """Raised between chunks when the table is being stopped: committed chunks stay, the next run
    resumes after them."""


class ChunkedBootstrap:
    """Runs a :class:`BootstrapJob` to its end; :meth:`run` returns the version the replica holds."""

    def __init__(self, job: BootstrapJob, *, policy: BootstrapPolicy, store: BootstrapStore,
                 slots: threading.Semaphore, clock: Callable[[], float], fault: Callable[[str], None],
                 on_progress: Callable[[BootstrapProgress], None] = lambda p: None,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.job = job
        self.policy = policy
        self.store = store
        self.slots = slots
        self.clock = clock
        self.fault = fault
        self.on_progress = on_progress
        self.stopping = stopping
        self.app = bootstrap_app_id(job.stream_app_id)
        self.retention = RetentionWindow.from_properties(dict(job.source_properties))
        self._lock = threading.Lock()
        self._durations: list[float] = []
        self._rows_copied = 0
        self._rows_done = 0
        self._note = ""
        self.choice = snapshot_files.choose_chunk_reads(internal_file_reads=policy.internal_file_reads,
                                                        own_jvm=tables.has_own_jvm(job.spark))
        self._reads: snapshot_files.ChunkReads | None = None

    def _chunk_reads(self) -> snapshot_files.ChunkReads:
        """The chunk reads :func:`~lakemirror.sources.snapshot_files.choose_chunk_reads` chose, made
        once per run (the fast path lists the source's files at V once)."""
        with self._lock:
            if self._reads is None:
                self._reads = snapshot_files.chunk_reads(self.job.spark, self.job.source, self.job.version,
                                                         self.job.plan.keys, self.choice)
            return self._reads

    # -- the plan --------------------------------------------------------------------------------

    def _load_or_plan(self) -> tuple[BootstrapPlan, bool]:
        j = self.job
        document = self.store.load(j.slug, j.epoch)
        saved = None if document is None else BootstrapPlan.from_json(document)
        if saved is not None and saved.version == j.version:
            return saved, True
        reads = self._chunk_reads()
        chunks = reads.plan(self.policy.chunk_bytes)
        log.info("table %s: bootstrap at version %d in %d chunk(s); %s", j.name, j.version, len(chunks),
                 self.choice.reason)
        note = getattr(reads, "note", None)
        if note:
            log.warning("table %s: bootstrap: %s", j.name, note)
        plan = BootstrapPlan(j.epoch, j.version, chunks)
        self.store.save(j.slug, plan.to_json())
        return plan, False

    def _committed(self, plan: BootstrapPlan) -> set[int]:
        found = snapshot_copy.recorded_transactions(self.job.spark, self.job.replica,
                                                    [chunk_app_id(self.app, c.number) for c in plan.chunks])
        return {n for app in found if (n := chunk_number(self.app, app)) is not None}

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Copy every chunk; the version the replica then holds.

        Delta refuses to read a version that is no longer the source's latest and whose commit is
        older than the source's ``delta.deletedFileRetentionDuration``
        (:func:`~lakemirror.sources.retention.time_travel_refused`). A refused chunk read after the
        replica exists is followed by a catch-up round, after which the chunks are read at the
        version the round reached. A refused read before anything was written (the plan, the
        first chunk) raises :class:`~lakemirror.errors.PinnedVersionAged`: the caller pins anew."""
        j = self.job
        try:
            plan, resumed = self._load_or_plan()
        except Exception as exc:
            if time_travel_refused(exc):
                raise PinnedVersionAged(j.name, j.version) from exc
            raise
        done = self._committed(plan) if resumed else set()
        started = self.clock()
        self._rows_done = sum(c.rows or 0 for c in plan.chunks if c.number in done)
        if resumed:
            log.info("table %s: resuming the bootstrap at version %d: %d of %d chunks already committed",
                     j.name, j.version, len(done), len(plan.chunks))
        for r in plan.rounds:
            if not r.done:  # a round a crash interrupted: redone with the same range and ids
                plan = self._catch_up(plan, r)
        pending = [c for c in plan.chunks if c.number not in done]
        copying_since = self.clock()
        self._report(plan, done, started)
        refused = 0  # chunk waves in a row whose reads Delta refused
        catch_up_first = False  # the last wave was refused: the next step is a catch-up
        while pending:
            if self.stopping():
                raise BootstrapInterrupted(f"{j.name}: stopping; the bootstrap resumes at chunk "
                                           f"{pending[0].number} of {len(plan.chunks)} on the next start")
            if 0 in {c.number for c in pending}:
                wave = [pending[0]]  # the first chunk creates (replaces) the replica: alone
            else:
                step = (Step(CATCH_UP, f"Delta refused to read source version {plan.applied_through} (no longer the "
                                       f"latest, and older than the source's deleted-file retention): applying the "
                                       f"change feed first, then reading the chunks at the version it reaches",
                             urgent=True)
                        if catch_up_first else self._decide(plan, copying_since, len(pending)))
                catch_up_first = False
                if step.kind == CATCH_UP:
                    (log.warning if step.urgent else log.info)("table %s: bootstrap: %s", j.name, step.reason)
                    self._note = step.reason
                    plan = self._catch_up(plan, None)
                    copying_since = self.clock()
                    self._report(plan, done, started)
                    continue
                wave = pending[:max(1, self.policy.parallel_chunks)]
            try:
                self._copy_wave(plan, wave, done, started)
                refused = 0
            except Exception as exc:
                if not time_travel_refused(exc):
                    raise
                if 0 not in done:
                    raise PinnedVersionAged(j.name, j.version) from exc
                refused += 1
                if refused > REFUSED_WAVES:
                    raise
                catch_up_first = True
            pending = [c for c in pending if c.number not in done]
        return plan.applied_through

    def finish(self) -> None:
        """After the runner has saved the table as bootstrapped: drop the touched keys and the plan."""
        snapshot_copy.drop_path_table(self.job.spark, self.job.touched_path)
        self.store.forget(self.job.slug)

    def _decide(self, plan: BootstrapPlan, copying_since: float, chunks_left: int) -> Step:
        j = self.job
        through = plan.applied_through
        head = change_feed.source_head(j.spark, j.source, since_version=through, window=1)
        now = self.clock()
        headroom = headroom_seconds(applied_through=through, latest_version=head.latest_version,
                                    commit_times=head.commit_times, window=self.retention, now=now)
        expected = max(self._durations[-3:]) if self._durations else 0.0
        return next_step(self.policy, now=now, copying_since=copying_since, headroom_seconds=headroom,
                         expected_chunk_seconds=expected, chunks_left=chunks_left,
                         source_ahead=head.latest_version > through)

    def _copy_wave(self, plan: BootstrapPlan, wave: list[Chunk], done: set[int], started: float) -> None:
        touched = self._touched() if plan.rounds else None
        if len(wave) == 1:
            self._copy(plan, wave[0], touched, done, started)
            return
        with ThreadPoolExecutor(max_workers=len(wave), thread_name_prefix=f"chunk:{self.job.slug}") as pool:
            futures = [pool.submit(self._copy, plan, c, touched, done, started) for c in wave]
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error

    def _copy(self, plan: BootstrapPlan, chunk: Chunk, touched: "DataFrame | None", done: set[int],
              started: float) -> None:
        j = self.job
        with self.slots:
            t0 = self.clock()
            # A key-range chunk is read at the version the catch-up rounds reached, not at V: Delta
            # refuses to time-travel further back than the source's deletedFileRetentionDuration,
            # which a bootstrap that outlives the retention would otherwise pass (its rows are V's
            # for every key no round touched; the touched ones the chunk leaves to the rounds).
            rows = (change_feed.snapshot(j.spark, j.source, j.version) if chunk.whole_table
                    else self._chunk_reads().read(chunk, plan.applied_through))
            self.fault("bootstrap_inside_chunk")
            snapshot_copy.write_chunk(rows, j.replica, j.plan.columns, TxnId(chunk_app_id(self.app, chunk.number),
                                                                              chunk.number),
                                      first=chunk.number == 0, touched=touched, keys=j.plan.keys,
                                      source_properties=j.source_properties)
            seconds = self.clock() - t0
        with self._lock:
            done.add(chunk.number)
            self._durations.append(seconds)
            self._rows_done += chunk.rows or 0
            self._rows_copied += chunk.rows or 0
            progress = self._report(plan, done, started)
        log.info("table %s: bootstrap chunk %d committed (%s rows, %.1fs): %s", j.name, chunk.number,
                 "?" if chunk.rows is None else chunk.rows, seconds, progress.describe())
        self.fault("bootstrap_between_chunks")

    def _touched(self) -> "DataFrame":
        return tables.read(self.job.spark, TableLocation(self.job.replica.name, self.job.touched_path))

    def _catch_up(self, plan: BootstrapPlan, redo: CatchUpRound | None) -> BootstrapPlan:
        """Apply the change feed after the last applied version through the source's latest (or a
        saved round's range again) and record the keys it touched."""
        j = self.job
        if redo is None:
            latest = change_feed.source_head(j.spark, j.source, since_version=plan.applied_through,
                                             window=1).latest_version
            redo = CatchUpRound(len(plan.rounds), plan.applied_through, latest)
            plan = plan.with_round(redo)
            self.store.save(j.slug, plan.to_json())  # the range is fixed before anything is written
        batch = (tables.read(j.spark, j.source, readChangeFeed="true", startingVersion=redo.after + 1,
                             endingVersion=redo.through))
        outcome = DeltaMergeSink(j.replica, j.plan).apply(batch, TxnId(f"{self.app}/catch-up", redo.number))
        self.fault("bootstrap_after_catch_up")
        keys = (batch.where(f"`{CHANGE_TYPE}` <> '{UPDATE_PRE}'")
                .select(*[f"`{k.replace('`', '``')}`" for k in j.plan.keys]).distinct())
        snapshot_copy.append_keys(keys, TableLocation(j.replica.name, j.touched_path),
                                  TxnId(f"{self.app}/touched", redo.number))
        plan = plan.with_round(replace(redo, done=True))
        self.store.save(j.slug, plan.to_json())
        log.info("table %s: bootstrap catch-up %d applied source versions %d..%d (%d change rows%s)", j.name,
                 redo.number, redo.after + 1, redo.through, outcome.stats.rows_read,
                 ", already committed" if outcome.replayed else "")
        return plan

    def _report(self, plan: BootstrapPlan, done: set[int], started: float) -> BootstrapProgress:
        rows_total = None if any(c.rows is None for c in plan.chunks) else sum(c.rows or 0 for c in plan.chunks)
        progress = BootstrapProgress(
            version=plan.version, chunks_total=len(plan.chunks), chunks_done=len(done), rows_total=rows_total,
            rows_copied=self._rows_copied, started_at=started, now=self.clock(), rows_done_estimate=self._rows_done,
            chunks_copied=len(self._durations),
            applied_through=plan.applied_through, catch_ups=sum(1 for r in plan.rounds if r.done), note=self._note)
        self.on_progress(progress)
        return progress


class ChunkedCopy:
    """A Delta replica's bootstrap copy as a :class:`ChunkedBootstrap`
    (:class:`lakemirror.supervisor.bootstrap.SnapshotCopier`): the replica's schema is made, the
    chunks are copied with the change feed between them, and the replica's properties then name
    the version it holds."""

    def __init__(self, spark: "SparkSession", *, label: str, slug: str, source: TableLocation,
                 replica: TableLocation, ensure_schema: Callable[[], None], pipeline_id: str, checkpoint_root: str,
                 replica_properties: Mapping[str, str], policy: BootstrapPolicy, store: BootstrapStore,
                 slots: threading.Semaphore, clock: Callable[[], float], fault: Callable[[str], None],
                 on_progress: Callable[[BootstrapProgress], None], stopping: Callable[[], bool]) -> None:
        self.spark, self.label, self.slug = spark, label, slug
        self.source, self.replica, self.ensure_schema = source, replica, ensure_schema
        self.pipeline_id, self.checkpoint_root, self.replica_properties = pipeline_id, checkpoint_root, replica_properties
        self.policy, self.store, self.slots, self.clock, self.fault = policy, store, slots, clock, fault
        self.on_progress, self.stopping = on_progress, stopping
        self._running: ChunkedBootstrap | None = None

    def copy(self, plan: MergePlan, version: int, epoch: int, source_properties: Mapping[str, str]) -> int:
        self.ensure_schema()
        log.info("table %s: bootstrapping from source version %d (epoch %d)", self.label, version, epoch)
        job = BootstrapJob(self.spark, self.label, self.slug, self.source, self.replica, plan, epoch, version,
                           txn_app_id(self.pipeline_id, self.slug, epoch),
                           layout.touched_keys_table(self.checkpoint_root, self.pipeline_id, self.slug, epoch),
                           source_properties)
        self._running = ChunkedBootstrap(job, policy=self.policy, store=self.store, slots=self.slots,
                                         clock=self.clock, fault=self.fault, on_progress=self.on_progress,
                                         stopping=self.stopping)
        through = self._running.run()
        snapshot_copy.set_properties(self.spark, self.replica, {
            **self.replica_properties, snapshot_copy.PIPELINE_PROPERTY: self.pipeline_id,
            snapshot_copy.SOURCE_PROPERTY: self.label, snapshot_copy.EPOCH_PROPERTY: str(epoch),
            snapshot_copy.BOOTSTRAP_VERSION_PROPERTY: str(through)})
        return through

    def finish(self) -> None:
        if self._running is not None:
            self._running.finish()
            self._running = None
