"""What a replica's work waits on in its destination's server, in terms every destination shares.

A wait holds a table's replication back without failing it: the server does not answer (each call
retries its connection for a while), or another session holds a lock the replica's statement needs.
A destination reports its waits as :class:`ServerWait` values (the supervisor turns them into the
table's state, :mod:`lakemirror.supervisor.control.destination_waits`); a Delta replica, written by Spark,
has none. :class:`LockWait` is what a server says about one of its processes waiting for a lock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerWait:
    """A wait that holds a replica's work back: since when, what it waits on and what ends it."""

    since: float
    reason: str
    code: str


@dataclass(frozen=True)
class LockWait:
    """What the server says about one of its processes waiting for a lock."""

    relation: str | None                 # the relation waited for, where the lock is on one
    holders: tuple[str, ...]             # each blocking session, described
