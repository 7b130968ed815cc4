"""A drain's halts: every table's runner halted at once, under one deadline.

All halts start together, each on a thread of its own: every table stops taking new batches at the
same moment, each gets the whole drain to finish its batch in flight, and a table whose halt hangs
(a query's ``stop()`` over a Spark Connect server that is gone, a replica server that does not
answer) holds up no other table and not the caller, who gets back, at the deadline, the tables
whose halt had not finished and what each was waiting for. Their threads are abandoned
(:mod:`lakemirror.bounded`): what they leave is what a crash at that moment leaves, and every
table's batches are idempotent and replayed at the next start.
"""

from __future__ import annotations

from functools import partial
from typing import Mapping, Protocol

from lakemirror.bounded import all_within

#: How long past the halts' own deadline their threads are waited for: a halt that ends exactly at
#: the deadline (its last wait timed out) is a finished halt, not an abandoned one.
SLACK_SECONDS = 0.5


class Halting(Protocol):
    def halt(self, timeout: float = 60.0) -> None: ...


def halt_all(runners: Mapping[str, Halting], timeout: float) -> list[str]:
    """Halt every runner at once, each given ``timeout``; return, after at most ``timeout`` (plus
    :data:`SLACK_SECONDS`), the tables whose halt had not finished or left something unfinished at
    its deadline (a runner's ``halting``, when it has one), each followed by what that was, e.g.
    ``orders (stopping its query)``."""
    if not runners:
        return []
    calls = {name: partial(runner.halt, timeout) for name, runner in runners.items()}
    late = set(all_within(calls, timeout + SLACK_SECONDS, prefix="halt"))
    out = []
    for name, runner in runners.items():
        halting = getattr(runner, "halting", None)
        if name in late or isinstance(halting, str):  # still halting, or returned leaving that unfinished
            out.append(_described(name, halting))
    return out


def _described(name: str, halting: object) -> str:
    return f"{name} ({halting})" if isinstance(halting, str) and halting else name
