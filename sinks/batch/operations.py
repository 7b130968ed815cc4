"""The batch runner's operations: what it calls, and clone, reconcile and metadata sync on Spark.

:class:`Operations` is the seam between the batch runner (:mod:`lakemirror.supervisor.subtasks.batch_runner`:
attempts, retries, timeouts, audit) and the work itself: one operation of one table per call,
named by an attempt's tag, so that :meth:`Operations.cancel` can stop a timed-out attempt. An
operation reads only its job's source, target, key and options (:class:`BatchJob`), never the
attempts, timeout and backoff the runner retries it with.

Each attempt runs on a Spark session of its own (:class:`TaggedSessions`,
:func:`~lakemirror.tables.own_session`: Delta's transaction-id confs are session-wide, its temp
views stay apart; over Spark Connect a server session of its own, released when the attempt ends)
and tags its Spark jobs with the attempt's tag, so a timed-out attempt is cancelled by
``interruptTag`` (which Spark Connect has too). Tags are per session, so the session is kept while
the attempt runs. :class:`SparkOperations` runs the three Delta operations (clone, reconcile,
metadata) that way; the PostgreSQL cycles share the sessions.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol

from lakemirror.errors import NoUsableKey, TerminalError
from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.clone import CLONE_VERSION_PROPERTY, DeepCloner, DeltaCloner
from lakemirror.sinks.batch.metadata_sync import CATALOG_TAG, SCHEMA_TAG, VOLUME_TAG, MetadataSync, Overwrite
from lakemirror.sinks.batch.reconcile import ReconcileOptions, Reconciler
from lakemirror.sinks.batch.reconcile_plan import ReconcileResult
from lakemirror.sinks.batch.snapshot_copy import replica_properties
from lakemirror.sinks.batch.vacuum import vacuum_replica
from lakemirror.sinks.sql import SparkSql
from lakemirror.sources.catalog import Catalog, UnityCatalog
from lakemirror.sources.keys import choose_key
from lakemirror.tables import own_session, release_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class JobSettings(Protocol):
    """What an operation reads of its job's settings: the key columns configured for the table
    (empty: chosen from the table, :func:`~lakemirror.sources.keys.choose_key`) and the options of
    each operation, by operation name."""

    @property
    def keys(self) -> tuple[str, ...]: ...
    @property
    def options(self) -> Mapping[str, Mapping[str, Any]]: ...


class BatchJob(Protocol):
    """One table's job as an operation reads it (the batch runner's
    :class:`~lakemirror.supervisor.subtasks.batch_runner.TableJob` is one)."""

    @property
    def source(self) -> TableName: ...
    @property
    def target(self) -> TableName: ...
    @property
    def settings(self) -> JobSettings: ...


class Operations(Protocol):
    """Runs one operation on one table. ``tag`` names the attempt, so :meth:`cancel` can stop it."""

    def run(self, operation: str, job: BatchJob, tag: str) -> Mapping[str, Any]: ...
    def cancel(self, tag: str) -> None: ...


class TaggedSessions:
    """The sessions of the attempts running now, by tag."""

    def __init__(self, spark: "SparkSession") -> None:
        self.spark = spark
        self._lock = threading.Lock()
        self._sessions: dict[str, "SparkSession"] = {}

    @contextmanager
    def session(self, tag: str) -> Iterator["SparkSession"]:
        """A session of its own tagged ``tag`` for the block; untagged and released after it."""
        session = own_session(self.spark)
        with self._lock:
            self._sessions[tag] = session
        try:
            session.addTag(tag)
        except AttributeError:  # older APIs: job groups
            session.sparkContext.setJobGroup(tag, tag, interruptOnCancel=True)
        try:
            yield session
        finally:
            with self._lock:
                self._sessions.pop(tag, None)
            try:
                session.removeTag(tag)
            except AttributeError:
                pass
            release_session(session, self.spark)

    def cancel(self, tag: str) -> None:
        """Interrupt the Spark operations of the attempt tagged ``tag`` (nothing if it has ended)."""
        with self._lock:
            session = self._sessions.get(tag)
        if session is None:
            return
        try:
            session.interruptTag(tag)
        except AttributeError:  # older APIs: job groups
            session.sparkContext.cancelJobGroup(tag)


class ReplicaMismatch(TerminalError):
    """Reconciliation ran and found the replica different from its source (not repaired)."""

    code = "mismatch"

    def __init__(self, message: str, *, table: str, details: Mapping[str, Any]) -> None:
        super().__init__(message, table=table)
        self.details = dict(details)


class SparkOperations:
    """Clone, reconcile and metadata sync of one table; results of reconciliations are kept in
    :attr:`latest_results` (per source table) for a metrics layer to export."""

    def __init__(self, spark: "SparkSession", catalog: Catalog, results: Any, *, unity_catalog: bool = False,
                 run_id: str = "") -> None:
        self.spark = spark
        self.catalog = catalog
        self.results = results
        self.unity_catalog = unity_catalog
        self.run_id = run_id
        self.latest_results: dict[str, ReconcileResult] = {}
        self._lock = threading.Lock()  # guards latest_results (attempts run on several threads)
        self.sessions = TaggedSessions(spark)

    def cancel(self, tag: str) -> None:
        """Interrupt the attempt's Spark operations (tags are per session: use the attempt's)."""
        self.sessions.cancel(tag)

    def run(self, operation: str, job: BatchJob, tag: str) -> Mapping[str, Any]:
        with self.sessions.session(tag) as session:
            if operation == "clone":
                return self._clone(session, job)
            if operation == "reconcile":
                return self._reconcile(session, job)
            if operation == "metadata":
                return self._metadata(session, job)
            if operation == "vacuum":
                return self._vacuum(session, job)
            raise TerminalError(f"unknown operation {operation!r}", table=str(job.source))

    def _keys(self, session: "SparkSession", job: BatchJob, *, required: bool) -> tuple[str, ...]:
        info = self.catalog.describe(session, job.source)
        try:
            return tuple(choose_key(str(job.source), info.columns, configured=job.settings.keys,
                                    declared=info.declared_key).columns)
        except NoUsableKey:
            if required:
                raise
            return ()

    def _clone(self, session: "SparkSession", job: BatchJob) -> Mapping[str, Any]:
        if self.unity_catalog:
            sql = SparkSql(session)
            backing = UnityCatalog.backing_table(sql, job.source)  # a Streaming Table clones its backing table
            return dict(DeepCloner(sql).clone(job.source, job.target, read_from=backing).details())
        self.catalog.ensure_schema(session, job.target.catalog, job.target.schema)
        opts = job.settings.options.get("clone", {})
        result = DeltaCloner(session).clone(self.catalog.locate(job.source), self.catalog.locate(job.target),
                                            keys=self._keys(session, job, required=False),
                                            force_full=bool(opts.get("force_full", False)))
        return dict(result.details())

    def _reconcile(self, session: "SparkSession", job: BatchJob) -> Mapping[str, Any]:
        opts = job.settings.options.get("reconcile", {})
        options = ReconcileOptions(buckets=int(opts.get("buckets", 1024)),
                                   exclude_columns=tuple(opts.get("exclude_columns", ())),
                                   max_keys_reported=int(opts.get("max_keys_reported", 1000)),
                                   repair=bool(opts.get("repair", False)))
        source, target = self.catalog.locate(job.source), self.catalog.locate(job.target)
        # A cloned replica mirrors a known source version: compare with the source as of then,
        # so writes to the source since the clone are not reported as mismatches.
        mirrored = replica_properties(session, target).get(CLONE_VERSION_PROPERTY)
        version = int(mirrored) if mirrored and mirrored.isdigit() else None
        result = Reconciler(session).reconcile(source, target, self._keys(session, job, required=True), options,
                                               source_version=version, run_id=self.run_id)
        self.results.append(self.run_id, result)
        with self._lock:
            self.latest_results[str(job.source)] = result
        details = {"status": result.status, "source_version": result.source_version,
                   "source_rows": result.source_rows, "replica_rows": result.replica_rows,
                   "missing": result.missing, "extra": result.extra, "different": result.different,
                   "schema_diff": result.schema.describe(), "repaired": result.repaired}
        if not result.equal and not result.repaired:
            raise ReplicaMismatch(
                f"{job.target} differs from {job.source} at source version {result.source_version}: "
                f"{result.missing} missing, {result.extra} extra, {result.different} different keys; "
                f"rows {result.source_rows} vs {result.replica_rows}; schema: {result.schema.describe()}",
                table=str(job.source), details=details)
        return details

    def _vacuum(self, session: "SparkSession", job: BatchJob) -> Mapping[str, Any]:
        pipeline_id = str(job.settings.options.get("vacuum", {}).get("pipeline_id") or "")
        return vacuum_replica(session, self.catalog.locate(job.target), pipeline_id)

    def _metadata(self, session: "SparkSession", job: BatchJob) -> Mapping[str, Any]:
        opts = job.settings.options.get("metadata", {})
        kinds = list(opts.get("object_types", ()))
        overwrite = Overwrite(comments=bool(opts.get("overwrite_comments", True)),
                              properties=bool(opts.get("overwrite_properties", True)),
                              tags=bool(opts.get("overwrite_tags", True)))
        sync = MetadataSync(SparkSql(session), unity_catalog=self.unity_catalog)
        result = sync.sync_table(self.catalog.locate(job.source), self.catalog.locate(job.target), kinds, overwrite)
        container = []
        if set(kinds) & {CATALOG_TAG, SCHEMA_TAG, VOLUME_TAG}:
            container = sync.sync_container_tags(job.source, job.target, kinds, overwrite)
        return {"statements": len(result.statements) + len(container)}
