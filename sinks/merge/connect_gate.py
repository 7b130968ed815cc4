"""Turns across the Spark Connect boundary: a gate of files between the daemon and the batch function.

In classic mode each table's always-on query waits for its turn inside its batch function
(:mod:`lakemirror.supervisor.apply_workers.query_gate`): before applying a batch until a turn is granted, and after
it until the next turn, so that Spark commits the batch and plans the next one only when the table
is served again (the next batch then holds everything committed up to that turn), and no query
plans or merges while others have their turn. Over Spark Connect the batch function runs in a
Python worker on the server, so the gate is a folder beside the query's checkpoint, on the volume
the daemon and the server share (``lakemirror_turns/``), and its moves are atomic renames:

- ``grant-<n>``: the daemon grants turn ``n``; the batch function claims it by renaming it to
  ``taken-<n>``, and the daemon withdraws it by renaming it to ``withdrawn-<n>``: one of the two wins;
- ``done-<n>``: the batch function has applied its batch (or failed) in turn ``n``;
- ``waiting`` / ``held``: a batch waits for a turn before applying / after it (its batch id);
- ``generation``: the daemon run that owns the gate. A batch function started by an earlier run (a
  query that outlived its daemon on the server) finds another generation and fails its query,
  before applying anything more: only the current run's query applies batches;
- ``alive``: touched by the daemon at every poll. A batch function that finds it older than
  :data:`DAEMON_GONE_SECONDS` stops waiting and fails its query (a daemon that died does not leave
  the server's worker waiting forever; the next daemon starts the query again);
- ``open``: the daemon is draining; waits end, and a batch that had not begun is not applied.

A crash anywhere loses and doubles nothing: a batch held after its ``MERGE`` is not committed by
Spark, and the next run applies it again under the same transaction id (Delta skips it).

:class:`ServerGate` is the batch function's side, :class:`FileTurnGate` the daemon's, with the
interface of the classic :class:`~lakemirror.supervisor.apply_workers.query_gate.TurnGate`. Pure file I/O: no
pyspark, importable in the server's worker.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Callable

#: The folder of a query's checkpoint that holds its gate.
GATE_FOLDER = "lakemirror_turns"
#: How often the batch function looks at the gate while it waits.
SERVER_POLL_SECONDS = 0.05
#: A daemon whose ``alive`` file is older than this is taken for gone by a waiting batch function.
DAEMON_GONE_SECONDS = 300.0


class GateClosed(RuntimeError):
    """The batch function may not go on: another daemon run owns the gate, the daemon is gone, or
    it is draining. Nothing of the batch was applied (or, after its ``MERGE``, Spark has not
    committed it and the next run applies it again, a replay)."""


def gate_folder(checkpoint: str) -> str:
    return str(Path(checkpoint) / GATE_FOLDER)


def _write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None


def _numbers(folder: Path, prefix: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(n[len(prefix):]) for n in names if n.startswith(prefix) and n[len(prefix):].isdigit())


class ServerGate:
    """The batch function's side (runs in the server's Python worker)."""

    def __init__(self, folder: str, generation: str, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.folder = Path(folder)
        self.generation = generation
        self.clock = clock
        self.sleep = sleep

    def _check(self) -> None:
        owner = _read(self.folder / "generation")
        if owner != self.generation:
            raise GateClosed(f"another lakemirror run ({owner}) took over this table's query; this run's query "
                             f"stops (its batch is applied again by the new run if it was not committed)")
        try:
            beat = os.stat(self.folder / "alive").st_mtime
        except FileNotFoundError:
            beat = 0.0
        if self.clock() - beat > DAEMON_GONE_SECONDS:
            raise GateClosed(f"the lakemirror daemon has not been seen for {DAEMON_GONE_SECONDS:.0f} s; the query "
                             f"stops until a daemon starts it again")

    def enter(self, batch_id: int) -> int | None:
        """Wait for a turn and take it: the turn's number, or None when the gate is open (a drain:
        raises instead, the batch is not applied)."""
        _write(self.folder / "waiting", str(batch_id))
        try:
            while True:
                self._check()
                if (self.folder / "open").exists():
                    raise GateClosed("lakemirror is draining: the batch is left for the next run")
                for n in _numbers(self.folder, "grant-"):
                    try:
                        os.rename(self.folder / f"grant-{n}", self.folder / f"taken-{n}")
                    except FileNotFoundError:
                        continue  # withdrawn meanwhile
                    return n
                self.sleep(SERVER_POLL_SECONDS)
        finally:
            (self.folder / "waiting").unlink(missing_ok=True)

    def leave(self, turn: int) -> None:
        """The turn's batch is applied, or failed: the daemon's turn ends."""
        try:
            os.rename(self.folder / f"taken-{turn}", self.folder / f"done-{turn}")
        except FileNotFoundError:  # a newer run cleared the folder: its gate does not wait for this one
            pass

    def hold(self, batch_id: int, turn: int) -> None:
        """After the batch: hold the query until the table's next turn is granted (the batch Spark plans
        next takes it), the gate opens, or the run is superseded (which fails the query: Spark does
        not commit the batch, and the next run applies it again)."""
        _write(self.folder / "held", str(batch_id))
        try:
            while True:
                self._check()
                if (self.folder / "open").exists() or any(n > turn for n in _numbers(self.folder, "grant-")):
                    return
                self.sleep(SERVER_POLL_SECONDS)
        finally:
            (self.folder / "held").unlink(missing_ok=True)


class FileTurnGate:
    """The daemon's side: the interface of :class:`~lakemirror.supervisor.apply_workers.query_gate.TurnGate`."""

    #: How often a turn's worker looks at the gate (a file listing) and the query (a Connect call).
    poll_seconds = 0.1

    def __init__(self, folder: str, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.folder = Path(folder)
        self.clock = clock
        self.sleep = sleep
        self.generation = uuid.uuid4().hex
        self._next = 1
        self._granted: int | None = None

    def take_over(self) -> str:
        """Own the gate for this run (before the query starts): a new generation, the last run's
        files cleared. Returns the generation the batch functions of this run carry."""
        self.folder.mkdir(parents=True, exist_ok=True)
        numbers = [n for prefix in ("grant-", "taken-", "done-", "withdrawn-") for n in _numbers(self.folder, prefix)]
        self._next = max(numbers, default=0) + 1
        _write(self.folder / "generation", self.generation)
        self.heartbeat()
        for name in os.listdir(self.folder):
            if name.split("-")[0] in ("grant", "withdrawn", "done") or name == "open":
                (self.folder / name).unlink(missing_ok=True)
        return self.generation

    def heartbeat(self) -> None:
        (self.folder / "alive").touch()

    # -- what the turn pool sees ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return (not (self.folder / "open").exists() and self._granted is None
                and ((self.folder / "waiting").exists() or (self.folder / "held").exists()))

    @property
    def waiting(self) -> bool:
        return (self.folder / "waiting").exists()

    @property
    def held_batch(self) -> int | None:
        text = _read(self.folder / "held")
        return int(text) if text and text.isdigit() else None

    @property
    def applying(self) -> bool:
        return bool(_numbers(self.folder, "taken-"))

    # -- the turn pool's worker ---------------------------------------------------------------

    def grant(self) -> int:
        turn, self._next = self._next, self._next + 1
        self._granted = turn
        _write(self.folder / f"grant-{turn}", "")
        self._forget_before(turn - 4)
        return turn

    def wait_ended(self, since: int, timeout: float) -> bool:
        deadline = self.clock() + timeout
        while True:
            if any(n >= since for n in _numbers(self.folder, "done-")):
                if self._granted == since:
                    self._granted = None
                return True
            if self.clock() >= deadline:
                return False
            self.sleep(min(0.02, max(0.0, deadline - self.clock())))

    def withdraw(self) -> bool:
        turn = self._granted
        if turn is None:
            return False
        try:
            os.rename(self.folder / f"grant-{turn}", self.folder / f"withdrawn-{turn}")
        except FileNotFoundError:
            return False  # the batch function took it: wait for it
        self._granted = None
        return True

    def open(self) -> None:
        if self.folder.exists():
            _write(self.folder / "open", "")

    def _forget_before(self, turn: int) -> None:
        for prefix in ("done-", "withdrawn-"):
            for n in _numbers(self.folder, prefix):
                if n < turn:
                    (self.folder / f"{prefix}{n}").unlink(missing_ok=True)
