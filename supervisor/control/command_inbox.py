"""Control commands between their acceptance and their effect: journalled, queued, planned.

A command (pause, resume, resync of one table) is accepted from any thread, the HTTP API's
included, and applied by the supervisor's thread at its next tick. Accepted means durable: the
command is written to the pipeline's command journal (:mod:`lakemirror.checkpoints.commands`)
before :meth:`CommandInbox.submit` returns, and a command that cannot be written is refused
(:class:`CommandNotRecorded`), never accepted on a promise the process could not keep. It leaves
the journal once its effect is in the table's state: a pause or resume as the persisted pause, a
resync as the reset progress that makes the table's next start bootstrap a new epoch.

So whatever ends the process between the 202 and the tick (SIGKILL, a crash, the OOM killer), the
next start finds the command (:meth:`CommandInbox.recover`) and records it in its table's state as
that table's runner is made, before the table starts, in the order the commands were accepted. A
command whose effect was recorded just before the kill, but not yet forgotten, is met again: a pause
or resume changes nothing the second time, and a resync whose table has moved to another epoch since
it was accepted is done already (:mod:`lakemirror.supervisor.control.command_plan`), so a replica is never
rebuilt twice for one request. The drain records what is still queued once the tables have stopped,
and from its start on, commands are refused (:class:`Draining`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Protocol, Sequence

from lakemirror.checkpoints.commands import VERBS, Command, CommandJournal, InMemoryCommandJournal
from lakemirror.supervisor.control import command_plan

log = logging.getLogger(__name__)

#: Why an operator's resync is recorded (the table's event history shows it).
OPERATOR_RESYNC = "resync requested by an operator"


class CommandRefused(Exception):
    """A command that was not accepted: nothing of it is queued or recorded (the HTTP API's 503)."""


class Draining(CommandRefused):
    """The supervisor is shutting down: a command is refused (send it again once the daemon runs)."""


class CommandNotRecorded(CommandRefused):
    """The command could not be journalled (or, for a resync, its table's epoch could not be read):
    refused rather than accepted without surviving a crash."""


class Recordable(Protocol):
    """What recording a command needs of a table's runner: its persisted pause and its resync."""

    def pause_persisted(self, paused: bool) -> None: ...
    def resync(self, reason: str) -> None: ...


def record(command: Command, runner: Recordable) -> None:
    """Record ``command``'s effect in its table's state without starting or stopping anything (at
    a start, before the table starts; in a drain, once it has stopped): a pause or resume as the
    persisted pause, a resync as the reset progress that makes the next start bootstrap anew."""
    if command.verb == "resync":
        runner.pause_persisted(False)  # a resync starts the table: no longer paused
        runner.resync(OPERATOR_RESYNC)
    else:
        runner.pause_persisted(command.verb == "pause")


class CommandInbox:
    """The commands of one supervisor (see the module docstring). ``epoch_of``: a table's
    transaction-id epoch as its state holds it, read without Spark (None: never bootstrapped)."""

    def __init__(self, journal: CommandJournal | None = None,
                 epoch_of: Callable[[str], str | None] | None = None) -> None:
        self.journal: CommandJournal = journal if journal is not None else InMemoryCommandJournal()
        self._epoch_of: Callable[[str], str | None] = epoch_of if epoch_of is not None else (lambda table: None)
        self._lock = threading.Lock()
        #: Accepted, not yet taken by a tick (or by the drain), and those whose table has no runner yet.
        self._queued: list[Command] = []
        self._recovered = False
        self._closed = False
        self._reported: set[int] = set()  # commands whose failure to apply was logged in full

    # -- any thread -------------------------------------------------------------------------------

    def submit(self, verb: str, tables: Sequence[str]) -> list[Command]:
        """Journal ``verb`` for each of ``tables`` in one write (all or none), then queue it.

        Raises :class:`Draining` once :meth:`close` was called, :class:`CommandNotRecorded` when
        the journal (or a resync's epoch) cannot be written or read."""
        if verb not in VERBS:
            raise ValueError(f"unknown command {verb!r}")
        if not tables:
            return []
        what = f"{verb} {', '.join(tables)}"
        with self._lock:
            if self._closed:
                raise Draining(f"{what}: the pipeline is shutting down and takes no more commands; send it "
                               f"again once the daemon runs")
            try:
                self._recover()  # the commands of an earlier process come first
            except OSError as exc:
                raise CommandNotRecorded(f"{what}: not accepted: the command journal {self.journal.where} cannot be "
                                         f"read ({_reason(exc)}), and it must be before a command is added to it; fix "
                                         f"the checkpoint folder, then send it again") from exc
            try:
                epochs = [self._epoch_of(t) if verb == "resync" else None for t in tables]
            except (OSError, ValueError) as exc:
                raise CommandNotRecorded(f"{what}: not accepted: the table's state cannot be read ({_reason(exc)}); "
                                         f"fix the checkpoint folder, then send it again") from exc
            try:
                accepted = self.journal.append([(verb, t, e) for t, e in zip(tables, epochs)])
            except OSError as exc:
                raise CommandNotRecorded(
                    f"{what}: not accepted: the command could not be recorded in {self.journal.where} "
                    f"({_reason(exc)}), and a command held in memory only would be lost if the daemon died before "
                    f"applying it; free space or fix the folder's permissions, then send it again") from exc
            self._queued += accepted
            return accepted

    # -- the supervisor's thread ------------------------------------------------------------------

    def recover(self) -> None:
        """Queue the commands an earlier process left in the journal (at start; once). A journal
        that cannot be read is said in the log; it is read again at each :meth:`take`, and until it
        can be, new commands are refused."""
        with self._lock:
            try:
                self._recover()
            except OSError as exc:
                log.error("the command journal %s cannot be read (%s): the commands accepted before this start are "
                          "applied once it can be, and new commands are refused until then", self.journal.where,
                          _reason(exc))

    def take(self, has_runner: Callable[[str], bool]) -> list[Command]:
        """The queued commands whose table has a runner, in acceptance order; the others wait for
        theirs (:meth:`take_for`)."""
        with self._lock:
            if not self._recovered:
                try:
                    self._recover()
                except OSError as exc:
                    log.debug("the command journal %s still cannot be read: %s", self.journal.where, exc)
            ready = [c for c in self._queued if has_runner(c.table)]
            self._queued = [c for c in self._queued if not has_runner(c.table)]
        return ready

    def take_for(self, table: str) -> list[Command]:
        """The queued commands of ``table``, whose runner was just made (recorded before it starts)."""
        return self.take(lambda name: name == table)

    def close(self, has_runner: Callable[[str], bool]) -> list[Command]:
        """Refuse commands from now on; the queued ones whose table has a runner (to record as the
        drain ends). Those of tables without one stay in the journal for the next start."""
        with self._lock:
            self._closed = True
        return self.take(has_runner)

    def plan(self, commands: Sequence[Command]) -> list[Command]:
        """The commands of ``commands`` still to apply (:func:`command_plan.plan`); the journal
        forgets the others, whose effect is there already."""
        epochs: dict[str, str | None] = {}
        for table in command_plan.resync_tables(commands):
            try:
                epochs[table] = self._epoch_of(table)
            except Exception as exc:  # noqa: BLE001 (applied then: its runner says what fails)
                log.warning("table %s: cannot read its epoch: %s", table, exc)
        out, done = [], []
        for step in command_plan.plan(commands, epochs):
            if step.apply:
                out.append(step.command)
                continue
            c = step.command
            log.info("table %s: the %s accepted at %s is not applied again: %s", c.table, c.verb, _when(c.accepted_at),
                     step.done)
            done.append(c.seq)
        self.journal.remove(done)
        return out

    def apply(self, commands: Sequence[Command], effect: Callable[[Command], None]) -> list[Command]:
        """Apply ``commands`` in order through ``effect`` (after :meth:`plan`), forgetting each one
        whose effect returned; the applied ones.

        A command whose effect raises (its table's state cannot be written) stays, and so does every
        later command of its table, queued and journalled in order: the next :meth:`take` tries them
        again (the next start, if the process ends first), so a table's commands never take effect
        out of the order they were accepted in."""
        applied: list[Command] = []
        held: list[Command] = []
        blocked: set[str] = set()
        for command in self.plan(commands):
            if command.table in blocked:
                held.append(command)
                continue
            try:
                effect(command)
            except Exception:  # noqa: BLE001 (one table's state file must not stop the others')
                self._failed(command)
                blocked.add(command.table)
                held.append(command)
                continue
            self.journal.remove([command.seq])
            applied.append(command)
        if held:
            with self._lock:
                self._queued = sorted(self._queued + held, key=lambda c: c.seq)
        return applied

    def _failed(self, command: Command) -> None:
        if command.seq in self._reported:
            log.debug("table %s: the %s accepted at %s still cannot be applied", command.table, command.verb,
                      _when(command.accepted_at), exc_info=True)
            return
        self._reported.add(command.seq)
        log.exception("table %s: the %s accepted at %s cannot be applied (its state cannot be written); it stays in "
                      "%s, tried again with the table's later commands after it", command.table, command.verb,
                      _when(command.accepted_at), self.journal.where)

    # -- internals --------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Under ``_lock``: read the journal's commands from before this process, once."""
        if self._recovered:
            return
        found = self.journal.pending()
        self._recovered = True
        if found:
            log.info("%d command(s) accepted before this start and not yet applied, applied now in order: %s",
                     len(found), "; ".join(f"{c.verb} {c.table}" for c in found[:20]))
        self._queued = sorted(found + self._queued, key=lambda c: c.seq)


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or exc) or type(exc).__name__


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
