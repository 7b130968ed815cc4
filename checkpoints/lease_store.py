"""Where a pipeline's lease lives: one record per generation (:mod:`lakemirror.checkpoints.lease`).

A store needs one atomic operation, *create if absent*: of two daemons creating the same
generation, exactly one succeeds. Everything else is a plain read or write of a generation that
only its holder writes.

- :class:`FileLeaseStore`: files ``lease-<generation>.json`` in a folder of the checkpoint volume
  (local or mounted). A generation is written whole to a temporary file, then hard-linked to its
  name: ``link`` fails when the name exists, on local file systems and NFS alike, and a reader never
  sees a half-written record. Where the file system has no hard links, ``O_CREAT | O_EXCL`` stands
  in (a reader may then briefly find the record empty: it counts as held).
- :class:`InMemoryLeaseStore`: the twin, for tests of the policy and the keeper.
- :class:`~lakemirror.checkpoints.lease_s3.S3LeaseStore`: objects on S3, created with a conditional
  ``PUT`` (``If-None-Match: *``).
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Protocol

from lakemirror.checkpoints.lease import LeaseRecord, Stored

_NAME = re.compile(r"^lease-(\d{12})\.json$")


def lease_name(generation: int) -> str:
    """The name of a generation's record: zero-padded, so names sort as generations do."""
    return f"lease-{generation:012d}.json"


def generation_of(name: str) -> int | None:
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


class LeaseStore(Protocol):
    """The generations of one pipeline's lease."""

    @property
    def where(self) -> str:
        """Where the lease lives (for messages)."""
        ...

    def newest(self) -> Stored | None:
        """The newest generation (None: there is none)."""
        ...

    def create(self, record: LeaseRecord) -> bool:
        """Store ``record`` as its generation if that generation does not exist; False if it does."""
        ...

    def write(self, record: LeaseRecord) -> None:
        """Overwrite ``record``'s generation (only its holder does)."""
        ...

    def prune(self, below: int) -> None:
        """Remove the generations older than ``below``."""
        ...


class InMemoryLeaseStore:
    """The in-memory twin: generations in a dict, create-if-absent under a lock."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.records: dict[int, tuple[bytes, float]] = {}
        self._lock = threading.Lock()
        self._clock = clock or time.time

    @property
    def where(self) -> str:
        return "in memory"

    def newest(self) -> Stored | None:
        with self._lock:
            if not self.records:
                return None
            generation = max(self.records)
            body, modified = self.records[generation]
        return Stored(generation, LeaseRecord.decode(generation, body), modified)

    def create(self, record: LeaseRecord) -> bool:
        with self._lock:
            if record.generation in self.records:
                return False
            self.records[record.generation] = (record.encode(), self._clock())
            return True

    def write(self, record: LeaseRecord) -> None:
        with self._lock:
            self.records[record.generation] = (record.encode(), self._clock())

    def prune(self, below: int) -> None:
        with self._lock:
            for generation in [g for g in self.records if g < below]:
                del self.records[generation]


#: errno values of a file system that has no hard links.
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK}


class FileLeaseStore:
    """Generations as files in ``folder`` (created on first use)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    @property
    def where(self) -> str:
        return str(self.folder)

    def _generations(self) -> list[int]:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(g for n in names if (g := generation_of(n)) is not None)

    def newest(self) -> Stored | None:
        for _ in range(5):  # a generation pruned between the listing and the read: list again
            generations = self._generations()
            if not generations:
                return None
            path = self.folder / lease_name(generations[-1])
            try:
                body = path.read_bytes()
                modified = path.stat().st_mtime
            except FileNotFoundError:
                continue
            return Stored(generations[-1], LeaseRecord.decode(generations[-1], body), modified)
        return None

    def create(self, record: LeaseRecord) -> bool:
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / lease_name(record.generation)
        tmp = self.folder / f".{lease_name(record.generation)}.{uuid.uuid4().hex}.tmp"
        _write_synced(tmp, record.encode())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            return self._create_exclusive(target, record.encode())
        finally:
            tmp.unlink(missing_ok=True)
        _sync_folder(self.folder)
        return True

    def _create_exclusive(self, target: Path, body: bytes) -> bool:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        _sync_folder(self.folder)
        return True

    def write(self, record: LeaseRecord) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{lease_name(record.generation)}.{uuid.uuid4().hex}.tmp"
        try:
            _write_synced(tmp, record.encode())
            os.replace(tmp, self.folder / lease_name(record.generation))
        finally:
            tmp.unlink(missing_ok=True)

    def prune(self, below: int) -> None:
        for generation in self._generations():
            if generation < below:
                (self.folder / lease_name(generation)).unlink(missing_ok=True)


def _write_synced(path: Path, body: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())


def _sync_folder(folder: Path) -> None:
    """Make a new name in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
