"""A running daemon's hold on its pipeline's lease: taken at start, renewed, released at stop.

Lifecycle: :meth:`PipelineLease.acquire` takes the lease in every store (the checkpoint folder's,
and the object store's when the tables live there) or raises :class:`~.lease.LeaseHeld` naming the
holder, having released what it took (:class:`~.lease.LeaseUnreachable` when a store cannot be
read or written); :meth:`PipelineLease.start` renews it on a thread of its
own every ``renew_seconds`` (a thread, so that a busy control loop never lets it expire);
:meth:`PipelineLease.release` stops the thread and marks each generation released, so the next
daemon starts at once. When a renewal finds the lease lost (:func:`~.lease.renewal`), ``on_lost``
is called once, from the heartbeat thread, with the reason: the daemon must stop writing.

Policy decisions are :mod:`.lease`'s (pure); this class only reads and writes the stores.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable, Sequence

from lakemirror.checkpoints.lease import (
    Alive, Holder, LeaseHeld, LeasePolicy, LeaseRecord, LeaseUnreachable, Standing, Verdict, judge, record_for, renewal,
    renewed,
)
from lakemirror.checkpoints.lease_store import LeaseStore

log = logging.getLogger(__name__)

#: How often acquiring retries after losing a race for a generation to another daemon.
RACE_ATTEMPTS = 3


class PipelineLease:
    def __init__(self, pipeline_id: str, stores: Sequence[LeaseStore], me: Holder, policy: LeasePolicy,
                 alive: Alive, *, clock: Callable[[], float] = time.time,
                 on_lost: Callable[[str], None] = lambda reason: None) -> None:
        self.pipeline_id = pipeline_id
        self.stores = list(stores)
        self.me = me
        self.policy = policy
        self.alive = alive
        self.clock = clock
        self.on_lost = on_lost
        #: The record last written to each store, by index (a store is in it while the lease is held there).
        self._held: dict[int, LeaseRecord] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None   # why the lease was lost (None: held, or never taken)

    @property
    def held(self) -> bool:
        """Whether this daemon holds the lease in every store (and has not lost it)."""
        with self._lock:
            return self.lost is None and len(self._held) == len(self.stores) and bool(self.stores)

    # -- acquire --------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take the lease in every store, or raise :class:`LeaseHeld` with none taken."""
        try:
            for index, store in enumerate(self.stores):
                record = self._acquire_one(store)
                with self._lock:
                    self._held[index] = record
        except BaseException:
            self.release()
            raise

    def _acquire_one(self, store: LeaseStore) -> LeaseRecord:
        try:
            return self._take(store)
        except LeaseHeld:
            raise
        except Exception as exc:  # the store's own failure (unreachable, refused, no conditional puts)
            raise LeaseUnreachable(self.pipeline_id, store.where, exc) from exc

    def _take(self, store: LeaseStore) -> LeaseRecord:
        decision = None
        for _ in range(RACE_ATTEMPTS):
            now = self.clock()
            current = store.newest()
            decision = judge(current, self.me, now, self.policy, self.alive)
            if decision.verdict is Verdict.HELD:
                expires = current.record.expires_at if current is not None and current.record is not None else None
                raise LeaseHeld(self.pipeline_id, store.where, decision.holder,
                                None if expires is None else expires - now, decision.reason)
            record = record_for(self.me, decision.generation, now, self.policy)
            if store.create(record):
                if decision.verdict is Verdict.TAKE_OVER:
                    log.warning("pipeline %s: took the lease over (%s)", self.pipeline_id, decision.reason)
                store.prune(decision.generation)
                return record
            # Another daemon created that generation first: judge again against it.
        holder = decision.holder if decision is not None else None
        raise LeaseHeld(self.pipeline_id, store.where, holder, None, "another daemon took it at the same moment")

    # -- renew ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Renew the lease every ``renew_seconds`` on a thread of its own, until :meth:`release`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease:{self.pipeline_id}", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.policy.renew_seconds):
            if not self.renew():
                return

    def renew(self, url: str | None = None) -> bool:
        """Renew the lease in every store now (with the daemon's HTTP address, once known); False,
        after calling ``on_lost`` once, when it is lost."""
        with self._lock:
            if self.lost is not None:
                return False
            if url is not None:
                self.me = replace(self.me, url=url)
            held = dict(self._held)
        for index, mine in held.items():
            store = self.stores[index]
            now = self.clock()
            try:
                current = store.newest()
            except Exception as exc:  # noqa: BLE001 (unreadable now: kept while it has not expired)
                log.warning("pipeline %s: cannot read the lease at %s: %s", self.pipeline_id, store.where, exc)
                current = None
            standing, reason = renewal(current, mine, now)
            if standing is Standing.LOST:
                self._lose(f"{reason} (lease {store.where})")
                return False
            fresh = renewed(mine, now, self.policy, url)
            try:
                store.write(fresh)
            except Exception as exc:  # noqa: BLE001 (retried at the next heartbeat, until the lease expires)
                log.warning("pipeline %s: cannot renew the lease at %s: %s", self.pipeline_id, store.where, exc)
                continue
            with self._lock:
                if index in self._held:
                    self._held[index] = fresh
        return True

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = reason
            self._held.clear()
        self._stop.set()
        log.error("pipeline %s: lost its lease: %s", self.pipeline_id, reason)
        self.on_lost(reason)

    # -- release --------------------------------------------------------------------------------

    def release(self) -> None:
        """Stop renewing and mark each generation this daemon still holds released. Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)
        with self._lock:
            held, self._held = dict(self._held), {}
        for index, mine in held.items():
            store = self.stores[index]
            try:
                current = store.newest()
                if current is not None and current.generation == mine.generation and current.record is not None \
                        and current.record.holder.token == mine.holder.token:
                    store.write(replace(renewed(mine, self.clock(), self.policy), released=True))
            except Exception as exc:  # noqa: BLE001 (the lease then expires by itself)
                log.warning("pipeline %s: cannot release the lease at %s (it expires in %.0fs): %s",
                            self.pipeline_id, store.where, max(0.0, mine.expires_at - self.clock()), exc)
