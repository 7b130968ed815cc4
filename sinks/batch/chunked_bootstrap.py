"""A table's bootstrap as chunks copied beside a capture of its change feed.

The bootstrap pins the source's version V and, from then on, a capturer copies the change feed
after V into a Delta table of the bootstrap's own, the *change log*
(:mod:`lakemirror.sinks.batch.change_capture`), at the pace the source's retention sets
(:mod:`lakemirror.sinks.batch.capture_policy`). Beside it, the snapshot is planned in chunks
(:mod:`lakemirror.sources.chunks`, :mod:`lakemirror.sources.snapshot_files`) and copied, each chunk one
replica commit under a Delta transaction id of its own, so a killed bootstrap resumes at the
chunks the replica's transaction records do not name and no chunk is ever written twice.

A key-range chunk is read at the source's latest version when it is copied, which Delta never
refuses, and that version is saved in the plan before the chunk's commit
(:mod:`lakemirror.sinks.batch.bootstrap_plan`). When every chunk is copied, one MERGE applies, for
each key, the captured changes after its chunk's read version (:mod:`lakemirror.sinks.batch.bootstrap_apply`):
the replica then holds the source as of the last captured version F, and the table's stream starts
after F. Planning and copying thus take as long as they take: only the captures, which cost what
their changes cost, must keep pace with the source's change window, and a window too short even for
them is said, once, with the retention the bootstrap needs.

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
from lakemirror.errors import BootstrapPlanOutdated, PinnedVersionAged
from lakemirror.sinks.batch import bootstrap_apply, snapshot_copy
from lakemirror.sinks.batch.bootstrap_plan import (
    BootstrapPlan, BootstrapPolicy, BootstrapProgress, ChunkRead, OutdatedPlan, PlanKeeper,
)
from lakemirror.sinks.batch.capture_policy import copy_budget_used
from lakemirror.sinks.batch.change_capture import ChangeCapture
from lakemirror.sinks.merge.planner import MergePlan
from lakemirror.sinks.txn import TxnId, txn_app_id
from lakemirror.sources import snapshot_files
from lakemirror.sources.head_probe import HeadReader
from lakemirror.sources.chunks import Chunk, bootstrap_app_id, chunk_app_id, chunk_number
from lakemirror.sources.retention import RetentionWindow, time_travel_refused
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: A read at the source's latest version is refused only when the source commits between the look
#: at its head and the read, after idling for longer than its retention: the read is tried again at
#: the new head, this many times in all.
READ_ATTEMPTS = 3


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
    version: int                 # the pinned version V: the change feed is captured after it
    stream_app_id: str           # the table epoch's stream app id (bootstrap ids derive from it)
    changes_path: str            # the change log (a Delta table) of this epoch
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
        self.window = RetentionWindow.from_properties(dict(job.source_properties))
        self.changes = TableLocation(job.replica.name, job.changes_path)
        self.keeper = PlanKeeper(BootstrapPlan(job.epoch, job.version), self._save)
        self._lock = threading.Lock()
        self._done: set[int] = set()
        self._rows_this_run = 0
        self._chunks_this_run = 0
        self._started = clock()
        self._capture: ChangeCapture | None = None
        self._heads = HeadReader(job.spark, job.source)
        self._head_lock = threading.Lock()
        self.choice = snapshot_files.choose_chunk_reads(internal_file_reads=policy.internal_file_reads,
                                                        own_jvm=tables.has_own_jvm(job.spark))
        self._reads: snapshot_files.ChunkReads | None = None

    def _save(self, document: dict[str, object]) -> None:
        self.store.save(self.job.slug, document)

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Capture the change feed while planning and copying every chunk, then apply what the
        chunks still need; the version the replica then holds (see the module docstring)."""
        j = self.job
        resumed = self._load()
        capture = ChangeCapture(j.spark, name=j.name, source=j.source, changes=self.changes, plan=j.plan,
                                app=self.app, keeper=self.keeper, policy=self.policy, window=self.window,
                                clock=self.clock, fault=self.fault, resumed=resumed, on_captured=self._captured)
        self._capture = capture
        try:
            capture.start()
            plan = self._planned()
            if resumed:
                self._done = self._committed(plan)
                log.info("table %s: resuming the bootstrap at version %d: %d of %d chunks already committed",
                         j.name, j.version, len(self._done), len(plan.chunks or ()))
            self._report()
            self._copy_all(capture)
            capture.stop()
            capture.check()
            return self._apply(capture)
        finally:
            capture.close()

    def finish(self) -> None:
        """After the runner has saved the table as bootstrapped: drop the change log and the plan."""
        snapshot_copy.drop_path_table(self.job.spark, self.job.changes_path)
        self.store.forget(self.job.slug)

    def _load(self) -> bool:
        """Take the saved plan of this epoch (True), or save a new one (False)."""
        j = self.job
        document = self.store.load(j.slug, j.epoch)
        try:
            saved = None if document is None else BootstrapPlan.from_json(document)
        except OutdatedPlan as exc:
            raise BootstrapPlanOutdated(j.name, j.version, str(exc)) from exc
        if saved is not None and saved.version == j.version:
            self.keeper = PlanKeeper(saved, self._save)
            return True
        self.keeper.update(lambda p: p)
        return False

    # -- the plan --------------------------------------------------------------------------------

    def _latest(self) -> int:
        """The source's latest version (from its commit files when this process can see them)."""
        with self._head_lock:
            return self._heads.head(self.job.version).latest_version

    def _chunk_reads(self, version: int | None = None) -> snapshot_files.ChunkReads:
        """The chunk reads :func:`~lakemirror.sources.snapshot_files.choose_chunk_reads` chose, made
        once per run; ``version`` is where a plan is made (file groups are always V's)."""
        with self._lock:
            if self._reads is None:
                at = self.job.version if version is None or self.choice.kind == snapshot_files.DELTA_LOG_FILES \
                    else version
                self._reads = snapshot_files.chunk_reads(self.job.spark, self.job.source, at, self.job.plan.keys,
                                                         self.choice)
            return self._reads

    def _planned(self) -> BootstrapPlan:
        """The plan's chunks, planned now (the capturer running meanwhile) unless saved.

        Key ranges are planned at the source's latest version (the ranges cover the whole key
        domain at any version); groups of files at V, whose files they are."""
        plan = self.keeper.plan
        if plan.chunks is not None:
            return plan
        j = self.job
        for attempt in range(READ_ATTEMPTS):
            at = j.version if self.choice.kind == snapshot_files.DELTA_LOG_FILES else self._latest()
            try:
                reads = self._chunk_reads(at)
                chunks = reads.plan(self.policy.chunk_bytes)
                break
            except Exception as exc:
                if not time_travel_refused(exc):
                    raise
                self._reads = None
                if self.choice.kind == snapshot_files.DELTA_LOG_FILES or attempt == READ_ATTEMPTS - 1:
                    raise PinnedVersionAged(j.name, at) from exc
        log.info("table %s: bootstrap from version %d in %d chunk(s) (planned at version %d); %s", j.name, j.version,
                 len(chunks), at, self.choice.reason)
        note = getattr(reads, "note", None)
        if note:
            log.warning("table %s: bootstrap: %s", j.name, note)
        return self.keeper.update(lambda p: p.with_chunks(chunks))

    def _committed(self, plan: BootstrapPlan) -> set[int]:
        """The chunks the replica's transaction records name; the rows of those whose figures a
        crash kept from the plan are taken from their commits."""
        assert plan.chunks is not None
        found = snapshot_copy.recorded_transactions(self.job.spark, self.job.replica,
                                                    [chunk_app_id(self.app, c.number) for c in plan.chunks])
        done = {n for app in found if (n := chunk_number(self.app, app)) is not None}
        unknown = {n: TxnId(chunk_app_id(self.app, n), n).tag() for n in done
                   if n not in plan.reads or plan.reads[n].rows is None}
        if unknown:
            rows = snapshot_copy.committed_rows(self.job.spark, self.job.replica, set(unknown.values()))
            known = {n: ChunkRead(plan.floor(n), rows[tag]) for n, tag in unknown.items() if tag in rows}
            self.keeper.update(lambda p: replace(p, reads={**p.reads, **known}))
        return done

    # -- copying ---------------------------------------------------------------------------------

    def _copy_all(self, capture: ChangeCapture) -> None:
        j = self.job
        chunks = self.keeper.plan.chunks or ()
        pending = [c for c in chunks if c.number not in self._done]
        copying_since = self.clock()
        while pending:
            if self.stopping():
                raise BootstrapInterrupted(f"{j.name}: stopping; the bootstrap resumes at chunk "
                                           f"{pending[0].number} of {len(chunks)} on the next start")
            capture.check()
            if copy_budget_used(self.policy, now=self.clock(), since=copying_since):
                capture.capture()
                copying_since = self.clock()
            if 0 in {c.number for c in pending}:
                wave = [pending[0]]  # the first chunk creates (replaces) the replica: alone
            else:
                wave = pending[:max(1, self.policy.parallel_chunks)]
            self._copy_wave(wave)
            pending = [c for c in pending if c.number not in self._done]

    def _copy_wave(self, wave: list[Chunk]) -> None:
        if len(wave) == 1:
            self._copy(wave[0])
            return
        with ThreadPoolExecutor(max_workers=len(wave), thread_name_prefix=f"chunk:{self.job.slug}") as pool:
            futures = [pool.submit(self._copy, c) for c in wave]
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error

    def _read(self, chunk: Chunk) -> tuple[int, "DataFrame"]:
        """The chunk's rows and the version they are read at: the source's latest for a key range
        or the whole table, V for a group of V's files."""
        reads = self._chunk_reads()
        if chunk.paths:
            return self.job.version, reads.read(chunk, self.job.version)
        for attempt in range(READ_ATTEMPTS):
            version = self._latest()
            try:
                return version, reads.read(chunk, version)
            except Exception as exc:
                if not time_travel_refused(exc) or attempt == READ_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _copy(self, chunk: Chunk) -> None:
        j = self.job
        number = chunk.number
        with self.slots:
            t0 = self.clock()
            version, rows = self._read(chunk)
            self.keeper.update(lambda p: p.with_read(number, ChunkRead(version)))  # before the commit
            self.fault("bootstrap_inside_chunk")
            txn = TxnId(chunk_app_id(self.app, number), number)
            written = snapshot_copy.write_chunk(rows, j.replica, j.plan.columns, txn, first=number == 0,
                                                source_properties=j.source_properties)
            if written is None:
                written = snapshot_copy.committed_rows(j.spark, j.replica, {txn.tag()}, recent=8).get(txn.tag())
            seconds = self.clock() - t0
        self.keeper.update(lambda p: p.with_read(number, ChunkRead(version, written)))
        with self._lock:
            self._done.add(number)
            self._chunks_this_run += 1
            self._rows_this_run += written if written is not None else chunk.rows or 0
        progress = self._report()
        log.info("table %s: bootstrap chunk %d committed (%s rows read at source version %d, %.1fs): %s", j.name,
                 number, "?" if written is None else written, version, seconds,
                 "" if progress is None else progress.describe())
        self.fault("bootstrap_between_chunks")

    # -- the end -----------------------------------------------------------------------------------

    def _apply(self, capture: ChangeCapture) -> int:
        """Capture through the newest chunk's version (from the oldest chunk's, at the least), fix
        that end F in the plan, and MERGE what the chunks still need; F."""
        j = self.job
        plan = self.keeper.plan
        chunks = plan.chunks or ()
        if plan.final_through is None:
            floors = [plan.floor(c.number) for c in chunks]
            target = max([plan.captured_through, *floors])
            capture.capture(target, after=min(floors))
            plan = self.keeper.update(lambda p: p.with_final(max(target, p.captured_through)))
        through = plan.final_through
        assert through is not None
        applied = bootstrap_apply.apply_captured(j.spark, replica=j.replica, changes=self.changes, merge_plan=j.plan,
                                                 plan=plan, through=through, txn=TxnId(f"{self.app}/apply", 0))
        outcome = applied.outcome
        if outcome is not None:
            c = outcome.counts
            log.info("table %s: bootstrap applied %d captured change rows through source version %d to %s (%d "
                     "inserted, %d updated, %d deleted%s)", j.name, outcome.stats.rows_read, through,
                     f"{len(applied.chunks)} of {len(chunks)} chunks" if applied.chunks else "the replica",
                     c.inserted, c.updated, c.deleted, "; already committed" if outcome.replayed else "")
        elif plan.captures:
            log.info("table %s: bootstrap: no captured change was still needed through source version %d (each "
                     "chunk read them)", j.name, through)
        return through

    def _captured(self) -> None:
        self._report()

    def _report(self) -> BootstrapProgress | None:
        plan = self.keeper.plan
        if plan.chunks is None:
            return None
        with self._lock:
            done, rows_run, chunks_run = set(self._done), self._rows_this_run, self._chunks_this_run
        rows_total = None if any(c.rows is None for c in plan.chunks) else sum(c.rows or 0 for c in plan.chunks)
        progress = BootstrapProgress(
            version=plan.version, chunks_total=len(plan.chunks), chunks_done=len(done), rows_total=rows_total,
            rows_copied=plan.rows_copied(done), started_at=self._started, now=self.clock(),
            rows_copied_this_run=rows_run, chunks_copied=chunks_run, captured_through=plan.captured_through,
            captures=sum(1 for r in plan.captures if r.done), note=self._capture.note if self._capture else "")
        self.on_progress(progress)
        return progress


class ChunkedCopy:
    """A Delta replica's bootstrap copy as a :class:`ChunkedBootstrap`
    (:class:`lakemirror.supervisor.change_feed.bootstrap.SnapshotCopier`): the replica's schema is made, the
    chunks are copied beside the change capture, and the replica's properties then name the
    version it holds."""

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
                           layout.change_log_table(self.checkpoint_root, self.pipeline_id, self.slug, epoch),
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
