"""Tables take turns on a few apply workers instead of each running an always-on query.

One always-on streaming query per table lets every table start a MERGE whenever its trigger
fires. On a small driver that is contention, not parallelism: one warm MERGE already runs its
tasks on every core, so concurrent MERGEs only divide the cores between them and many tables
starve one another (``make bench ONLY=scale`` runs 64 tables on one driver). With turns,
``apply_workers`` threads each take the table that has waited longest among those with something
to apply, and apply everything the table's change feed holds at the start of the turn
(:meth:`TurnTaker.take_turn`: an always-on query's batch let through its gate,
:mod:`lakemirror.supervisor.apply_workers.query_gate`, a gate of files over Spark Connect, or a batch the daemon
planned from the source's commit files, the query run once where Spark is to plan it): what the table
accumulated while it waited is applied in one batch, so the MERGE's fixed cost is paid
once per turn, not once per commit, and a table with nothing new costs a file-existence check
(and an empty turn every ``IDLE_RECHECK_SECONDS``).

:func:`next_turn` is the pure choice; :class:`TurnPool` is the thin executor around it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

log = logging.getLogger(__name__)

#: A table whose commit files cannot be checked (a table known only by name, Spark Connect) is
#: given a turn every ``trigger_interval_seconds``; one whose check says "nothing new" still gets
#: a turn this often, so no bug in that check can leave a table behind for longer.
IDLE_RECHECK_SECONDS = 30.0


#: A table with fewer unapplied source versions than this takes its turn as one micro-batch.
ONE_BATCH_VERSIONS = 32

#: How many times a turn interval an idle table's log is looked at, at most. The workers look for a
#: turn to take several times a second; asking each idle table's log each time cost one file status
#: (on object storage one request) per table every quarter of a second. Once a look found nothing,
#: the answer stands for a quarter of the interval: a new commit is seen that much later at most.
PENDING_CHECKS_PER_INTERVAL = 4


def one_batch_turn(*, rate_limited: bool, proven: bool, small_backlog: bool | None) -> bool:
    """Whether a turn that starts its query (a batch of a table whose others the daemon plans from
    the source's commit files, left to Spark) runs it with a ``once`` trigger (one
    micro-batch) instead of ``availableNow``.

    Both apply everything the change feed holds when the turn begins. ``availableNow`` first works
    out where to stop (one more snapshot and change listing of the source), then splits the work
    by the source's admission limits (Delta's 1,000 files a batch by default); ``once`` takes it as
    one batch and skips that snapshot and listing, a cost paid on every turn of a nearly caught-up
    table. So ``once`` only where the split cannot matter: a table that has run a turn since its
    launch, has no rate limits of its own, and is known to be fewer than
    ``ONE_BATCH_VERSIONS`` versions behind; a backlog (a restart after downtime) keeps the split.
    """
    return proven and not rate_limited and small_backlog is True


@dataclass(frozen=True)
class Candidate:
    """A table ready for a turn, as the chooser sees it."""

    table: str
    pending: bool | None                 # unapplied source commits exist; None: cannot tell
    last_started: float | None = None    # when its previous turn began (None: never had one)
    last_ended: float | None = None      # when its previous turn ended


def is_due(c: Candidate, now: float, min_interval: float, idle_recheck: float | None = None) -> bool:
    """Whether ``c`` is due for a turn (``idle_recheck``: ``IDLE_RECHECK_SECONDS`` when not given)."""
    if idle_recheck is None:
        idle_recheck = IDLE_RECHECK_SECONDS
    if c.last_started is None:
        return True
    waited = now - c.last_started
    if c.pending is None:
        return waited >= min_interval
    return (c.pending and waited >= min_interval) or waited >= idle_recheck


def serving_order(table: str, last_ended: float | None) -> tuple[bool, float, str]:
    """Where a table stands in line for a turn: never-served tables first, then the one whose
    previous turn ended longest ago. Pure."""
    return last_ended is not None, last_ended or 0.0, table


def next_turn(candidates: Sequence[Candidate], now: float, min_interval: float,
              idle_recheck: float | None = None, *,
              look: Callable[[Candidate], bool | None] | None = None) -> str | None:
    """The due table served least recently (never-served tables first), or None.

    Least recently served is round robin among the tables with work: a table waits at most one
    turn of every other busy table, whatever the number of tables. ``look``: asked whether a
    candidate has work, in place of its ``pending``; the candidates are asked in
    :func:`serving_order` and only until the first due one, which is the choice (a look may be a
    request to a store: the tables behind the choice are not asked)."""
    for c in sorted(candidates, key=lambda c: serving_order(c.table, c.last_ended)):
        if look is not None:
            c = replace(c, pending=look(c))
        if is_due(c, now, min_interval, idle_recheck):
            return c.table
    return None


class TurnTaker(Protocol):
    """What the pool needs of a table runner."""

    table: str

    def ready_for_turn(self) -> bool: ...
    def has_pending(self) -> bool | None: ...
    def take_turn(self) -> None: ...


@dataclass
class _Served:
    started: float | None = None
    ended: float | None = None
    pending_seen: bool = False  # seen with unapplied commits since its last turn began: no need to look again
    idle_seen: float | None = None  # when a look last found nothing to apply (it stands for a while)


class TurnPool:
    """``workers`` threads taking turns over the runners that ``runners()`` returns."""

    def __init__(self, workers: int, runners: Callable[[], Sequence[TurnTaker]], *, min_interval: float,
                 clock: Callable[[], float], idle_wait: float | None = None) -> None:
        if workers < 1:
            raise ValueError("a turn pool needs at least one worker")
        self.workers = workers
        self._runners = runners
        self._min_interval = min_interval
        self._clock = clock
        # How long an idle worker waits before looking again: a quarter of the trigger interval
        # (bounded), which is what a table with new commits may wait on top of its turn.
        self._idle_wait = idle_wait if idle_wait is not None else min(0.25, max(0.02, min_interval / 4))
        #: How long a look that found nothing to apply stands (:data:`PENDING_CHECKS_PER_INTERVAL`).
        self._idle_stands = max(self._idle_wait, min_interval / PENDING_CHECKS_PER_INTERVAL)
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._served: dict[str, _Served] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if self._threads:
            return
        for i in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"apply-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Take no new turns; turns in flight end when their runners are halted."""
        self._stop.set()

    def _claim(self) -> TurnTaker | None:
        """The turn :func:`next_turn` chooses. A table's log is looked at only as far down the line as
        the choice needs: when the workers cannot keep up, the table first in line nearly always has
        work, and the tables that have just had their turn are not asked again and again (on an
        object store each look is a request) until theirs comes."""
        with self._lock:
            now = self._clock()
            waiting: dict[str, tuple[TurnTaker, _Served]] = {}
            for runner in self._runners():
                if runner.table in self._busy:
                    continue
                served = self._served.setdefault(runner.table, _Served())
                if not runner.ready_for_turn():
                    served.idle_seen = None  # what it holds when ready again is looked at afresh
                    continue
                if served.started is not None and now - served.started < self._min_interval:
                    continue  # not due, whatever its log says: spare the check
                waiting[runner.table] = (runner, served)

            def look(c: Candidate) -> bool | None:
                return self._pending_since_look(*waiting[c.table], now)

            candidates = [Candidate(t, None, served.started, served.ended) for t, (_, served) in waiting.items()]
            chosen = next_turn(candidates, now, self._min_interval, look=look)
            if chosen is None:
                return None
            self._busy.add(chosen)
            runner, served = waiting[chosen]
            served.started, served.pending_seen, served.idle_seen = now, False, None
            return runner

    def _pending_since_look(self, runner: TurnTaker, served: _Served, now: float) -> bool | None:
        """Whether ``runner`` has something to apply: known since a look that found it, assumed not
        for a while after a look that found nothing, else looked for now."""
        if served.pending_seen:
            return True
        if served.idle_seen is not None and now - served.idle_seen < self._idle_stands:
            return False
        pending = self._pending(runner)
        served.pending_seen = pending is True
        served.idle_seen = now if pending is False else None
        return pending

    @staticmethod
    def _pending(runner: TurnTaker) -> bool | None:
        try:
            return runner.has_pending()
        except Exception as exc:  # noqa: BLE001 (an unreadable log: let the turn find out)
            log.debug("table %s: pending check failed: %s", runner.table, exc)
            return None

    def _work(self) -> None:
        while not self._stop.is_set():
            runner = self._claim()
            if runner is None:
                self._stop.wait(self._idle_wait)
                continue
            try:
                runner.take_turn()
            except Exception:  # noqa: BLE001 (a runner reports its own failures; never lose a worker)
                log.exception("table %s: turn failed unexpectedly", runner.table)
            finally:
                with self._lock:
                    self._busy.discard(runner.table)
                    self._served.setdefault(runner.table, _Served()).ended = self._clock()
