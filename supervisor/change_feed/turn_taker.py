"""One table's side of the turn pool (:mod:`..apply_workers.worker_pool`): is it ready, has it work, take a turn.

The table's query stays up and each batch waits for its turn at the table's gate: a turn lets the
held or waiting batch go and waits until it is applied. With a session of its own JVM the gate is
in the daemon (:mod:`..apply_workers.query_gate`); through Spark Connect, where the batch function runs on the
server, it is a folder of files beside the query's checkpoint
(:mod:`lakemirror.sinks.merge.connect_gate`), taken the same way. A table whose batches the daemon
plans from its source's commit files (:class:`~lakemirror.supervisor.change_feed.commit_file_batches.FeedBatches`)
applies its next batch that way first, and starts its query with a ``once`` or ``availableNow``
trigger (:func:`~lakemirror.supervisor.apply_workers.worker_pool.one_batch_turn` chooses) only for a batch Spark is to
plan, waiting for its end. Either way a failure is reported through the runner's poll like a
failed always-on query.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from lakemirror.errors import LakemirrorError
from lakemirror.sinks.merge.connect_batches import server_batch_cause
from lakemirror.delta_log.commit_times import CommitLog
from lakemirror.supervisor.apply_workers import worker_pool
from lakemirror.supervisor.apply_workers.query_gate import Gate
from lakemirror.supervisor.change_feed.batch_apply import Drained
from lakemirror.supervisor.change_feed.shared_state import TableLive
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.classify_errors import classify
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

    from lakemirror.supervisor.change_feed.commit_file_batches import FeedBatches

log = logging.getLogger(__name__)

#: How often a turn's worker looks at the query while it waits for the turn's batch to begin.
GATE_POLL_SECONDS = 0.02
#: The longest a turn waits for its batch to begin once Spark has committed the batch before it,
#: while Spark has not said whether its next trigger found new data (it lists the source and plans
#: the batch meanwhile: far longer for a source on object storage, whose snapshot Delta rebuilds
#: with Spark jobs, than on the driver's disk). Only a stuck trigger reaches it.
GATE_PLAN_TIMEOUT_SECONDS = 30.0
#: How long a turn waits, once Spark has committed the batch before it, for Spark to start its
#: next trigger at all (a query behind its trigger schedule starts it at once).
GATE_IDLE_SECONDS = 1.0


class TableTurns:
    """The turns of one table's query. ``gate`` / ``turn_query`` are set when its query is wired."""

    def __init__(self, live: TableLive, spec: PipelineSpec, label: str, *,
                 commit_files: Callable[[], CommitLog | None],
                 failed: Callable[[LakemirrorError], sm.Failed],
                 collect: Callable[[], None], track: Callable[["StreamingQuery"], None],
                 on_server: Callable[[], bool] | None = None) -> None:
        self.live = live
        self.spec = spec
        self.label = label
        self.commit_files = commit_files
        self.failed = failed
        self.collect = collect
        self.track = track
        #: Whether the batch being applied is past its Spark and driver work, on its destination's
        #: server (a PostgreSQL replica's transaction): the turn's worker is then free (see
        #: :meth:`_take_gated`). None: the whole apply is Spark's work (a Delta replica).
        self.on_server = on_server
        self.lock = threading.Lock()
        self.gate: Gate | None = None
        #: Starts the table's query (True: a ``once`` trigger); set while ready for a turn.
        self.turn_query: Callable[[bool], "StreamingQuery"] | None = None
        self.last_trigger: str | None = None  # how its latest turn ran: gated, commit files, once or availableNow
        #: The batches the daemon plans from the source's commit files (set with ``turn_query``).
        self.feed: "FeedBatches | None" = None

    def reset(self) -> None:
        self.turn_query, self.gate, self.feed = None, None, None

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) for a turn in flight to end. False: still running then."""
        if self.lock.acquire(timeout=max(0.0, timeout)):
            self.lock.release()
            return True
        return False

    def ready(self) -> bool:
        if self.live.draining:
            return False
        if self.gate is not None:
            return self.gate.ready
        # A batch whose checkpoint row is still being appended is not yet in the query's log: the
        # table's next batch is planned once it is.
        return self.turn_query is not None and (self.feed is None or self.feed.settled)

    def has_pending(self) -> bool | None:
        """Whether the source has a commit the replica has not applied; None: cannot tell cheaply.

        True until a turn has run since the launch: that turn proves the table healthy (a table
        retrying after failures is not running again before it), whether or not there is data."""
        if self.gate is not None and self.gate.waiting:
            return True  # Spark planned a batch already
        through = self.live.applied_through
        if not self.live.turn_proven:
            return True
        if through is None:
            return None
        commits = self.commit_files()
        return None if commits is None else commits.has_commit(through + 1)

    def small_backlog(self) -> bool | None:
        """Whether fewer than ``ONE_BATCH_VERSIONS`` source versions are unapplied (one commit-file
        check); None when that cannot be told cheaply."""
        through = self.live.applied_through
        if through is None:
            return None
        commits = self.commit_files()
        if commits is None:
            return None
        try:
            return not commits.has_commit(through + worker_pool.ONE_BATCH_VERSIONS)
        except Exception:  # noqa: BLE001 (an unreadable log: the turn splits as usual)
            return None

    def take(self) -> None:
        """Apply everything the table's change feed holds at the start of the turn, then return."""
        live = self.live
        with self.lock:
            gate, query = self.gate, live.query
            if gate is not None:
                if query is not None and not live.draining:
                    self._take_gated(gate, query)
                return
            start = self.turn_query
            if start is None or live.draining:
                return
            if self.feed is not None and self._take_from_commit_files(self.feed):
                return
            spec = self.spec
            once = worker_pool.one_batch_turn(
                rate_limited=bool(spec.max_files_per_trigger or spec.max_bytes_per_trigger),
                proven=live.turn_proven, small_backlog=self.small_backlog())
            self.last_trigger = "once" if once else "availableNow"
            try:
                query = start(once)
                live.query = query
                query.awaitTermination()
            except Exception as exc:
                live.query = None
                if live.draining:
                    return  # the drain refused the next batch (Drained): nothing was applied
                self.turn_query = None
                live.emit(self.failed(live.batch_error or classify(server_batch_cause(exc), table=self.label)))
                return
            live.query = None
            self.collect()
            if not live.turn_proven:
                live.turn_proven = True  # a turn that ran to its end (even with nothing new) proves the table
                live.emit(sm.BatchApplied())
            self.track(query)

    def _take_from_commit_files(self, feed: "FeedBatches") -> bool:
        """The table's next batch planned from its source's commit files and applied; False when Spark
        is to plan this turn's batch (nothing was applied, or a logged batch is left for Spark to re-run)."""
        live = self.live
        try:
            handed_over = feed.take()
        except Drained:
            return True
        except Exception as exc:
            if live.draining:
                return True
            self.turn_query = None
            live.emit(self.failed(live.batch_error or classify(exc, table=self.label)))
            return True
        if handed_over is not None:
            return False
        self.last_trigger = "commit files"
        if not live.turn_proven:
            live.turn_proven = True  # a turn that ran to its end (even with nothing new) proves the table
            live.emit(sm.BatchApplied())
        return True

    def _take_gated(self, gate: Gate, query: "StreamingQuery") -> None:
        """Let the table's held or waiting batch go, and wait until the turn's batch is applied.

        A query that failed meanwhile ends the turn; the runner's poll reports it. A turn in which
        no batch begins is withdrawn (:func:`settled_without_batch`) once Spark has committed the
        batch before it and either the source has no commit beyond what is applied or Spark's
        next trigger found no new data: the query then looks for new commits by itself. While
        Spark is still planning that trigger the turn waits for it: a turn withdrawn while its
        batch is being planned leaves that batch waiting a whole round of the other tables' turns,
        and the commits it holds that much later on the replica."""
        self.last_trigger = "gated"
        held = gate.held_batch
        since = gate.grant()
        committed_at: float | None = None if held is not None else time.monotonic()
        poll = getattr(gate, "poll_seconds", GATE_POLL_SECONDS)  # a gate of files is looked at less often
        try:
            while not gate.wait_ended(since, poll):
                if gate.applying:
                    if self.on_server is not None and self.on_server():
                        # The rest of the batch is the server's work, and may wait there (a lock,
                        # a server that does not answer): free the worker for the other tables.
                        # The table's next turn comes once its batch has left the gate.
                        return
                    continue  # a batch ends by leaving the gate, even when it fails
                if self.live.draining or not query.isActive:
                    gate.withdraw()
                    return
                if committed_at is None:
                    if not committed(query, held):
                        continue
                    committed_at = time.monotonic()
                    self.track(query)
                    if self._nothing_new() and gate.withdraw():
                        return
                if settled_without_batch(trigger_status(query), time.monotonic() - committed_at) and gate.withdraw():
                    return
        except Exception as exc:  # noqa: BLE001 (a query stopping under us: poll() reports a failure)
            log.debug("table %s: turn ended early: %s", self.label, exc)
            gate.withdraw()

    def _nothing_new(self) -> bool:
        try:
            return self.has_pending() is False
        except Exception:  # noqa: BLE001 (an unreadable log: give Spark its settle time)
            return False


def trigger_status(query: "StreamingQuery") -> dict[str, object] | None:
    """Spark's status of the query (``isDataAvailable``, ``isTriggerActive``, ``message``); None
    when it cannot be read."""
    try:
        return dict(query.status)
    except Exception:  # noqa: BLE001 (a query stopping under us: the timeout still applies)
        return None


def settled_without_batch(status: dict[str, object] | None, waited: float,
                          timeout: float = GATE_PLAN_TIMEOUT_SECONDS, idle: float = GATE_IDLE_SECONDS) -> bool:
    """Whether a turn whose previous batch Spark committed ``waited`` seconds ago will get no
    batch. Pure.

    - Spark's latest trigger found no new data: after the committed batch's trigger (which had
      data) Spark reports ``isDataAvailable`` true until a later trigger has listed the source and
      found nothing, so false outside a trigger is that answer, never the moment between two;
    - no trigger is running ``idle`` seconds after the commit: Spark waits for its trigger's next
      time (a trigger interval longer than the turns' spacing), and the batch waits for a turn;
    - a trigger still planning after ``timeout`` seconds (a stuck listing).
    While a trigger runs (``isTriggerActive``) Spark is planning the batch: the turn waits for it."""
    if waited >= timeout:
        return True
    if status is None:
        return waited >= idle
    if status.get("isTriggerActive") is not False:
        return False
    return status.get("isDataAvailable") is False or waited >= idle


def committed(query: "StreamingQuery", batch_id: int | None) -> bool:
    """Whether Spark has finished the trigger of ``batch_id`` (committed it)."""
    progress = query.lastProgress
    return bool(progress) and batch_id is not None and int(progress["batchId"]) >= batch_id  # type: ignore[index]
