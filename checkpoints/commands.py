"""The command journal: control commands accepted but not yet recorded in their table's state.

``lakemirror pause|resume|resync`` and their HTTP routes answer 202 once the command is queued for
the supervisor, which applies it at its next tick. The journal makes that answer hold whatever
happens to the process: a command is written here, durably, before the answer (a command that
cannot be written is refused, never accepted); it is removed once its effect is in the table's
state (a pause or resume as the persisted pause, a resync as the reset progress that makes the next
start bootstrap a new epoch); a daemon that starts finds what a killed one left here and applies it
before its tables start.

One JSON document per pipeline, ``<pipeline folder>/commands.json`` (:func:`layout.commands_file`),
replaced whole on every change: written to a temporary file beside it, flushed to disk, renamed over
it, and the folder flushed, so a kill or a power loss leaves the old list or the new one, never a
part of either. A document that cannot be parsed (it was edited by hand, or a disk returned garbage)
is set aside under another name, kept for the operator, and said so in the log.

Two implementations behind :class:`CommandJournal`: :class:`FileCommandJournal`, and
:class:`InMemoryCommandJournal`, its twin for unit tests, whose ``stored`` list is what a process
killed now would leave behind, and whose writes and reads can be made to fail.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Protocol, Sequence

from lakemirror.checkpoints import layout

log = logging.getLogger(__name__)

#: The commands a journal holds.
VERBS = ("pause", "resume", "resync")
#: The version of the document's layout (``{"format": 1, "commands": [...]}``).
FORMAT = 1


@dataclass(frozen=True)
class Command:
    """One accepted command. ``seq`` orders a journal's commands (acceptance order); ``epoch`` is a
    resync's: the table's transaction-id epoch when it was accepted, so that a resync whose table has
    been bootstrapped anew since is known to have taken effect (and is not applied twice)."""

    seq: int
    verb: str
    table: str
    accepted_at: float
    epoch: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "verb": self.verb, "table": self.table, "accepted_at": self.accepted_at,
                "epoch": self.epoch}

    @classmethod
    def from_json(cls, data: Any) -> "Command | None":
        """The command ``data`` describes, or None when it is not one."""
        if not isinstance(data, dict):
            return None
        seq, verb, table, at, epoch = (data.get(k) for k in ("seq", "verb", "table", "accepted_at", "epoch"))
        if not isinstance(seq, int) or isinstance(seq, bool) or verb not in VERBS or not isinstance(table, str) \
                or not table or not isinstance(at, (int, float)) or not (epoch is None or isinstance(epoch, str)):
            return None
        return cls(seq, str(verb), table, float(at), epoch)


#: A command to record: (verb, table, epoch).
Request = tuple[str, str, "str | None"]


class CommandJournal(Protocol):
    """Where accepted commands wait for their effect. Thread-safe; every method may raise ``OSError``
    (:meth:`remove` never does: a removal that cannot be written is written with the next change)."""

    @property
    def where(self) -> str:
        """Where the journal is, for messages."""
        ...

    def pending(self) -> list[Command]:
        """The commands not yet removed, in acceptance order."""
        ...

    def append(self, requests: Sequence[Request]) -> list[Command]:
        """Record ``requests`` (all or none) and return them as commands once they are durable."""
        ...

    def remove(self, seqs: Collection[int]) -> None:
        """Forget the commands numbered ``seqs`` (their effect is recorded in their tables' state)."""
        ...


class _ListJournal:
    """What both journals share: the list in memory, the numbering, all-or-nothing changes.

    The list in memory is what the journal means to hold. An append is added to it only once it is
    written; a removal always is, and one that cannot be written goes to disk with the next change
    that can (a journal whose every write fails accepts no new command, so the stale entry left on
    disk is applied again by the next start at worst, which pause, resume and the epoch-guarded
    resync make harmless)."""

    def __init__(self, clock: Any = time.time) -> None:
        self._lock = threading.Lock()
        self._entries: list[Command] | None = None
        self._next = 1
        self._clock = clock

    def _read(self) -> list[Command]:
        raise NotImplementedError

    def _write(self, entries: list[Command]) -> None:
        raise NotImplementedError

    def _loaded(self) -> list[Command]:
        if self._entries is None:
            entries = sorted(self._read(), key=lambda c: c.seq)
            self._entries = entries
            self._next = max((c.seq for c in entries), default=0) + 1
        return self._entries

    def pending(self) -> list[Command]:
        with self._lock:
            return list(self._loaded())

    def append(self, requests: Sequence[Request]) -> list[Command]:
        for verb, table, _ in requests:
            if verb not in VERBS:
                raise ValueError(f"unknown command {verb!r}")
        with self._lock:
            entries = self._loaded()
            now = float(self._clock())
            new = [Command(self._next + i, verb, table, now, epoch) for i, (verb, table, epoch) in enumerate(requests)]
            if not new:
                return []
            self._write(entries + new)
            self._entries = entries + new
            self._next += len(new)
            return new

    def remove(self, seqs: Collection[int]) -> None:
        wanted = set(seqs)
        if not wanted:
            return
        with self._lock:
            try:
                entries = self._loaded()
            except OSError as exc:  # never read, so it holds none of these commands in memory
                log.warning("the command journal %s cannot be read (%s): nothing removed", self.where,
                            exc.strerror or exc)
                return
            kept = [c for c in entries if c.seq not in wanted]
            if len(kept) == len(entries):
                return
            self._entries = kept
            try:
                self._write(kept)
            except OSError as exc:
                log.warning("the command journal %s could not be updated (%s): the commands applied stay in it "
                            "until its next change is written; a start before that applies them again, which "
                            "changes nothing", self.where, exc.strerror or exc)

    @property
    def where(self) -> str:
        raise NotImplementedError


class InMemoryCommandJournal(_ListJournal):
    """The twin. ``stored`` is what survives a kill of the process now (hand it to a new twin to
    start again); arm ``write_error`` or ``read_error`` to make writes or reads fail."""

    def __init__(self, stored: Sequence[Command] = (), clock: Any = time.time) -> None:
        super().__init__(clock)
        self.stored: list[Command] = list(stored)
        self.write_error: OSError | None = None
        self.read_error: OSError | None = None
        self.writes = 0

    @property
    def where(self) -> str:
        return "the in-memory command journal"

    def _read(self) -> list[Command]:
        if self.read_error is not None:
            raise self.read_error
        return list(self.stored)

    def _write(self, entries: list[Command]) -> None:
        if self.write_error is not None:
            raise self.write_error
        self.stored = list(entries)
        self.writes += 1


class FileCommandJournal(_ListJournal):
    """The journal in ``path`` (:func:`layout.commands_file` of the pipeline's folder)."""

    def __init__(self, path: str | os.PathLike[str], clock: Any = time.time) -> None:
        super().__init__(clock)
        self.path = Path(path)

    @property
    def where(self) -> str:
        return str(self.path)

    def _read(self) -> list[Command]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("commands"), list):
                raise ValueError(f"not a command journal of format {FORMAT}")
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            self._set_aside(exc)
            return []
        out = []
        for item in doc["commands"]:
            command = Command.from_json(item)
            if command is None:
                log.error("the command journal %s holds an entry that is not a command, left out: %s", self.path,
                          json.dumps(item)[:200])
                continue
            out.append(command)
        return out

    def _set_aside(self, problem: Exception) -> None:
        aside = layout.commands_file_unreadable(self.path.parent, time.strftime("%Y%m%dT%H%M%S"))
        self.path.replace(aside)
        log.error("the command journal %s cannot be read (%s): set aside as %s. The pause, resume or resync "
                  "commands it held were accepted but are not applied: read it, send again those still "
                  "wanted (lakemirror pause|resume|resync), then delete it", self.path, str(problem)[:200], aside)

    def _write(self, entries: list[Command]) -> None:
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"format": FORMAT, "commands": [c.as_json() for c in entries]}, fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    """Flush ``folder``'s entries (the rename) to disk; a file system that cannot is left as it is."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
