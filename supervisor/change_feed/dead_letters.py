"""The dead letters of a pipeline's change-feed tables, for the operator: counted, listed, skipped,
replayed.

A batch a Delta replica refuses because of one change's value applies without that change, which is
dead-lettered in ``_lakemirror_dead_letters`` beside the replicas
(:mod:`lakemirror.sinks.merge.row_isolation`, :mod:`lakemirror.sinks.merge.feed_letters`).
:class:`FeedLetterDesk` is the pipeline's one place for them:

- **counts**: every batch's new letters are added as they are recorded (:meth:`FeedLetterDesk.recorded`),
  and the table is read once when the first table launches (:meth:`FeedLetterDesk.seed`), so the
  pending letters per table (``/status``, ``lakemirror status``, ``lakemirror_feed_dead_letters_pending``)
  carry over a restart;
- **list**, **skip** (the letter is marked ``skipped``; nothing is written to a replica) and
  **replay** run on the desk's own thread, never on an HTTP thread;
- a **replay** of a table's letters runs between two of the table's batches, under the lock every
  batch's apply takes (:meth:`lakemirror.supervisor.change_feed.table_runner.TableRunner.between_batches`);
  over Spark Connect, where the batches run on the server, under the lock of the table's turns, whose
  gate of files lets no batch begin there without a turn (:func:`server_batches_held_off`); it writes
  each key's state at the table's applied version, read from the source
  (:mod:`lakemirror.sinks.merge.letter_replay` says why that state, and how a repeat is skipped).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from lakemirror.sinks.events.dead_letters import PENDING, Resolution
from lakemirror.sinks.merge import letter_replay as lr
from lakemirror.sinks.merge.feed_letters import FeedLetter, FeedLetterStore, StoredFeedLetter
from lakemirror.sinks.merge.feed_replay import ReplayTarget, replay_keys
from lakemirror.supervisor.events.dead_letters import VERBS, LetterIndex, LetterReport

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Replays one table's keys in a session (the executor: :func:`lakemirror.sinks.merge.feed_replay.replay_keys`).
Replayer = Callable[[Any, ReplayTarget, Sequence[lr.KeyReplay]], list[Resolution]]


class LetterTable(Protocol):
    """What the desk needs of a change-feed table's runner (:class:`~lakemirror.supervisor.change_feed.table_runner.TableRunner`)."""

    @property
    def letter_label(self) -> str: ...

    def between_batches(self) -> AbstractContextManager["ReplayTarget | str"]: ...


#: How long a replay waits for a batch the server is applying (its turn ended early) to end.
SERVER_BATCH_WAIT_SECONDS = 30.0


class ServerGateView(Protocol):
    """What :func:`server_batches_held_off` needs of a table's gate of files
    (:class:`~lakemirror.sinks.merge.connect_gate.FileTurnGate`)."""

    @property
    def applying(self) -> bool: ...


def server_batches_held_off(gate: ServerGateView | None, streaming: bool, *, wait: float = SERVER_BATCH_WAIT_SECONDS,
                            clock: Callable[[], float] = time.monotonic,
                            sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Over Spark Connect, with the table's turns held: None once no batch is being applied on the
    server (none can begin: a batch applies only in a turn the daemon grants), else why a replay
    cannot be placed between two batches now.

    Without turns (``apply_workers: 0``) the server's query applies a batch whenever Spark plans one,
    and nothing in the daemon can hold it off."""
    if gate is None:
        if not streaming:
            return None  # no query runs (a paused or failed table): no batch can begin
        return ("over Spark Connect with apply_workers 0 the table's batches run on the server whenever Spark "
                "plans them, so a replay cannot be placed between two of them; set apply_workers to 1 or more "
                "(the default) to replay, or skip the letter")
    deadline = clock() + wait
    while gate.applying:
        if clock() >= deadline:
            return (f"a batch of the table has been applying on the Spark Connect server for over {wait:.0f} s; "
                    f"replay it again once the batch has ended")
        sleep(0.05)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


class FeedLetterDesk:
    """The pipeline's change-feed dead letters (see the module docstring).

    ``store``: the dead-letter table (or its twin); ``tables``: the pipeline's change-feed tables by
    name, as they run now; ``session``: the Spark session the desk's thread works in (asked on that
    thread, the first time it works); ``replay``: the executor (the twin's tests pass their own)."""

    #: Its letters are rows of a Delta table (a pipeline writing PostgreSQL replicas keeps its own in PostgreSQL).
    keeps_dead_letters_in_delta = True
    letters_elsewhere = ""

    def __init__(self, store: FeedLetterStore, tables: Callable[[], Mapping[str, LetterTable]],
                 session: Callable[[], "SparkSession | Any"], clock: Callable[[], float] = time.time,
                 replay: Replayer = replay_keys) -> None:
        self.store = store
        self.tables = tables
        self._session_of = session
        self._session: Any = None
        self.clock = clock
        self.replay = replay
        self.index = LetterIndex()
        self._recorded: dict[str, int] = {}     # letters recorded by this process, per source table
        self._lock = threading.Lock()
        self._worker: ThreadPoolExecutor | None = None
        self._seeding = False

    # -- counts ---------------------------------------------------------------------------------

    def recorded(self, letters: Sequence[FeedLetter]) -> None:
        """A batch's letters, just recorded in the table (a replayed batch's again: counted once)."""
        new = [x for x in {x.id: x for x in letters}.values() if not self.index.known(x.id)]
        self.index.add(new)
        with self._lock:
            for letter in new:
                self._recorded[letter.table] = self._recorded.get(letter.table, 0) + 1

    def seed(self) -> None:
        """Read the table's letters once, on the desk's thread (the first launch asks; later calls do nothing)."""
        with self._lock:
            if self._seeding or self.index.seeded:
                return
            self._seeding = True

        def read() -> None:
            try:
                self.index.seed(self.store.letters(self.session()))
            except Exception as exc:  # noqa: BLE001 (the counts start from this process's letters)
                log.warning("could not read the change-feed tables' dead letters to count them: %s", _first_line(exc))
            finally:
                with self._lock:
                    self._seeding = False
        self._submit(read)

    def _names(self) -> dict[str, str]:
        """Each table's name in the pipeline, by the source table its letters name."""
        try:
            return {t.letter_label: name for name, t in self.tables().items()}
        except Exception:  # noqa: BLE001 (a view must never fail: letters are then named by their source)
            return {}

    def pending(self) -> dict[str, int]:
        """Pending letters per table (by the pipeline's table name; by the source table for a table no
        longer in the pipeline)."""
        names = self._names()
        out: dict[str, int] = {}
        for label, n in self.index.pending().items():
            out[names.get(label, label)] = out.get(names.get(label, label), 0) + n
        return out

    def recorded_counts(self) -> dict[str, int]:
        """Letters recorded by this process's batches, per table (a redelivered change counts once)."""
        names = self._names()
        with self._lock:
            return {names.get(label, label): n for label, n in self._recorded.items()}

    # -- the desk's thread -------------------------------------------------------------------------

    def session(self) -> Any:
        if self._session is None:
            self._session = self._session_of()
        return self._session

    def _submit(self, what: Callable[[], Any]) -> Any:
        with self._lock:
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="feed-dead-letters")
            return self._worker.submit(what)

    def close(self) -> None:
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True)

    # -- the operator's list, skip and replay ----------------------------------------------------

    def _matches(self, letter: StoredFeedLetter, table: str | None, names: Mapping[str, str]) -> bool:
        return table is None or table in (letter.table, names.get(letter.table))

    def _as_json(self, letter: StoredFeedLetter, names: Mapping[str, str]) -> dict[str, Any]:
        return {**letter.as_json(), "table": names.get(letter.table, letter.table), "source": letter.table}

    def dead_letters(self, status: str | None = None, table: str | None = None, limit: int = 500,
                     timeout: float = 30.0) -> list[dict[str, Any]]:
        """The recorded letters (oldest first, the newest ``limit``), of ``status`` and ``table`` (the
        pipeline's table name or the source table) when given; TimeoutError after ``timeout`` seconds."""
        def read() -> list[dict[str, Any]]:
            names = self._names()
            found = [x for x in self.store.letters(self.session())
                     if (status is None or x.status == status) and self._matches(x, table, names)]
            return [self._as_json(x, names) for x in found[-limit:]]
        return list(self._submit(read).result(timeout))

    def resolve_dead_letters(self, verb: str, ids: Sequence[str] | None, table: str | None = None,
                             timeout: float = 30.0) -> LetterReport:
        """Skip or replay the letters ``ids`` (None: every pending letter, of ``table`` when given);
        TimeoutError after ``timeout`` seconds, the work going on."""
        if verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r}; expected one of {', '.join(VERBS)}")
        return self._submit(lambda: self.resolve_now(verb, ids, table)).result(timeout)  # type: ignore[no-any-return]

    def resolve_now(self, verb: str, ids: Sequence[str] | None, table: str | None = None) -> LetterReport:
        """:meth:`resolve_dead_letters` on the calling thread (the desk's)."""
        session, names = self.session(), self._names()
        recorded = self.store.letters(session)
        wanted = None if ids is None else set(ids)
        unknown = tuple(sorted((wanted or set()) - {x.id for x in recorded}))
        chosen = [x for x in recorded if (x.status == PENDING if wanted is None else x.id in wanted)
                  and self._matches(x, table, names)]
        if verb == "skip":
            done = lr.skipped(x for x in chosen if x.status == PENDING)
            left = [Resolution(x.id, x.status, f"already {x.status}: left as it is") for x in chosen
                    if x.status != PENDING]
        else:
            done, left = self._replay(session, chosen, recorded), []
        self.store.resolve(session, done, self.clock())
        self.index.resolved(done)
        if done:
            log.info("change-feed dead letters: %s %d (%s)", verb, len(done),
                     ", ".join(f"{d.id} {d.status}" for d in done[:20]) + (" …" if len(done) > 20 else ""))
        return LetterReport(verb, tuple(done + left), unknown)

    def _replay(self, session: Any, chosen: Sequence[StoredFeedLetter],
                recorded: Sequence[StoredFeedLetter]) -> list[Resolution]:
        running = {t.letter_label: (name, t) for name, t in self.tables().items()}
        done: list[Resolution] = []
        for label in sorted({x.table for x in chosen}):
            replays = lr.keys_to_replay([x for x in chosen if x.table == label],
                                        [x for x in recorded if x.table == label])
            if label not in running:
                done += [d for r in replays for d in lr.not_replayed(
                    r, f"{label} is not a running table of this pipeline; skip the letter, or replay it once the "
                       f"table runs")]
                continue
            name, runner = running[label]
            done += self._replay_table(session, name, runner, replays)
        return done

    def _replay_table(self, session: Any, name: str, runner: LetterTable,
                      replays: Sequence[lr.KeyReplay]) -> list[Resolution]:
        with runner.between_batches() as target:  # the table's batches wait meanwhile
            if isinstance(target, str):
                return [d for r in replays for d in lr.not_replayed(r, target)]
            try:
                return self.replay(session, target, replays)
            except Exception as exc:  # noqa: BLE001 (a failed replay leaves its letters pending, said)
                log.warning("table %s: replaying %d dead letter key(s) failed: %s", name, len(replays),
                            _first_line(exc))
                return [d for r in replays for d in lr.not_replayed(
                    r, f"the replay failed ({_first_line(exc)}); replay it again")]

