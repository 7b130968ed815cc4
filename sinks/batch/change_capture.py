"""The change capture of a chunked bootstrap: the source's change feed after the pinned version,
copied into a Delta table of the bootstrap's own (its *change log*) before the source's retention
lets it go.

It runs on a thread of its own, with a Spark session of its own, beside the planning and the chunk
copies, at the pace :mod:`lakemirror.sinks.batch.capture_policy` sets from the source's change
window; the copying thread also asks for captures (between chunks when a copying budget is set, and
one last time when every chunk is copied). Captures never touch the replica: each appends the
change rows of a version range to the change log, so it costs what its changes cost.

Each capture round is saved in the bootstrap's plan with its version range before it reads
anything, and committed to the change log under a Delta transaction id of its own (the round
number as its version): a round redone after a crash reads the same range, and Delta skips it if
its first attempt committed.

A read Delta refuses because its first version has aged past the source's retention means the
window closed. Before this run has seen the window open (a bootstrap resumed after its process was
stopped for longer than the window) that is :class:`~lakemirror.errors.ChangeWindowExpired`, handled
by ``change_window_policy``; once it has, the capture could not keep up, and that is
:class:`~lakemirror.errors.BootstrapCannotConverge`, naming the retention this bootstrap needs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from lakemirror import tables
from lakemirror.errors import BootstrapCannotConverge, ChangeWindowExpired
from lakemirror.sinks.batch import snapshot_copy
from lakemirror.sinks.batch.bootstrap_plan import BootstrapPolicy, CaptureRound, PlanKeeper
from lakemirror.sinks.batch.capture_policy import (duration_text, interval_text, needed_window_seconds,
                                                   next_capture, poll_seconds, window_at_risk)
from lakemirror.sinks.merge.planner import CDF_COLUMNS, MergePlan
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.head_probe import HeadReader
from lakemirror.sources.retention import RetentionWindow, time_travel_refused
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class ChangeCapture:
    """Keeps a bootstrapping table's change feed in its change log (see the module docstring).

    Lifecycle: :meth:`start` (redo what a crash left unfinished, start the thread), :meth:`check`
    (raise what the thread failed with), :meth:`capture` (a round on the caller's thread),
    :meth:`stop` (end the thread), :meth:`close` (stop, then give back the session, if one was made)."""

    def __init__(self, spark: "SparkSession", *, name: str, source: TableLocation, changes: TableLocation,
                 plan: MergePlan, app: str, keeper: PlanKeeper, policy: BootstrapPolicy, window: RetentionWindow,
                 clock: Callable[[], float], fault: Callable[[str], None], resumed: bool,
                 on_captured: Callable[[], None] = lambda: None) -> None:
        self.spark, self.name, self.source, self.changes = spark, name, source, changes
        self.plan, self.app, self.keeper, self.policy, self.window = plan, app, keeper, policy, window
        self.clock, self.fault, self.resumed, self.on_captured = clock, fault, resumed, on_captured
        self._session: "SparkSession | None" = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()      # one capture (or look at the log) at a time
        self._error: BaseException | None = None
        self._seen_open = not resumed      # this run has seen the window open
        self._seconds = 0.0                # the slowest capture so far
        self._oldest_age = 0.0             # the oldest a change was when its capture began
        self._warned = False
        self._head_reader: HeadReader | None = None
        #: The latest thing worth showing a person (a window at risk); empty while all is well.
        self.note = ""

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Redo the rounds a crash left unfinished, then start capturing. The session of its own is
        made when first needed: a bootstrap that ends before the window asks for a capture makes none."""
        self.redo_unfinished()
        self._thread = threading.Thread(target=self._loop, name=f"capture:{self.name}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise the error the capturing thread stopped on, if any."""
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """End the capturing thread (after its capture in flight); the session stays for
        :meth:`capture`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self.stop()
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            tables.release_session(session, self.spark)

    def _heads(self) -> HeadReader:
        """The source's head reader (used under the capture lock): its commit files, read by this
        process where it can; else its history, through the bootstrap's session."""
        if self._head_reader is None:
            self._head_reader = HeadReader(self.spark, self.source)
        return self._head_reader

    @property
    def session(self) -> "SparkSession":
        """The capture's own session (used under the capture lock)."""
        if self._session is None:
            self._session = tables.own_session(self.spark)
        return self._session

    # -- capturing ----------------------------------------------------------------------------------

    def redo_unfinished(self) -> None:
        """Capture again every round a crash left unfinished, with its saved range and id."""
        for r in sorted(self.keeper.plan.captures, key=lambda x: x.number):
            if not r.done:
                with self._lock:
                    self._write(r, age=None)

    def capture(self, through: int | None = None, *, after: int | None = None) -> None:
        """One round on the caller's thread: from the change log's end (or ``after``, when later:
        versions no chunk needs) through ``through`` (default: the source's latest)."""
        with self._lock:
            start = self.keeper.plan.captured_through
            if after is not None:
                start = max(start, after)
            head = self._heads().head(start)
            end = head.latest_version if through is None else through
            if end <= start:
                return
            committed = head.commit_times.get(start + 1)
            self._round(start, end, None if committed is None else self.clock() - committed)

    def _loop(self) -> None:
        wait = 0.0 if self.resumed else poll_seconds(self.policy, self.window.seconds)
        while not self._stop.wait(wait):
            try:
                wait = self._tick()
            except BaseException as exc:  # noqa: BLE001 (kept for the copying thread: check() raises it)
                self._error = exc
                log.warning("table %s: bootstrap change capture stopped: %s", self.name, exc)
                self.note = f"the change capture stopped: {exc}"
                self.on_captured()
                return

    def _tick(self) -> float:
        with self._lock:
            through = self.keeper.plan.captured_through
            head = self._heads().head(through)
            now = self.clock()
            pending = head.latest_version > through
            oldest = head.commit_times.get(through + 1) if pending else None
            if not pending or (oldest is not None and now - oldest < self.window.seconds):
                self._seen_open = True
            step = next_capture(self.policy, now=now, window_seconds=self.window.seconds, captured_through=through,
                                latest_version=head.latest_version, oldest_pending_at=oldest,
                                capture_seconds=self._seconds)
            if not step.capture:
                return step.wait_seconds
            (log.warning if step.urgent else log.debug)("table %s: bootstrap capture: %s", self.name, step.reason)
            self._round(through, head.latest_version, None if oldest is None else now - oldest)
            return 0.0

    def _round(self, after: int, through: int, age: float | None) -> None:
        numbers = [r.number for r in self.keeper.plan.captures]
        r = CaptureRound(max(numbers) + 1 if numbers else 0, after, through)
        self.keeper.update(lambda p: p.with_capture(r))  # the range is fixed before anything is read
        self._write(r, age)

    def _write(self, r: CaptureRound, age: float | None) -> None:
        session = self.session
        started = self.clock()
        try:
            feed = tables.read(session, self.source, readChangeFeed="true", startingVersion=r.after + 1,
                               endingVersion=r.through)
        except Exception as exc:
            if time_travel_refused(exc):
                raise self._closed(r.after + 1, age) from exc
            raise
        quoted = [f"`{c.replace('`', '``')}`" for c in (*self.plan.column_names, *CDF_COLUMNS)]
        rows = feed.where(self.plan.change_filter).select(*quoted)
        txn = TxnId(f"{self.app}/capture", r.number)
        written = snapshot_copy.write_counted(rows, self.changes, "append", txnAppId=txn.app_id,
                                              txnVersion=str(txn.version), userMetadata=txn.tag())
        self.fault("bootstrap_after_capture")
        self.keeper.update(lambda p: p.with_capture(replace(r, done=True)))
        self._seen_open = True
        seconds = self.clock() - started
        self._seconds = max(self._seconds, seconds)
        self._oldest_age = max(self._oldest_age, age or 0.0)
        log.info("table %s: bootstrap capture %d copied source versions %d..%d of the change feed (%s change rows, "
                 "%.1fs)", self.name, r.number, r.after + 1, r.through, "?" if written is None else written, seconds)
        self._assess()
        self.on_captured()

    # -- the window ---------------------------------------------------------------------------------

    def _assess(self) -> None:
        """Say once, as a warning and in the progress note, when the window is too short for the
        captures measured so far; the bootstrap goes on (it fails only if the window closes)."""
        if self._warned or not window_at_risk(self.policy, self.window.seconds, self._oldest_age):
            return
        self._warned = True
        need = needed_window_seconds(self.policy, self._oldest_age)
        self.note = (f"the source's change window ({duration_text(self.window.seconds)}, "
                     f"{self.window.limiting_property}) is at risk: changes waited up to {self._oldest_age:.0f}s for "
                     f"their capture; this bootstrap is safe with a window of at least {duration_text(need)} "
                     f"({self._advice(need)})")
        log.warning("table %s: bootstrap: %s", self.name, self.note)

    def _advice(self, need: float) -> str:
        return (f"ALTER TABLE {self.source.sql} SET TBLPROPERTIES ('{self.window.limiting_property}' = "
                f"'{interval_text(need)}')")

    def _closed(self, version: int, age: float | None) -> Exception:
        """The error for a refused read of the change feed from ``version`` (see the module docstring)."""
        aged = "" if age is None else f", committed {age:.0f}s ago,"
        if not self._seen_open:
            return ChangeWindowExpired(
                f"{self.name}: change window expired: the source's change feed from version {version}{aged} is "
                f"older than its retention ({duration_text(self.window.seconds)}, {self.window.limiting_property}); "
                f"it closed while this bootstrap was stopped", table=self.name)
        need = needed_window_seconds(self.policy, max(self._oldest_age, age or 0.0, self.window.seconds))
        return BootstrapCannotConverge(
            f"{self.name}: the bootstrap cannot keep up with the source's change window: Delta refused the change "
            f"feed from version {version}{aged} because the source keeps it for only "
            f"{duration_text(self.window.seconds)} ({self.window.limiting_property}). This bootstrap needs a change "
            f"window of at least {duration_text(need)}: {self._advice(need)}.", table=self.name)
