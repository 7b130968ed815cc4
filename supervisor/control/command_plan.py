"""Which accepted control commands still need applying. Pure: commands and epochs in, steps out.

A command is journalled before its 202 (:mod:`lakemirror.checkpoints.commands`) and removed once
its effect is in the table's state, so a command may be met again after its effect was recorded: a
process killed between the two finds it in the journal at its next start. Applying a pause or a
resume again changes nothing. A resync would rebuild the replica a second time, so a resync records
the table's epoch when it is accepted, and one whose table has another epoch now has taken effect
already (its new bootstrap began: a resync moves the table to a new epoch as its bootstrap starts),
or the table was rebuilt anyway since it was accepted: it is done, not applied.

The same rule serves a running daemon's tick: a command is applied at most once, however it was
met, and two identical commands of one table in a row are one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from lakemirror.checkpoints.commands import Command


@dataclass(frozen=True)
class Step:
    """What to do with one command: apply it, or only forget it (``done`` says why)."""

    command: Command
    apply: bool
    done: str | None = None


def plan(commands: Sequence[Command], epochs: Mapping[str, str | None]) -> list[Step]:
    """One step per command, in order. ``epochs``: the current epoch of each table a resync names
    (a table missing from it could not be read: its resync is applied, and its runner says why it
    cannot be)."""
    steps: list[Step] = []
    last: dict[str, str] = {}  # per table: the verb of the last command applied here
    for command in commands:
        table = command.table
        if command.verb == "resync" and table in epochs and epochs[table] != command.epoch:
            steps.append(Step(command, False, f"done already: the table was bootstrapped anew since the resync "
                                              f"was accepted (epoch {command.epoch or 'none'}, now "
                                              f"{epochs[table] or 'none'})"))
            continue
        if last.get(table) == command.verb:
            steps.append(Step(command, False, f"the same {command.verb} as the command before it"))
            continue
        last[table] = command.verb
        steps.append(Step(command, True))
    return steps


def resync_tables(commands: Sequence[Command]) -> list[str]:
    """The tables whose current epoch :func:`plan` needs, each once, in order."""
    return list(dict.fromkeys(c.table for c in commands if c.verb == "resync"))
