"""Checkpoint rows appended a round at a time, off the thread of the batch they record.

Over Spark Connect a batch is applied on the server, and the daemon learns of it afterwards from
the outcome file the batch function wrote (:mod:`lakemirror.sinks.merge.connect_outcomes`). Its
checkpoint row need not be written before Spark's commit log (Spark has committed the batch by
then, or will replay it): it must only be written once, which the outcome file guarantees. So the
row is handed to :class:`RoundRows` and the supervisor's tick goes on; a writer thread appends every
row handed in since its last commit (several tables' batches: a round) in one commit, then tells
each batch's owner (which forgets the outcome file). A crash before that commit loses no row: the
outcome files are still there, and the next start appends their rows
(:class:`lakemirror.sinks.merge.connect_batches.ConnectBatches`). A crash after it doubles none:
the next start reads the last batch the checkpoint table records and skips the files up to it.

The driver's batches planned from commit files
(:mod:`lakemirror.supervisor.change_feed.commit_file_batches`) hand their rows in too, so that an apply
worker goes on to the next table's turn while the row is written: there the row must be durable
before the stream's commit log records the batch (a batch the log records is never replayed, and
its row would be lost with a crash), so the batch's owner writes its commit log from ``durable``.

A failed append keeps the rows handed in without a ``failed`` callback and tries them again (with
a growing pause, at most ``MAX_RETRY_SECONDS``): their batches are recorded elsewhere until then.
Rows handed in with one are not tried again: ``failed`` gets the error, and the batch's owner fails
its table, whose relaunch replays the batch and appends the row unless it is there.
:meth:`RoundRows.flush` waits for the rows handed in so far (a drain).
Lifecycle: the thread starts with the first row; :meth:`close` ends it after a last flush.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from lakemirror.checkpoints.records import CheckpointRow, CheckpointStore

log = logging.getLogger(__name__)

#: The longest pause between two attempts of a failed append.
MAX_RETRY_SECONDS = 30.0
#: How long the writer waits after the first row of a round for the other tables' rows of the same tick.
LINGER_SECONDS = 0.2


@dataclass(frozen=True)
class _Pending:
    row: CheckpointRow
    durable: Callable[[], None]
    failed: Callable[[BaseException], None] | None = None  # None: tried again until it is appended


class RoundRows:
    def __init__(self, store: CheckpointStore, *, fault: Callable[[str], None] = lambda point: None,
                 linger_seconds: float = LINGER_SECONDS, sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.fault = fault
        self.linger = linger_seconds
        self.sleep = sleep
        self._cond = threading.Condition()
        self._pending: list[_Pending] = []
        self._in_flight = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        #: Rows per commit so far (observability and tests).
        self.round_sizes: list[int] = []

    def submit(self, row: CheckpointRow, durable: Callable[[], None] = lambda: None,
               failed: Callable[[BaseException], None] | None = None) -> None:
        """Queue ``row`` (a batch no earlier attempt has a row for); ``durable`` is called once it is
        committed, ``failed`` (if given) with the error of an append that did not commit it, which
        is then not tried again. Returns at once."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the checkpoint row writer is closed")
            self._pending.append(_Pending(row, durable, failed))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="checkpoint-rows", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until every row handed in so far is committed."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._pending or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float = 30.0) -> None:
        """Flush, then end the writer thread (rows not committed by then are appended at the next start)."""
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        delay = 0.5
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
            self.sleep(self.linger)  # the other tables' rows of the same tick join this round
            with self._cond:
                group, self._pending = self._pending, []
                self._in_flight = len(group)
            from_server = any(p.failed is None for p in group)  # Spark Connect batches' rows
            try:
                if from_server:
                    self.fault("connect_before_rows")
                self.store.append_rows([p.row for p in group])
                if from_server:
                    self.fault("connect_after_rows")
            except Exception as exc:  # noqa: BLE001 (kept and tried again, or handed to the batch's owner)
                kept = [p for p in group if p.failed is None]  # a crash leaves their outcome files
                for pending in group:
                    if pending.failed is not None:
                        pending.failed(exc)
                if kept:
                    log.warning("appending %d checkpoint row(s) failed, trying again in %.1f s: %s", len(kept),
                                delay, exc)
                with self._cond:
                    self._pending = kept + self._pending
                    self._in_flight = 0
                    self._cond.notify_all()
                if kept:
                    self.sleep(delay)
                    delay = min(MAX_RETRY_SECONDS, delay * 2)
                continue
            delay = 0.5
            self.round_sizes.append(len(group))
            for pending in group:
                try:
                    pending.durable()
                except Exception as exc:  # noqa: BLE001 (the row is durable; forgetting its file is housekeeping)
                    log.debug("after the row of batch %d: %s", pending.row.batch_id, exc)
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()
