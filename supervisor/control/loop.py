"""The supervisor: one control loop for all of a pipeline's tables.

Each tick it applies queued commands (pause, resume), discovers new tables when the config names
none, collects every runner's events and feeds them through the pure state machine, carries out
the resulting actions, and probes lag. A failing table only ever changes its own state: its
backoff is state with a due time, not a sleep, so no other table waits for it.

A command accepted is durable (:mod:`lakemirror.supervisor.control.command_inbox`): it is journalled before
it is accepted, and a supervisor that starts after a kill records what the journal still holds in
each table's state before that table starts. One still queued when the drain begins is recorded
once its runner has stopped (pause and resume as the persisted pause, a resync as a new bootstrap
at the next start), and from the drain on, commands are refused (:class:`Draining`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Protocol, Sequence

from lakemirror.checkpoints.commands import Command, CommandJournal
from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.command_inbox import OPERATOR_RESYNC, CommandInbox, record
# Raised by the command methods below (the HTTP API answers them 503): importable from here too.
from lakemirror.supervisor.apply_workers.worker_pool import TurnPool, TurnTaker
from lakemirror.supervisor.change_feed.table_runner import BatchReport
from lakemirror.supervisor.control.command_inbox import CommandNotRecorded as CommandNotRecorded
from lakemirror.supervisor.control.command_inbox import CommandRefused as CommandRefused
from lakemirror.supervisor.control.command_inbox import Draining as Draining
from lakemirror.supervisor.control.failure_policy import REDISCOVERABLE
from lakemirror.supervisor.control.halts import halt_all
from lakemirror.supervisor.control.lag import CommittedAt, HeldVersion, LagReading, as_of
from lakemirror.supervisor.control.observer import NoopObserver, Observer
from lakemirror.supervisor.offline.recorded_tables import RecordedTable

log = logging.getLogger(__name__)

#: How long a halt outside a drain (a pause, a failure's restart, a resync) waits for the table's
#: batch in flight and its query's stop before it goes on.
HALT_SECONDS = 60.0


class Runner(Protocol):
    @property
    def applied_through(self) -> int | None: ...
    @property
    def last_batch_at(self) -> float | None: ...
    @property
    def last_lag(self) -> LagReading | None: ...

    def launch(self) -> None: ...
    def halt(self, timeout: float = 60.0) -> None: ...
    def poll(self) -> Sequence[sm.Event | BatchReport | BootstrapProgress]: ...
    def probe_lag(self, now: float) -> LagReading | None: ...
    def pause_persisted(self, paused: bool) -> None: ...
    def persisted_pause(self) -> bool: ...
    def resync(self, reason: str) -> None: ...
    def source_exists(self) -> bool: ...


@dataclass(frozen=True)
class TableView:
    """A read-only snapshot of one table for status output and the HTTP API."""

    table: str
    state: str
    lag_seconds: float | None
    versions_behind: int | None
    applied_through: int | None
    rows_applied: int
    batches: int
    failures: int
    retries: int
    next_retry_at: float | None
    last_error: str | None
    last_batch_at: float | None
    retry_delay_seconds: float | None = None   # the backoff chosen for the pending retry (degraded)
    detail: dict[str, Any] | None = None        # a runner's own status (an event source: replicas, offsets)
    bootstrap: dict[str, object] | None = None  # a running bootstrap: chunks and rows done, rate, ETA


@dataclass
class _Table:
    runner: Runner
    status: sm.TableStatus
    rows_applied: int = 0
    batches: int = 0
    bootstrap: BootstrapProgress | None = None


class Supervisor:
    def __init__(self, *, runner_factory: Callable[[str], Runner], list_tables: Callable[[], list[str]],
                 policy: sm.RestartPolicy = sm.RestartPolicy(), observer: Observer | None = None,
                 clock: Callable[[], float] = time.time, rand: Callable[[], float] = random.random,
                 lag_interval_seconds: float = 2.0, discover_interval_seconds: float | None = None,
                 apply_workers: int = 0, min_turn_interval_seconds: float = 1.0,
                 recorded: Callable[[], Mapping[str, RecordedTable]] | None = None,
                 refresh_recorded: Callable[[RecordedTable], RecordedTable] | None = None,
                 journal: CommandJournal | None = None, epochs: Callable[[str], str | None] | None = None) -> None:
        """``journal``: where accepted commands wait for their effect (an in-memory one, which does not
        survive the process, when None); ``epochs``: a table's transaction-id epoch as its state holds
        it, read without Spark (kept with a resync, to tell after a crash whether it took effect)."""
        self._factory = runner_factory
        self._list_tables = list_tables
        self.policy = policy
        self.observer = observer or NoopObserver()
        self.clock = clock
        self.rand = rand
        self.lag_interval = lag_interval_seconds
        self.discover_interval = discover_interval_seconds
        self._tables: dict[str, _Table] = {}
        #: What the pipeline's records say about its tables (read before any runner exists).
        self._read_recorded = recorded
        self._recorded: dict[str, RecordedTable] = {}
        #: Reads a recorded table's source position again (no Spark): status stays true while a table
        #: starts, before its runner has measured anything. At most once per ``lag_interval`` a table.
        self._refresh_recorded = refresh_recorded
        self._refreshed_at: dict[str, float] = {}
        self._refresh_lock = threading.Lock()
        self.commands = CommandInbox(journal, epochs)
        self._view_lock = threading.Lock()
        self._next_lag = 0.0
        self._next_discovery = 0.0
        # apply_workers > 0: running tables take turns on that many workers (supervisor.apply_workers.worker_pool);
        # 0: every runner keeps an always-on query of its own.
        self._turns = TurnPool(apply_workers, self._turn_takers, min_interval=min_turn_interval_seconds,
                               clock=clock) if apply_workers > 0 else None

    # -- commands (any thread) ------------------------------------------------------------------

    def pause(self, table: str) -> None:
        """Pause ``table`` (nothing when the pipeline has no such table); see :meth:`command`."""
        self.command("pause", table)

    def resume(self, table: str) -> None:
        self.command("resume", table)

    def resync(self, table: str) -> None:
        """Rebuild the table's replica from a new snapshot (a new transaction-id epoch)."""
        self.command("resync", table)

    def has_table(self, table: str) -> bool:
        """Whether ``table`` is the pipeline's: running, or listed from its records while the pipeline
        starts (a command for it is applied once its runner exists, at the first tick)."""
        with self._view_lock:
            return table in self._tables or table in self._recorded

    def runner_of(self, table: str) -> Runner | None:
        """The runner of ``table`` (None when the pipeline has no such table)."""
        entry = self._tables.get(table)
        return entry.runner if entry is not None else None

    def runners(self) -> dict[str, Runner]:
        """Every table's runner, by table (any thread)."""
        with self._view_lock:
            return {name: entry.runner for name, entry in self._tables.items()}

    def command(self, verb: str, table: str) -> bool:
        """Accept ``verb`` (pause, resume, resync) for ``table``: journalled, then applied at the next
        tick. False if the pipeline has no such table; :class:`Draining` once the shutdown has begun,
        :class:`CommandNotRecorded` when the command cannot be journalled (nothing is accepted)."""
        return bool(self.command_all(verb, [table]))

    def command_all(self, verb: str, tables: Sequence[str]) -> list[str]:
        """:meth:`command` for each of ``tables`` the pipeline has, in one journal write (all or
        none); the tables it was accepted for."""
        if verb not in ("pause", "resume", "resync"):
            raise ValueError(f"unknown command {verb!r}")
        known = [t for t in dict.fromkeys(tables) if self.has_table(t)]
        self.commands.submit(verb, known)
        return known

    # -- loop (the supervisor thread) -----------------------------------------------------------

    def start(self) -> None:
        self._seed(self.clock())
        self.commands.recover()
        self._discover(self.clock())
        if self._turns is not None:
            self._turns.start()

    def run(self, stop: threading.Event, interval_seconds: float = 0.5) -> None:
        self.start()
        while not stop.is_set():
            self.tick()
            stop.wait(interval_seconds)

    def tick(self) -> None:
        now = self.clock()
        self._apply_commands(now)
        if self.discover_interval is not None and now >= self._next_discovery:
            self._discover(now)
        for name, entry in list(self._tables.items()):
            landed = False
            for item in entry.runner.poll():
                if isinstance(item, BatchReport):
                    landed = True
                    known = self._recorded.get(name)
                    if counts_as_batch(item, known.counted_through if known is not None else None):
                        entry.rows_applied += item.outcome.counts.total
                        entry.batches += 1
                    self.observer.batch_applied(name, item)
                elif isinstance(item, BootstrapProgress):
                    entry.bootstrap = item if item.chunks_done < item.chunks_total else None
                    self.observer.bootstrap_progressed(name, item)
                else:
                    if isinstance(item, sm.BootstrapStarted):  # a new bootstrap: no figures until it reports
                        entry.bootstrap = None
                    self._dispatch(name, item, now)
            self._dispatch(name, sm.Tick(), now)
            reading = entry.runner.last_lag
            if landed and reading is not None and not reading.versioned and now < self._next_lag:
                # A reading in offsets (an event source) cannot be repriced by a batch: the next
                # unapplied message's time is the broker's to say. Read it now, not a probe round later.
                self._probe(name, entry, now)
        if now >= self._next_lag:
            self._next_lag = now + self.lag_interval
            for name, entry in list(self._tables.items()):
                # Lag keeps counting whatever the state: a table restarting its stream, retrying or
                # failed still falls behind its source.
                if entry.status.state != sm.TableState.STOPPED:
                    self._probe(name, entry, now)

    def shutdown(self, timeout_seconds: float = 60.0) -> list[str]:
        """Drain: every table finishes its batch in flight, then its stream stops.

        Every table halts at once under one deadline (:func:`~.halts.halt_all`): N tables never take
        N times the timeout, and one whose halt hangs holds up no other. Returns, within the
        timeout, the tables whose halt had not finished, each with what it was waiting for (their
        batches are replayed at the next start). Commands still queued are recorded once the tables
        have stopped (:meth:`_record_pending`); later ones are refused."""
        pending = self.commands.close(self._has_runner)
        deadline = time.monotonic() + timeout_seconds
        now = self.clock()
        if self._turns is not None:
            self._turns.stop()
        halts: dict[str, Runner] = {}
        for name in list(self._tables):
            self._dispatch(name, sm.Stop(), now, halts=halts)
        unfinished = halt_all(halts, max(0.0, deadline - time.monotonic()))
        self._record_pending(pending)
        return unfinished

    def _has_runner(self, table: str) -> bool:
        return table in self._tables

    def _record_pending(self, pending: list[Command]) -> None:
        """Record commands accepted but not yet applied in their tables' state, without starting
        anything: a pause or resume becomes the table's persisted pause, a resync its new bootstrap at
        the next start (one that cannot be recorded stays journalled for the next start)."""
        for command in self.commands.apply(pending, lambda c: record(c, self._tables[c.table].runner)):
            log.info("table %s: %s accepted before the shutdown, recorded for the next start", command.table,
                     command.verb)

    # -- internals ------------------------------------------------------------------------------

    def _turn_takers(self) -> list[TurnTaker]:
        """The runners of running or starting tables (called from the turn pool's threads); a
        starting table retrying after failures is running again only once a turn succeeds."""
        with self._view_lock:
            entries = list(self._tables.values())
        return [e.runner for e in entries  # type: ignore[misc]
                if e.status.state in (sm.TableState.RUNNING, sm.TableState.STARTING)]

    def _discover(self, now: float) -> None:
        if self.discover_interval is not None:
            self._next_discovery = now + self.discover_interval
        try:
            names = self._list_tables()
        except Exception as exc:  # the catalog may be briefly unreachable: keep what runs
            log.warning("listing tables failed: %s", exc)
            return
        self._rediscover_missing()
        for name in names:
            if name in self._tables:
                continue
            runner = self._factory(name)
            # Commands accepted before this start (or while the runner was made): in its state before it starts.
            for command in self.commands.apply(self.commands.take_for(name), lambda c: record(c, runner)):
                log.info("table %s: %s accepted before it started, recorded", name, command.verb)
            known = self._recorded.get(name)
            entry = _Table(runner, sm.TableStatus(since=now), rows_applied=known.rows_applied if known else 0,
                           batches=known.batches if known else 0)
            with self._view_lock:
                self._tables[name] = entry
            log.info("table %s: added to the pipeline", name)
            self._dispatch(name, sm.Pause() if runner.persisted_pause() else sm.Launch(), now)

    def _rediscover_missing(self) -> None:
        """Relaunch a table that failed because it did not exist, once it does: a missing table is
        a configuration error, never retried, and found here by the discovery loop instead."""
        for name, entry in list(self._tables.items()):
            if entry.status.state != sm.TableState.FAILED or entry.status.error_code not in REDISCOVERABLE:
                continue
            try:
                present = entry.runner.source_exists()
            except Exception as exc:  # noqa: BLE001 (looked for again at the next discovery)
                log.debug("table %s: cannot tell whether it exists: %s", name, exc)
                continue
            if present:
                log.info("table %s: the missing table now exists; starting it", name)
                self._dispatch(name, sm.Resume(), self.clock())

    def _apply_commands(self, now: float) -> None:
        """Apply the accepted commands of tables that have a runner, in order; each is forgotten by
        the journal once its effect is in the table's state."""
        self.commands.apply(self.commands.take(self._has_runner), lambda c: self._apply(c, now))

    def _apply(self, command: Command, now: float) -> None:
        table, entry = command.table, self._tables[command.table]
        if command.verb == "resync":
            if entry.status.state == sm.TableState.PAUSED:  # a resync starts the table: no longer paused
                entry.runner.pause_persisted(False)
            self._dispatch(table, sm.Resync(), now, reason=OPERATOR_RESYNC)
            return
        entry.runner.pause_persisted(command.verb == "pause")
        self._dispatch(table, sm.Pause() if command.verb == "pause" else sm.Resume(), now)

    def _dispatch(self, name: str, event: sm.Event, now: float, *, halts: dict[str, Runner] | None = None,
                  reason: str | None = None) -> None:
        """Step the table's state machine and carry out its actions; a halt is collected into
        ``halts`` when given (a drain halts every table at once), else done here."""
        entry = self._tables[name]
        before = entry.status
        after, actions = sm.step(before, event, now, self.policy)
        entry.status = after
        if after != before:
            if after.state != before.state:
                log.info("table %s: %s -> %s%s", name, before.state.value, after.state.value,
                         f" ({after.last_error})" if after.state == sm.TableState.DEGRADED else "")
            self.observer.state_changed(name, after)
            if after.retries > before.retries:
                self.observer.retry_scheduled(name, after)
        for action in actions:
            if action == sm.Action.HALT:
                if halts is not None:
                    halts[name] = entry.runner
                else:
                    entry.runner.halt(HALT_SECONDS)
            elif action == sm.Action.RESYNC:
                entry.runner.resync(reason or after.last_error or "resync")
                entry.bootstrap = None  # the old epoch's figures: the new bootstrap reports its own
            elif action == sm.Action.LAUNCH:
                entry.runner.launch()

    @staticmethod
    def _held(entry: _Table) -> HeldVersion:
        """The version the table's replica holds when asked: the observer reprices the reading with it
        (a batch applied after the probe counts at once, not a probe round later). The metrics keep
        it, so it does not keep a removed table's runner alive (then: not known)."""
        runner = weakref.ref(entry.runner)

        def held() -> int | None:
            alive = runner()
            return None if alive is None else alive.applied_through
        return held

    @staticmethod
    def _committed_at(entry: _Table) -> CommittedAt | None:
        """When a version of the table's source was committed, looked at when asked (a runner whose
        source's commit files can be looked at cheaply: ``committed_at``), else None. Kept like ``held``."""
        if getattr(entry.runner, "committed_at", None) is None:
            return None
        runner = weakref.ref(entry.runner)

        def committed_at(version: int) -> float | None:
            alive = runner()
            return None if alive is None else alive.committed_at(version)  # type: ignore[attr-defined]
        return committed_at

    def _probe(self, name: str, entry: _Table, now: float) -> None:
        # Each table's reading is taken at its own moment: probes of many tables (each a read of the
        # source's head) run one after the other, and the tick's start would be seconds off for the last.
        now = self.clock()
        try:
            reading = entry.runner.probe_lag(now)
        except Exception as exc:  # a lag probe failure must not disturb replication
            log.debug("table %s: lag probe failed: %s", name, exc)
            return
        if reading is None and entry.runner.last_lag is None and name in self._recorded:
            reading = self._known(name, now).reading(now)  # the runner knows nothing yet: the record does
        if reading is not None:
            self.observer.lag_measured(name, reading, self._held(entry), self._committed_at(entry))

    def _seed(self, now: float) -> None:
        """List the tables the pipeline's records know at once, state ``starting`` (or ``paused``),
        with their applied version and lag from those records: the runners need Spark, which may
        take a minute to start."""
        if self._read_recorded is None:
            return
        try:
            recorded = dict(self._read_recorded())
        except Exception as exc:  # noqa: BLE001 (the tables still appear once their runners exist)
            log.warning("reading the pipeline's records failed: %s", exc)
            return
        with self._view_lock:
            self._recorded = recorded
        for name, known in recorded.items():
            state = sm.TableState.PAUSED if known.paused else sm.TableState.STARTING
            self.observer.state_changed(name, sm.TableStatus(state=state, since=now))
            reading = known.reading(now)
            if reading is not None:
                self.observer.lag_measured(name, reading)

    # -- views (any thread) ---------------------------------------------------------------------

    def views(self) -> list[TableView]:
        with self._view_lock:
            items = list(self._tables.items())
            recorded = dict(self._recorded)
        now = self.clock()
        out = []
        for name, e in sorted(items):
            lag = e.runner.last_lag
            st = e.status
            known = recorded.get(name)
            through = e.runner.applied_through
            if lag is None and known is not None:  # nothing measured yet: what the records say, read again
                known = self._known(name, now, applied=through)
                lag = known.reading(now)
            if lag is not None:  # as of now, of the batches applied and the commits made since the reading
                lag = as_of(lag, lambda: through, now, self._committed_at(e))
            if through is None and known is not None:
                through = known.applied_through
            out.append(TableView(
                table=name, state=st.state.value,
                lag_seconds=lag.lag_seconds if lag else None,
                versions_behind=lag.versions_behind if lag else None,
                applied_through=through, rows_applied=e.rows_applied, batches=e.batches,
                failures=st.failures, retries=st.retries, next_retry_at=st.next_retry_at,
                last_error=st.last_error,
                last_batch_at=e.runner.last_batch_at or (known.last_batch_at if known else None),
                retry_delay_seconds=(st.next_retry_at - st.since) if st.next_retry_at is not None else None,
                detail=_detail(e.runner),
                bootstrap=e.bootstrap.as_dict() if e.bootstrap is not None and st.state == sm.TableState.BOOTSTRAPPING
                else None))
        for name, known in sorted(recorded.items()):
            if any(name == n for n, _ in items):
                continue
            known = self._known(name, now)
            out.append(TableView(
                table=name, state=(sm.TableState.PAUSED if known.paused else sm.TableState.STARTING).value,
                lag_seconds=known.lag_seconds(now), versions_behind=known.versions_behind,
                applied_through=known.applied_through, rows_applied=known.rows_applied, batches=known.batches,
                failures=0, retries=0, next_retry_at=None, last_error=None, last_batch_at=known.last_batch_at,
                detail=known.detail))
        return sorted(out, key=lambda v: v.table)

    def _known(self, name: str, now: float, applied: int | None = None) -> RecordedTable:
        """What the records say about ``name``, its source position read again when due (at once
        when its runner already knows a newer applied version than the records)."""
        with self._view_lock:
            known = self._recorded[name]
        refresh = self._refresh_recorded
        if refresh is None:
            return known
        moved = applied is not None and applied != known.applied_through
        if moved:
            known = replace(known, applied_through=applied)
        with self._refresh_lock:
            if not moved and now < self._refreshed_at.get(name, float("-inf")) + self.lag_interval:
                return known
            self._refreshed_at[name] = now
        try:
            fresh = refresh(known)
        except Exception as exc:  # noqa: BLE001 (a view must never fail: the last reading stays)
            log.debug("table %s: reading its source position failed: %s", name, exc)
            return known
        with self._view_lock:
            if name in self._recorded:
                self._recorded[name] = fresh
        return fresh


def _detail(runner: Runner) -> dict[str, Any] | None:
    describe = getattr(runner, "describe", None)
    if describe is None:
        return None
    try:
        return describe()  # type: ignore[no-any-return]
    except Exception as exc:  # noqa: BLE001 (a view must never fail)
        log.debug("describing a runner failed: %s", exc)
        return None


def counts_as_batch(report: BatchReport, counted_through: int | None = None) -> bool:
    """Whether a batch report adds to a table's batch and row counts: a batch that read change rows
    and did work, i.e. one with a checkpoint row of its own (the offline view counts those).

    A replay is counted unless its work is counted already: ``counted_through``, the last batch of
    the table's epoch whose checkpoint row the records held at start (those batches are in the
    counts the table started with), or a replay that applied nothing (the replica skipped it whole:
    counted when first applied). A replay of a batch whose checkpoint row was never written (a
    crash between the replica's commit and the row), or one that applied rows (an event source's
    batch replayed after a crash between its replicas' commits) did work this run: the metrics
    count it, and so does status."""
    outcome = report.outcome
    if outcome.stats.rows_read <= 0:
        return False
    if not outcome.replayed:
        return True
    if counted_through is not None and report.batch_id <= counted_through:
        return False
    return outcome.counts.total > 0
