"""How many connections the HTTP server serves at once, and which give way when it is full.

A fixed number of slots, each taken for a connection's whole life, let 32 sockets that never send a
byte hold every slot until their read timeout: probes of ``/healthz`` then got 503, and an attacker
reopening them kept it so. Here a connection is either *waiting* for its client (for a request
line, headers or body, or idle between requests) or *busy* (the server computes its answer). When
every slot is taken, a new connection takes the slot of the connection that has waited longest,
which is closed: stalled and slow clients give way to new ones, and a request that arrives whole
(a probe, a scrape) is served, however many stalled sockets there are. Only when every connection
is busy does a new one wait for nothing: it gets one of ``reserve`` extra slots that serve
``/healthz``, ``/readyz`` and ``/metrics`` only (cheap, and what orchestrators and Prometheus need;
there too the longest-waiting gives way), or, when those are all busy as well, an immediate 503.

Thread-safe; the clock is injected. :meth:`Capacity.admit` runs on the accepting thread, the other
methods on the connection's own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, TypeVar

C = TypeVar("C", bound=Hashable)

#: Routes a connection admitted into the reserve may serve.
PROBE_ROUTES = frozenset({"healthz", "readyz", "metrics"})


@dataclass
class _Slot:
    since: float
    busy: bool = False
    reserved: bool = False
    evicted: bool = False


class Capacity(Generic[C]):
    """``limit`` connections at once (the longest-waiting gives way to a new one), plus ``reserve``
    for probes when every connection is busy. ``evict(conn)`` closes a connection that gave way."""

    def __init__(self, limit: int, reserve: int, evict: Callable[[C], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or reserve < 0:
            raise ValueError("a capacity needs at least one connection and no negative reserve")
        self.limit, self.reserve = limit, reserve
        self._evict = evict
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: dict[C, _Slot] = {}

    def admit(self, conn: C) -> str | None:
        """Take a slot for a new connection: ``"slot"``, ``"reserve"`` (probes only) or None (refuse)."""
        with self._lock:
            live = [(c, s) for c, s in self._slots.items() if not s.evicted]
            for reserved, room in ((False, self.limit), (True, self.reserve)):
                pool = [(s.since, c) for c, s in live if s.reserved == reserved]
                victim = None
                if len(pool) >= room:
                    waiting = [(since, c) for since, c in pool if not self._slots[c].busy]
                    if not waiting:
                        continue  # every one busy: the reserve, then a refusal
                    victim = min(waiting, key=lambda pair: pair[0])[1]
                    self._slots[victim].evicted = True
                self._slots[conn] = _Slot(self._clock(), reserved=reserved)
                break
            else:
                return None
        if victim is not None:
            self._evict(victim)
        return "reserve" if reserved else "slot"

    def busy(self, conn: C) -> None:
        """The server works on the connection's request: it is not taken from it meanwhile."""
        with self._lock:
            slot = self._slots.get(conn)
            if slot is not None:
                slot.busy = True

    def waiting(self, conn: C) -> None:
        """The connection waits for its client from now (a next request, a body)."""
        with self._lock:
            slot = self._slots.get(conn)
            if slot is not None:
                slot.busy, slot.since = False, self._clock()

    def reserved(self, conn: C) -> bool:
        with self._lock:
            slot = self._slots.get(conn)
            return slot is not None and slot.reserved

    def release(self, conn: C) -> None:
        with self._lock:
            self._slots.pop(conn, None)

    def counts(self) -> tuple[int, int, int]:
        """(connections in slots, of which busy, in the reserve): for tests and logs."""
        with self._lock:
            live = [s for s in self._slots.values() if not s.evicted]
            return (sum(1 for s in live if not s.reserved), sum(1 for s in live if s.busy and not s.reserved),
                    sum(1 for s in live if s.reserved))
