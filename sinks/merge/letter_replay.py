"""Replaying a change-feed table's dead letters: what to write, and under which transaction. Pure.

A letter is a change of (table, key) the replica refused, so the replica still holds that key as it
was before the change. Replaying it does not apply the refused change again: it writes the key's
**state at the version the replica has applied through** (``V``, the table's applied version, taken
between two of its batches), read from the source: the row the key has at ``V`` (an upsert), or, when
the key has no row at ``V``, a delete. Why that state and no other:

- every other key of the replica is as of ``V``; after the write this key is too, so the replica is
  the source at ``V`` again for it, exactly;
- the write cannot move the key backwards: no change of the key after ``V`` has been applied (the
  table's batches are held off while it runs, and the next batch applies the changes after ``V``
  on top of it, as for every other key). An older state could undo a change a later batch applied;
- every letter of the key, refused at any version up to ``V``, is settled by the same write: the
  state at ``V`` is what all of them lead to. They all become ``replayed`` (the resolution says which
  write settled them), whichever of them the operator named;
- a letter of a version above ``V`` cannot exist while the applied version is exact; one found is
  not replayed (:func:`unapplied`), never written from an older state.

The state at ``V`` comes from the source's snapshot at ``V`` (time travel, keys filtered). When that
version's files are gone (VACUUM, log cleanup) it is derived, still exactly, from the change feed
after ``V`` and the latest snapshot ``L``: the key's first change after ``V`` shows its state at
``V`` (an ``update_preimage`` or a ``delete`` holds the row as it was; an ``insert`` shows it had
none), and a key with no change in ``(V, L]`` is at ``V`` as it is at ``L`` (:func:`state_source`).
If neither can be read, the replay is refused with what to do.

Exactly once: the write carries a transaction id of its own, ``<the table's app id>/replay/<digest of
the letters it settles>`` (:func:`replay_txn`), so a replay repeated after a crash between the
replica's commit and the letters' update is skipped by Delta, and only recorded. A replay of other
letters writes its keys' state at the then applied version, which is never wrong: writing a key's
state at ``V`` twice changes nothing. A write the replica refuses because of a value is bisected by
key like a batch (:mod:`lakemirror.sinks.isolate`): each key refused alone stays ``pending`` with the
engine's new reason, every other is written.

Keys are matched by value: a letter's key (its columns and values as JSON) is read back into typed
values (:func:`key_values`), a NULL part matching NULL as the replica's ``MERGE`` does (``<=>``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Sequence

from lakemirror.identifiers import quote
from lakemirror.sinks.events.dead_letters import PENDING, REPLAYED, SKIPPED, Resolution
from lakemirror.sinks.merge.feed_letters import StoredFeedLetter
from lakemirror.sinks.merge.planner import (CHANGE_TYPE, COMMIT_VERSION, DELETE, INSERT, OP_COLUMN, UPDATE_POST,
                                            UPDATE_PRE, MergePlan)
from lakemirror.sinks.txn import TxnId

#: The column that carries a letter's key text through the replay's Spark plan.
LETTER_KEY = "__lm_letter_key"
#: The change types whose row is the key's state before the change (the state at ``V``, when they are
#: the key's first change after ``V``).
BEFORE_IMAGES = (UPDATE_PRE, DELETE)
#: Where a key's state at ``V`` comes from, when the snapshot at ``V`` is gone (:func:`state_source`).
FROM_FIRST_CHANGE, FROM_LATEST, ABSENT = "first-change", "latest", "absent"


@dataclass(frozen=True)
class KeyReplay:
    """One key of a table to write again, and every letter that write settles."""

    table: str
    key: str
    letters: tuple[StoredFeedLetter, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(x.id for x in self.letters)

    @property
    def newest_version(self) -> int:
        return max((x.commit_version for x in self.letters if x.commit_version is not None), default=-1)


def keys_to_replay(chosen: Iterable[StoredFeedLetter], recorded: Iterable[StoredFeedLetter]) -> list[KeyReplay]:
    """The keys of the ``chosen`` letters, each with the chosen letters of its key and every other
    ``pending`` letter of it among ``recorded`` (one write settles them all), in a fixed order."""
    wanted = {(x.table, x.key) for x in chosen}
    by_key: dict[tuple[str, str], dict[str, StoredFeedLetter]] = {k: {} for k in wanted}
    for letter in list(chosen) + [x for x in recorded if x.status == PENDING]:
        if (letter.table, letter.key) in by_key:
            by_key[(letter.table, letter.key)].setdefault(letter.id, letter)
    return [KeyReplay(table, key, tuple(sorted(found.values(), key=lambda x: (x.commit_version or -1, x.id))))
            for (table, key), found in sorted(by_key.items())]


def replay_txn(table_app_id: str, replays: Sequence[KeyReplay]) -> TxnId:
    """The transaction id of one replay of ``replays`` (one table's): the same for the same letters,
    so Delta skips a repeat of a replay it committed; numbered by the newest letter's version."""
    ids = sorted(i for r in replays for i in r.ids)
    digest = hashlib.sha256("\x00".join(ids).encode()).hexdigest()[:16]
    return TxnId(f"{table_app_id}/replay/{digest}", max([0, *(r.newest_version for r in replays)]))


def unapplied(replays: Sequence[KeyReplay], applied_through: int) -> dict[str, str]:
    """Why each key (by its key text) whose letters include a change newer than ``applied_through``
    cannot be replayed now: writing its state at ``applied_through`` could be older than the refused
    change's own version."""
    return {r.key: (f"its letter of version {r.newest_version} is newer than the version the table has applied "
                    f"({applied_through}); replay it once the table has applied that version")
            for r in replays if r.newest_version > applied_through}


# -- keys read back from their letters --------------------------------------------------------------

_INTEGRAL = ("tinyint", "smallint", "int", "integer", "bigint", "long", "short", "byte")


def key_values(key_text: str, columns: Sequence[tuple[str, str]]) -> tuple[Any, ...]:
    """The values of a letter's key (``{"column": value, ...}`` as JSON) in ``columns``' order, typed for
    Spark by each column's simple type name (``bigint``, ``decimal(12,2)``, ``timestamp`` …); raises
    ValueError naming what cannot be read back."""
    try:
        parsed = json.loads(key_text, parse_float=Decimal)
    except ValueError as exc:
        raise ValueError(f"its key {key_text!r} is not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"its key {key_text!r} is not an object of key columns")
    missing = [name for name, _ in columns if name not in parsed]
    if missing:
        raise ValueError(f"its key {key_text!r} lacks the key column(s) {', '.join(missing)} (the table's key "
                         f"changed since it was recorded)")
    return tuple(_typed(name, kind.lower(), parsed[name]) for name, kind in columns)


def _typed(name: str, kind: str, value: Any) -> Any:
    if value is None:
        return None
    try:
        if kind in _INTEGRAL:
            if isinstance(value, bool) or not isinstance(value, (int, Decimal)) or int(value) != value:
                raise ValueError
            return int(value)
        if kind.startswith("decimal"):
            if isinstance(value, bool):
                raise ValueError
            return Decimal(str(value)) if isinstance(value, (int, Decimal, str)) else _fail()
        if kind in ("double", "float", "real"):
            if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
                return float(value)
            if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
                raise ValueError
            return float(value)
        if kind.startswith(("string", "varchar", "char")):
            return value if isinstance(value, str) else _fail()
        if kind == "boolean":
            return value if isinstance(value, bool) else _fail()
        if kind == "date":
            return date.fromisoformat(value)
        if kind in ("timestamp", "timestamp_ntz", "timestamp_ltz"):
            return datetime.fromisoformat(value)
        if kind == "binary":
            if not isinstance(value, str) or not value.startswith("\\x"):
                raise ValueError
            return bytearray(bytes.fromhex(value[2:]))
    except (ValueError, TypeError, InvalidOperation):
        raise ValueError(f"its key column {name} ({kind}) holds {json.dumps(value, default=str)}, which is not a "
                         f"{kind} value") from None
    raise ValueError(f"its key column {name} is of type {kind}, which a letter's key cannot be matched by")


def _fail() -> Any:
    raise ValueError


# -- the state at V when the source's snapshot at V is gone ------------------------------------------

def first_change_expr(plan: MergePlan) -> str:
    """SQL aggregate: per key, the first change after ``V`` as a struct of the plan's columns with its
    type in ``__lm_op`` (lowest commit version; inside one, before-images first)."""
    payload = ", ".join(f"{quote(c.name)} AS {quote(c.name)}" for c in plan.columns)
    rank = (f"CASE {quote(CHANGE_TYPE)} WHEN '{UPDATE_PRE}' THEN 0 WHEN '{DELETE}' THEN 0 WHEN '{INSERT}' THEN 1 "
            f"WHEN '{UPDATE_POST}' THEN 2 END")
    return (f"min_by(struct({payload}, {quote(CHANGE_TYPE)} AS {quote(OP_COLUMN)}), "
            f"struct({quote(COMMIT_VERSION)}, {rank}))")


def state_source(first_change: str | None, in_latest: bool) -> str:
    """Where a key's state at ``V`` comes from, given its first change after ``V`` (None: it has none
    up to the latest version) and whether the latest version holds it: that change's row
    (:data:`FROM_FIRST_CHANGE`), the latest row (:data:`FROM_LATEST`) or none (:data:`ABSENT`)."""
    if first_change is None:
        return FROM_LATEST if in_latest else ABSENT
    if first_change in BEFORE_IMAGES:
        return FROM_FIRST_CHANGE
    if first_change == INSERT:
        return ABSENT
    raise ValueError(f"the key's first change after the applied version is an {first_change!r} without the "
                     f"before-image it follows: its state at that version cannot be told")


# -- what becomes of each letter ------------------------------------------------------------------

def _settled(replay: KeyReplay, status: str, text: str, reason: str | None = None) -> list[Resolution]:
    many = f" (one write for the key's {len(replay.letters)} letters)" if len(replay.letters) > 1 else ""
    return [Resolution(x.id, status, text + many, reason) for x in replay.letters]


def written(replay: KeyReplay, present: bool, version: int, replica: str, repeated: bool = False) -> list[Resolution]:
    """The key was written (or found written by an earlier run of the same replay: ``repeated``)."""
    what = (f"the source's row of version {version} written to {replica}" if present
            else f"the key has no row at source version {version}: deleted from {replica}")
    if repeated:
        what += " by an earlier run of this replay (Delta skipped the repeat)"
    return _settled(replay, REPLAYED, f"replayed: {what}")


def refused(replay: KeyReplay, reason: str) -> list[Resolution]:
    """The replica refused the key's state again: the letters stay pending, with the new reason."""
    return _settled(replay, PENDING, "replay refused by the replica", f"the replica refused it: {reason}")


def not_replayed(replay: KeyReplay, why: str) -> list[Resolution]:
    """Nothing was written for the key (``why`` says why and what to do); the letters stay pending."""
    return _settled(replay, PENDING, f"not replayed: {why}")


def skipped(letters: Iterable[StoredFeedLetter]) -> list[Resolution]:
    return [Resolution(x.id, SKIPPED, "skipped by the operator: nothing was written to the replica")
            for x in letters]
