"""An event source's poison events: isolated when a replica refuses a batch, skipped or replayed on
the operator's word.

**Isolation.** A replica's guarded write (:class:`~lakemirror.sinks.events.guard_merge.GuardedDeltaSink`)
refuses, before writing, every change whose value its column types cannot hold exactly (the pre-check:
:func:`lakemirror.sinks.events.event_rows.convert_row`, which names the column). What that check cannot
see (a ``CHECK`` constraint or ``NOT NULL`` an operator put on the replica, a value the engine refuses
anyway) fails the whole write, atomically. :func:`apply_isolating` then bisects the table's changes
(:func:`lakemirror.sinks.isolate.bisect`) until each refused write is one change, which becomes a dead
letter with the engine's reason; every other change is applied, and the source's other tables never
wait. Each attempt commits under its own transaction id derived from the batch's, and the changes
come in source order, so a batch replayed after a crash repeats the same attempts and Delta skips
those already committed; the sequence guard makes any change applied twice a no-op anyway.

**Skip and replay.** :func:`resolve_letters` carries out the operator's ``skip`` (the letter is marked
skipped; nothing is written to a replica) and ``replay`` (the letter's raw message is decoded again and
applied through the same guarded write, so it cannot move a row backwards: a change older than what
the replica holds counts as stale). A replay commits under the transaction id
``lakemirror/<pipeline>/<source>/<table>/replay`` with the dead-letter table's version as its
number: every resolution writes that table, so the number grows with each replay, and a replay
repeated after a crash between the replica's commit and the letters' update is skipped by Delta and
only recorded.
"""


from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Sequence

from lakemirror.sinks.events.dead_letters import (PENDING, REPLAYED, SKIPPED, VERBS, LetterReport, Resolution,
                                                  StoredLetter)
from lakemirror.sinks.events.guard_merge import GuardOutcome
from lakemirror.sinks.isolate import bisect, value_refusal
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.change_event import ChangeEvent, DeadLetter, Skipped

if TYPE_CHECKING:
    from lakemirror.sinks.events.guarded_sink import EventBatchApplier

log = logging.getLogger(__name__)

__all__ = ["apply_isolating", "combine", "resolve_letters"]


def combine(outcomes: Sequence[GuardOutcome], refused: Sequence[tuple[ChangeEvent, str]] = ()) -> GuardOutcome:
    """One outcome for the writes of a bisection (and the changes it refused)."""
    added: dict[str, None] = {}
    for o in outcomes:
        added.update(dict.fromkeys(o.added_columns))
    return GuardOutcome(
        ApplyCounts(sum(o.counts.inserted for o in outcomes), sum(o.counts.updated for o in outcomes),
                    sum(o.counts.deleted for o in outcomes)),
        replayed=bool(outcomes) and all(o.replayed for o in outcomes),
        applied=sum(o.applied for o in outcomes), stale=sum(o.stale for o in outcomes),
        rejected=tuple(r for o in outcomes for r in o.rejected) + tuple(refused),
        added_columns=tuple(added), tombstones=sum(o.tombstones for o in outcomes))


def apply_isolating(write: Callable[[Sequence[ChangeEvent], TxnId], GuardOutcome], changes: Sequence[ChangeEvent],
                    txn: TxnId, label: str) -> GuardOutcome:
    """``changes`` (one table's, in source order) written by ``write(changes, txn)``; when the write
    is refused because of a value, the changes are bisected and each one refused alone is returned
    among the outcome's ``rejected``, with the engine's reason."""
    try:
        return write(changes, txn)
    except Exception as exc:
        reason = value_refusal(exc)
        if reason is None:
            raise
        log.warning("%s: the replica refused batch %d (%s); finding the change(s) that cause it among %d",
                    label, txn.version, reason, len(changes))
    found = bisect(changes, write, txn, value_refusal, reason)
    refused = [(change, f"the replica refused it: {why}") for change, why in found.refused]
    log.warning("%s: batch %d: %d change(s) refused by the replica, dead-lettered; the other %d applied in %d "
                "write(s)", label, txn.version, len(refused), len(changes) - len(refused), found.attempts)
    return combine(found.applied, refused)


def _counts_text(o: GuardOutcome) -> str:
    return (f"{o.counts.inserted} inserted, {o.counts.updated} updated, {o.counts.deleted} deleted, "
            f"{o.stale} stale (not newer than what the replica holds)")


def resolve_letters(applier: "EventBatchApplier", verb: str, ids: Sequence[str] | None,
                    table: str | None = None) -> LetterReport:
    """Skip or replay the pending letters ``ids`` (None: every pending letter, of ``table`` if given).

    Called with the source's batches held off (the runner's batch lock): a replay writes the replicas
    the batches write."""
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}; expected one of {', '.join(VERBS)}")
    store, session = applier.dead_letters, applier.session_for("__dead_letters")
    found = store.letters(session, ids)
    unknown = tuple(sorted(set(ids or ()) - {letter.id for letter in found}))
    chosen = [letter for letter in found if (ids is not None or letter.status == PENDING)
              and (table is None or letter.table == table)]
    if not chosen:
        return LetterReport(verb, (), unknown)
    version = store.version(session)
    if verb == "skip":
        done = [Resolution(letter.id, SKIPPED, "skipped by the operator") for letter in chosen]
    else:
        done = _replay(applier, chosen, version)
    store.resolve(session, done, TxnId(f"{applier.app_prefix}/dead-letters/resolve", version), applier.clock())
    log.info("%s dead letters: %s %d (%s)", applier.spec.name, verb, len(done),
             ", ".join(f"{d.id} {d.status}" for d in done[:20]) + (" …" if len(done) > 20 else ""))
    return LetterReport(verb, tuple(done), unknown)


def _replay(applier: "EventBatchApplier", letters: Sequence[StoredLetter], version: int) -> list[Resolution]:
    done: list[Resolution] = []
    changes: list[ChangeEvent] = []
    letter_of: dict[int, StoredLetter] = {}
    for letter in letters:
        decoded = applier.decoder(letter.raw)
        if isinstance(decoded, DeadLetter):
            done.append(Resolution(letter.id, PENDING, "replay refused: the message still does not decode",
                                   decoded.reason))
        elif isinstance(decoded, Skipped):
            done.append(Resolution(letter.id, REPLAYED, f"replayed: nothing to apply ({decoded.reason})"))
        elif applier.spec.tables is not None and decoded.table not in applier.spec.tables:
            done.append(Resolution(letter.id, SKIPPED, f"not replayed: table {decoded.table!r} is not replicated"))
        else:
            changes.append(decoded)
            letter_of[id(decoded)] = letter
    plans, refused = applier.plan(changes)
    for change, reason in refused:
        done.append(Resolution(letter_of[id(change)].id, PENDING, "replay refused", reason))
    refused_ids = {id(c) for c, _ in refused}
    for name in sorted(plans):
        table_changes = [c for c in changes if c.table == name and id(c) not in refused_ids]
        sink = applier.sink_for(name)
        if sink is None:
            for change in table_changes:
                done.append(Resolution(letter_of[id(change)].id, PENDING, "replay refused",
                                       f"no replica for table {name!r}"))
            continue
        txn = TxnId(f"{applier.app_prefix}/{name}/replay", max(version, 0))
        session = applier.session_for(name)
        outcome = apply_isolating(lambda part, t: sink.apply(session, applier.plan(part)[0][name], t),
                                  table_changes, txn, f"{applier.spec.name}/{name} (replay)")
        rejected = {id(c): why for c, why in outcome.rejected}
        summary = ("replayed: already applied by an earlier replay" if outcome.replayed
                   else f"replayed into {name}: {_counts_text(outcome)}")
        for change in table_changes:
            letter = letter_of[id(change)]
            if id(change) in rejected:
                done.append(Resolution(letter.id, PENDING, "replay refused", rejected[id(change)]))
            else:
                done.append(Resolution(letter.id, REPLAYED, summary))
    return done
