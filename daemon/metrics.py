"""Every Prometheus metric lakemirror exports, declared once, with units in the names.

Labels stay bounded: pipeline, table, op, state, task (a configured sub-task name), status
(success | failed), kind (missing | extra | different). Never keys, never error texts.
This module is the supervisor's :class:`~lakemirror.supervisor.control.observer.Observer` and the
scheduled sub-tasks' :class:`~lakemirror.supervisor.subtasks.service.SubtaskObserver`.
"""

from __future__ import annotations

import copy
import time
from typing import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lakemirror import __version__
from lakemirror.daemon.jars import DELTA_VERSION, SPARK_VERSION
from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.supervisor.change_feed.table_runner import BatchReport
from lakemirror.supervisor.control.lag import CommittedAt, HeldVersion, LagReading, as_of
from lakemirror.supervisor.control.table_state import TableState, TableStatus
from lakemirror.supervisor.events.stream_runner import RUNNER_PREFIX, DeadLetterTally, EventBatchReport, EventLagReading

STATES = [s.value for s in TableState]

#: A pipeline's change-feed dead letters per table, asked at each scrape: (pipeline, pending, recorded).
FeedLetterCounts = tuple[str, Callable[[], Mapping[str, int]], Callable[[], Mapping[str, int]]]


class FeedLetterCollector(Collector):
    """The change-feed tables' dead letters, read from each pipeline's desk at scrape time (the desk
    counts them as batches record them and operators resolve them, and reads them from the table at
    start): always the current count, never a value a missed update left behind."""

    def __init__(self) -> None:
        self.sources: list[FeedLetterCounts] = []
        #: Tables that had pending letters: shown at 0 once resolved, rather than vanishing.
        self._seen: dict[str, set[str]] = {}

    def forget(self, pipeline: str) -> None:
        """Stop asking a pipeline that no longer runs."""
        self.sources = [s for s in self.sources if s[0] != pipeline]
        self._seen.pop(pipeline, None)

    def collect(self) -> Iterator[Metric]:
        pending = GaugeMetricFamily("lakemirror_feed_dead_letters_pending", "Dead letters of a change-feed table "
                                    "waiting for the operator (neither skipped nor replayed), as the pipeline's "
                                    "_lakemirror_dead_letters table holds them (carried over restarts).",
                                    labels=["pipeline", "table"])
        total = CounterMetricFamily("lakemirror_feed_dead_letters", "Changes of a change-feed table its replica "
                                    "refused, dead-lettered by this process's batches (a replayed batch's count "
                                    "once).", labels=["pipeline", "table"])
        for pipeline, pending_of, recorded_of in list(self.sources):
            try:
                now, recorded = dict(pending_of()), dict(recorded_of())
            except Exception:  # noqa: BLE001 (a scrape never fails on one pipeline's counts)
                continue
            seen = self._seen.setdefault(pipeline, set())
            seen.update(now)
            for table in sorted(seen):
                pending.add_metric([pipeline, table], now.get(table, 0))
            for table, n in sorted(recorded.items()):
                total.add_metric([pipeline, table], n)
        yield pending
        yield total


class Metrics:
    """The daemon's registry; one instance per process (tests make their own)."""

    def __init__(self, pipeline_id: str, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.pipeline = pipeline_id
        #: The time a scrape reads the lag at (see :meth:`lag_measured`).
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        r, t = self.registry, ["pipeline", "table"]
        self.lag = Gauge("lakemirror_lag_seconds", "Seconds since the oldest source commit not yet applied "
                         "(0 when caught up).", t, registry=r)
        self.behind = Gauge("lakemirror_versions_behind", "Source versions committed but not yet applied.", t, registry=r)
        self.last_version = Gauge("lakemirror_last_applied_version", "Highest source version fully applied.", t, registry=r)
        self.headroom = Gauge("lakemirror_retention_headroom_seconds",
                              "Seconds until the oldest source version not yet applied may be vacuumed or "
                              "log-cleaned (the whole retention window when caught up).", t, registry=r)
        self.source_version = Gauge("lakemirror_source_latest_version", "Latest source version seen.", t, registry=r)
        self.rows = Counter("lakemirror_rows_applied_total", "Replica rows changed, by operation.",
                            [*t, "op"], registry=r)
        self.rows_read = Counter("lakemirror_change_rows_read_total", "Change-feed rows read.", t, registry=r)
        self.batches = Counter("lakemirror_batches_total", "Micro-batches applied.", t, registry=r)
        self.batch_paths = Counter("lakemirror_batch_paths_total", "Micro-batches applied, by the engine that read "
                                   "their change rows (spark, delta-rs) and the path that wrote them (spark-merge, "
                                   "spark-rewrite, delta-rs-merge, driver-deletion-vectors).",
                                   [*t, "read", "write"], registry=r)
        self.replays = Counter("lakemirror_batches_replayed_total", "Micro-batches found already committed "
                               "(skipped by Delta transaction ids).", t, registry=r)
        self.duration = Histogram("lakemirror_batch_duration_seconds", "Time to apply one micro-batch.", t,
                                  buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.last_success = Gauge("lakemirror_last_batch_success_timestamp_seconds",
                                  "Unix time of the last applied micro-batch.", t, registry=r)
        self.state = Gauge("lakemirror_table_state", "1 for the table's current state, 0 for the others.",
                           [*t, "state"], registry=r)
        self.retries = Counter("lakemirror_retries_total", "Retries scheduled for degraded tables.", t, registry=r)
        self.failures = Gauge("lakemirror_consecutive_failures", "Consecutive failures of the table.", t, registry=r)
        self.next_retry = Gauge("lakemirror_next_retry_timestamp_seconds",
                                "Unix time of the next retry of a degraded table (0 if none).", t, registry=r)
        latency_buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        self.flush = Histogram("lakemirror_sink_flush_seconds", "Time of one commit to the destination by the sink "
                               "(a Postgres flush: one transaction). Spark's e2e latency leaves it out.", t,
                               buckets=latency_buckets, registry=r)
        self.stream_latency = Gauge("lakemirror_stream_latency_seconds", "Latencies of the last batch from the "
                                    "query's progress, by kind (processing | source_queuing | e2e), where the Spark "
                                    "build reports them (Real-Time Mode).", [*t, "kind"], registry=r)
        k = ["pipeline", "task"]
        self.subtask_runs = Counter("lakemirror_subtask_runs_total", "Runs of a scheduled sub-task, by outcome "
                                    "(status = success | failed).", [*k, "status"], registry=r)
        self.subtask_last_success = Gauge("lakemirror_subtask_last_success_timestamp_seconds",
                                          "Unix time a scheduled sub-task last finished with every operation "
                                          "succeeding.", k, registry=r)
        self.subtask_next_run = Gauge("lakemirror_subtask_next_run_timestamp_seconds",
                                      "Unix time of a scheduled sub-task's next run.", k, registry=r)
        self.mismatched = Gauge("lakemirror_reconcile_mismatched_keys", "Keys the last reconciliation found "
                                "different from the source, by kind (missing | extra | different).",
                                [*t, "kind"], registry=r)
        e = ["pipeline", "source", "table"]
        self.event_rows = Counter("lakemirror_event_rows_applied_total", "Replica rows changed by an event source, "
                                  "per replica table and operation (insert | update | delete).", [*e, "op"], registry=r)
        self.event_stale = Counter("lakemirror_event_changes_stale_total", "Changes of an event source that changed no "
                                   "replica row: not newer than its row, tombstone or truncate floor, or a delete of a "
                                   "key the replica does not hold.", e, registry=r)
        self.event_lag = Histogram("lakemirror_event_time_lag_seconds", "Per applied change: seconds from its commit at "
                                   "the source (the event's ts_ms) to its commit in the replica.", e,
                                   buckets=(0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=r)
        self.event_batch_lag = Gauge("lakemirror_event_batch_lag_seconds", "The last batch's oldest change: seconds "
                                     "from its source commit to its replica commit.", e, registry=r)
        self.dead_letters = Counter("lakemirror_dead_letters_total", "Events an event source put in its dead-letter "
                                    "table (undecodable, no key, not fitting the replica, or refused by it) since the "
                                    "daemon started (a redelivered message counts once).", ["pipeline", "source"],
                                    registry=r)
        self.dead_letters_pending = Gauge("lakemirror_dead_letters_pending", "Dead letters of an event source waiting "
                                          "for the operator (neither skipped nor replayed), per table, as its "
                                          "dead-letter table holds them (carried over restarts).",
                                          ["pipeline", "source", "table"], registry=r)
        self._pending_tables: dict[str, set[str]] = {}
        self.offsets_behind = Gauge("lakemirror_kafka_offsets_behind", "Kafka messages not yet applied, per "
                                    "topic-partition: the broker's end offset minus the last applied batch's end "
                                    "offset.", ["pipeline", "source", "topic", "partition"], registry=r)
        self.boot_chunks_done = Gauge("lakemirror_bootstrap_chunks_done", "Chunks of the table's running bootstrap "
                                      "committed to the replica (equal to the total once it has ended).", t, registry=r)
        self.boot_chunks_total = Gauge("lakemirror_bootstrap_chunks_total", "Chunks the table's running (or last) "
                                       "bootstrap copies its snapshot in.", t, registry=r)
        self.boot_rows = Counter("lakemirror_bootstrap_rows_copied_total", "Snapshot rows this process's bootstrap "
                                 "chunks wrote to the replica (each chunk commit's numOutputRows; the planned rows "
                                 "when a commit does not say).", t, registry=r)
        self._boot_rows_seen: dict[str, int] = {}
        self.feed_letters = FeedLetterCollector()
        r.register(self.feed_letters)
        self.build = Info("lakemirror_build", "Versions of lakemirror, Spark and Delta.", registry=r)
        self.build.info({"version": __version__, "spark": SPARK_VERSION, "delta": DELTA_VERSION})
        #: Every labelled series family above (each has a ``pipeline`` label; most a ``table`` one).
        self._families = [m for m in vars(self).values() if isinstance(m, (Gauge, Counter, Histogram))]

    def for_pipeline(self, pipeline_id: str) -> "Metrics":
        """The metrics of another pipeline of this process: the same collectors and registry (one
        ``/metrics``), its own label and its own bookkeeping (two pipelines may name the same table)."""
        other = copy.copy(self)
        other.pipeline = pipeline_id
        other._pending_tables, other._boot_rows_seen = {}, {}
        return other

    def pipeline_removed(self) -> None:
        """Forget this pipeline's series (a pipeline posted to the API and stopped): a lag gauge left
        behind would go on ageing for a pipeline that no longer runs."""
        for family in self._families:
            family.remove_by_labels({"pipeline": self.pipeline})
        self.feed_letters.forget(self.pipeline)

    def watch_feed_letters(self, pending: Callable[[], Mapping[str, int]],
                           recorded: Callable[[], Mapping[str, int]]) -> None:
        """Export this pipeline's change-feed dead letters per table (pending, and recorded since the
        start), asked at each scrape."""
        self.feed_letters.sources.append((self.pipeline, pending, recorded))

    def _l(self, table: str) -> dict[str, str]:
        return {"pipeline": self.pipeline, "table": table}

    # Observer ---------------------------------------------------------------------------------

    def state_changed(self, table: str, status: TableStatus) -> None:
        for s in STATES:
            self.state.labels(**self._l(table), state=s).set(1 if s == status.state.value else 0)
        self.failures.labels(**self._l(table)).set(status.failures)
        self.next_retry.labels(**self._l(table)).set(status.next_retry_at or 0)

    def batch_applied(self, table: str, report: BatchReport) -> None:
        if isinstance(report, DeadLetterTally):  # not a batch: the dead-letter counts alone
            self._pending(report)
            return
        lab = self._l(table)
        counts = report.outcome.counts
        for op, n in (("insert", counts.inserted), ("update", counts.updated), ("delete", counts.deleted)):
            self.rows.labels(**lab, op=op).inc(n)
        self.rows_read.labels(**lab).inc(report.outcome.stats.rows_read)
        self.batches.labels(**lab).inc()
        self.batch_paths.labels(**lab, read=report.outcome.read, write=report.outcome.write).inc()
        if report.outcome.replayed:
            self.replays.labels(**lab).inc()
        self.duration.labels(**lab).observe(report.duration_seconds)
        self.last_success.labels(**lab).set(report.ended_at)
        latency = report.latency
        if latency is not None:
            for seconds in latency.flush_seconds:
                self.flush.labels(**lab).observe(seconds)
            for kind, ms in (("processing", latency.processing_ms), ("source_queuing", latency.source_queuing_ms),
                             ("e2e", latency.e2e_ms)):
                if ms is not None:
                    self.stream_latency.labels(**lab, kind=kind).set(ms / 1000)
        if isinstance(report, EventBatchReport):
            self._event_batch(report)

    def _pending(self, report: EventBatchReport) -> None:
        """The pending dead letters per table; a table whose letters were all resolved goes to 0."""
        seen = self._pending_tables.setdefault(report.source, set())
        for table in seen | set(report.pending):
            self.dead_letters_pending.labels(pipeline=self.pipeline, source=report.source,
                                             table=table).set(report.pending.get(table, 0))
        seen.update(report.pending)

    def _event_batch(self, report: EventBatchReport) -> None:
        if report.dead_letters:
            self.dead_letters.labels(pipeline=self.pipeline, source=report.source).inc(report.dead_letters)
        self._pending(report)
        for table, done in report.replicas.items():
            lab = {"pipeline": self.pipeline, "source": report.source, "table": table}
            for op, n in (("insert", done.inserted), ("update", done.updated), ("delete", done.deleted)):
                self.event_rows.labels(**lab, op=op).inc(n)
            self.event_stale.labels(**lab).inc(done.stale)
            for seconds in done.event_lags_seconds:
                self.event_lag.labels(**lab).observe(seconds)
            if done.event_lags_seconds:
                self.event_batch_lag.labels(**lab).set(max(done.event_lags_seconds))

    def lag_measured(self, table: str, reading: LagReading, held: HeldVersion | None = None,
                     committed_at: CommittedAt | None = None) -> None:
        lab = self._l(table)
        # The lag as of each scrape, not of the reading: between two readings of the source (a probe
        # round, slower with many tables or over Spark Connect) the oldest unapplied commit keeps
        # ageing, and a gauge set to the reading's value would show it frozen (LagReading.lag_at);
        # a batch that lands between two readings counts at once (``held``: the version the
        # replica holds at the scrape), as the status API counts it; and a commit made since a
        # reading that found the replica caught up counts at once too (``committed_at``).
        clock = self.clock
        self.lag.labels(**lab).set_function(lambda: as_of(reading, held, clock(), committed_at).lag_seconds)
        self.behind.labels(**lab).set_function(lambda: as_of(reading, held, clock(), committed_at).versions_behind)
        self.last_version.labels(**lab).set_function(lambda: as_of(reading, held, clock()).applied_through_version)
        self.source_version.labels(**lab).set(reading.latest_source_version)
        if reading.retention_headroom_seconds is not None:
            self.headroom.labels(**lab).set(reading.retention_headroom_seconds)
        if isinstance(reading, EventLagReading):
            source = table[len(RUNNER_PREFIX):] if table.startswith(RUNNER_PREFIX) else table
            for (topic, partition), n in reading.offsets_behind.items():
                self.offsets_behind.labels(pipeline=self.pipeline, source=source, topic=topic,
                                           partition=str(partition)).set(n)

    def retry_scheduled(self, table: str, status: TableStatus) -> None:
        self.retries.labels(**self._l(table)).inc()

    def bootstrap_progressed(self, table: str, progress: BootstrapProgress) -> None:
        lab = self._l(table)
        self.boot_chunks_done.labels(**lab).set(progress.chunks_done)
        self.boot_chunks_total.labels(**lab).set(progress.chunks_total)
        # This process's rows: a resumed bootstrap's earlier runs counted in their own processes.
        copied = progress.rows_copied_this_run
        seen = self._boot_rows_seen.get(table, 0)
        added = copied - seen if copied >= seen else copied
        self._boot_rows_seen[table] = copied
        if added > 0:
            self.boot_rows.labels(**lab).inc(added)

    # SubtaskObserver ---------------------------------------------------------------------------

    def subtask_scheduled(self, task: str, next_run_at: float | None) -> None:
        self.subtask_next_run.labels(pipeline=self.pipeline, task=task).set(next_run_at or 0)

    def subtask_finished(self, task: str, ok: bool, finished_at: float, next_run_at: float | None) -> None:
        self.subtask_runs.labels(pipeline=self.pipeline, task=task, status="success" if ok else "failed").inc()
        if ok:
            self.subtask_last_success.labels(pipeline=self.pipeline, task=task).set(finished_at)
        self.subtask_scheduled(task, next_run_at)

    def reconcile_measured(self, table: str, samples: Mapping[str, int]) -> None:
        for kind, n in samples.items():
            self.mismatched.labels(**self._l(table), kind=kind).set(n)
