"""One writer per pipeline: the lease's record and its policy, as pure functions of (record, now).

A daemon holds its pipeline's lease for as long as it runs. The lease is a sequence of
*generations*, each one record in a store (:mod:`lakemirror.checkpoints.lease_store`): the newest
generation is the lease. A daemon takes the lease by creating the next generation, atomically and
only if absent (a file linked into place, an S3 object put with ``If-None-Match: *``), so of two
daemons racing for it exactly one wins; the holder renews its own generation on a heartbeat and
marks it released when it stops. Because nobody but its holder ever writes a generation, and a new
holder always writes a new one, a holder that was frozen past its expiry learns at its next renewal
that a newer generation exists, and stops.

Who may take the lease (:func:`judge`):

- nobody holds it (no generation yet, or the newest one is released);
- its holder let it expire: no renewal for ``ttl_seconds``;
- its holder ran on this host and is gone: its process no longer exists (same boot of the host,
  no live process with its pid and start time), or the host rebooted since.

Anyone else is refused, with the holder named (:meth:`Holder.describe`). A holder keeps the lease
only while each renewal lands before its record expires (:func:`renewal`): one that could not renew
in time (its store unreachable, or the process frozen) stops, as if it had lost the lease, since
another daemon may already have taken it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any, Callable

from lakemirror.errors import TerminalError, excerpt


@dataclass(frozen=True)
class LeasePolicy:
    """How long a lease lives without renewal, and how often its holder renews it."""

    ttl_seconds: float = 30.0
    renew_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_seconds < self.ttl_seconds:
            raise ValueError(f"a lease must be renewed more often than it expires (renew every "
                             f"{self.renew_seconds}s, expires after {self.ttl_seconds}s)")


@dataclass(frozen=True)
class Holder:
    """A daemon that holds (or asks for) a pipeline's lease."""

    host: str
    pid: int
    token: str                          # unique to one acquisition: tells holders apart on one host and pid
    since: float                        # when this daemon took (or asked for) the lease
    url: str | None = None              # its HTTP address, once bound
    boot_id: str | None = None          # the host's boot (Linux: /proc/sys/kernel/random/boot_id)
    process_start: str | None = None    # the pid's start time on that boot (Linux: /proc/<pid>/stat)
    config: str | None = None           # the configuration file it runs

    def describe(self) -> str:
        """``host H, pid P, http://…, since <UTC time>`` (what a refused daemon prints)."""
        parts = [f"host {self.host}", f"pid {self.pid}"]
        if self.url:
            parts.append(self.url)
        parts.append(f"since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.since))}")
        if self.config:
            parts.append(f"config {self.config}")
        return ", ".join(parts)


@dataclass(frozen=True)
class LeaseRecord:
    """One generation of a lease: who holds it and until when."""

    generation: int
    holder: Holder
    renewed_at: float
    expires_at: float
    released: bool = False

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def decode(generation: int, body: bytes) -> "LeaseRecord | None":
        """The record stored as generation ``generation``; None when it cannot be read as one."""
        try:
            data = json.loads(body.decode())
            holder = Holder(**{k: v for k, v in data["holder"].items() if k in Holder.__dataclass_fields__})
            return LeaseRecord(generation, holder, float(data["renewed_at"]), float(data["expires_at"]),
                               bool(data.get("released", False)))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class Stored:
    """The newest generation a store holds, as read: its record (None: unreadable) and when it was
    last written (the store's own clock; how an unreadable generation ages)."""

    generation: int
    record: LeaseRecord | None
    modified_at: float


class Verdict(Enum):
    ACQUIRE = "acquire"      # nobody holds the lease: create the next generation
    TAKE_OVER = "take over"  # its holder is gone: create the next generation
    HELD = "held"            # someone else holds it: refuse


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    generation: int          # the generation to create (ACQUIRE, TAKE_OVER) or the one held (HELD)
    reason: str
    holder: Holder | None = None  # the holder that refuses us, or the one we take over from


#: Whether a holder's process is alive, asked only of a holder on this host and boot:
#: True, False, or None when it cannot be told (then it counts as alive).
Alive = Callable[[Holder], "bool | None"]


def record_for(me: Holder, generation: int, now: float, policy: LeasePolicy) -> LeaseRecord:
    """A fresh record of ``me`` holding ``generation`` from ``now``."""
    return LeaseRecord(generation, me, now, now + policy.ttl_seconds)


def renewed(record: LeaseRecord, now: float, policy: LeasePolicy, url: str | None = None) -> LeaseRecord:
    """``record`` renewed at ``now`` (with the holder's HTTP address, once known)."""
    holder = record.holder if url is None else replace(record.holder, url=url)
    return replace(record, holder=holder, renewed_at=now, expires_at=now + policy.ttl_seconds)


def judge(current: Stored | None, me: Holder, now: float, policy: LeasePolicy, alive: Alive) -> Decision:
    """May ``me`` take the lease whose newest generation is ``current``?"""
    if current is None:
        return Decision(Verdict.ACQUIRE, 1, "no daemon has held the lease")
    nxt = current.generation + 1
    record = current.record
    if record is None:  # unreadable: it ages by the store's own time
        if now - current.modified_at >= policy.ttl_seconds:
            return Decision(Verdict.TAKE_OVER, nxt, "the last lease record is unreadable and older than the "
                                                    "lease's lifetime")
        return Decision(Verdict.HELD, current.generation, "the lease record is being written or is unreadable")
    holder = record.holder
    if record.released:
        return Decision(Verdict.ACQUIRE, nxt, "the last holder released the lease", holder)
    if holder.token == me.token:
        return Decision(Verdict.HELD, current.generation, "this daemon holds the lease already", holder)
    if record.expires_at <= now:
        return Decision(Verdict.TAKE_OVER, nxt, f"its holder ({holder.describe()}) did not renew it for "
                                                f"{now - record.renewed_at:.0f}s", holder)
    if holder.host == me.host:
        if holder.boot_id and me.boot_id and holder.boot_id != me.boot_id:
            return Decision(Verdict.TAKE_OVER, nxt, f"its holder ({holder.describe()}) ran before this host "
                                                    f"restarted", holder)
        if holder.pid == me.pid and holder.process_start and me.process_start \
                and holder.process_start != me.process_start:
            return Decision(Verdict.TAKE_OVER, nxt, f"its holder ({holder.describe()}) was an earlier process "
                                                    f"with this pid", holder)
        if holder.pid != me.pid and alive(holder) is False:
            return Decision(Verdict.TAKE_OVER, nxt, f"its holder ({holder.describe()}) is no longer running",
                            holder)
    return Decision(Verdict.HELD, current.generation, "held", holder)


class Standing(Enum):
    KEPT = "kept"   # renew the record
    LOST = "lost"   # stop writing: another daemon holds the lease, or may


def renewal(current: Stored | None, mine: LeaseRecord, now: float) -> tuple[Standing, str]:
    """Whether the holder of ``mine`` (its record as last written) still holds the lease at ``now``,
    given the newest generation in the store (None: it could not be read)."""
    if current is not None and current.generation > mine.generation:
        who = current.record.holder.describe() if current.record is not None else "another daemon"
        return Standing.LOST, f"another daemon took the lease over ({who})"
    if current is not None and current.generation == mine.generation and current.record is not None \
            and current.record.holder.token != mine.holder.token:
        return Standing.LOST, f"another daemon holds the lease ({current.record.holder.describe()})"
    if now >= mine.expires_at:
        return Standing.LOST, (f"the lease was not renewed for {now - mine.renewed_at:.0f}s, past its lifetime: "
                               f"another daemon may have taken it")
    return Standing.KEPT, "kept"


class LeaseHeld(TerminalError):
    """Another daemon holds the pipeline's lease: this one must not start."""

    code = "lease_held"

    def __init__(self, pipeline_id: str, where: str, holder: Holder | None, expires_in: float | None,
                 reason: str = "") -> None:
        who = holder.describe() if holder is not None else "another daemon"
        expiry = "" if expires_in is None else f"; if that daemon is gone, its lease expires in {max(0.0, expires_in):.0f}s"
        detail = "" if holder is not None or not reason else f" ({reason})"
        super().__init__(f"pipeline {pipeline_id} is already run by {who}{detail} (lease {where}){expiry}: stop "
                         f"that daemon first, or give this pipeline another pipeline_id or checkpoint_volume")
        self.pipeline_id, self.holder, self.where = pipeline_id, holder, where


class LeaseUnreachable(TerminalError):
    """A store of the pipeline's lease could not be read or written when the daemon started: it cannot
    tell whether another daemon runs the pipeline, so it does not start."""

    code = "lease_unreachable"

    def __init__(self, pipeline_id: str, where: str, cause: BaseException) -> None:
        super().__init__(f"pipeline {pipeline_id}: its lease at {where} could not be read or written "
                         f"({type(cause).__name__}: {excerpt(str(cause), 300)}), so whether another daemon runs "
                         f"it is unknown: make that store reachable")
        self.pipeline_id, self.where = pipeline_id, where


class LeaseLost(TerminalError):
    """The daemon no longer holds its pipeline's lease and stopped replicating."""

    code = "lease_lost"


def as_json(record: LeaseRecord | None) -> dict[str, Any] | None:
    """A record as plain data (status output)."""
    return None if record is None else asdict(record)
