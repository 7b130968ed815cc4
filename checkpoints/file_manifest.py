"""The durable manifest of a volume copy: which files were copied and verified, as what.

One manifest per copied directory pair. An entry says that the source file ``path`` of ``size``
bytes, modified at ``mtime_ns``, was copied to the target and that both sides then had the
SHA-256 ``checksum``; ``target_mtime_ns`` is the target file's modification time after the copy,
so a target file changed by someone else since is noticed. The copy planner
(:mod:`lakemirror.sinks.batch.volume_plan`) compares listings with these entries.

:class:`FileManifest` keeps it in a folder (under the ``checkpoint_volume``): a snapshot
(``snapshot.json``) and the segments recorded since (``segment-<seq>.jsonl``), each written whole
to a temporary file, flushed to disk and renamed, so a killed process leaves every recorded
segment complete and none half-written. :meth:`Manifest.record` returns once its segment is
durable; :meth:`Manifest.compact` folds the segments into a new snapshot. Only rename and
whole-file writes are used, which Unity Catalog volumes' file system supports (it has no appends).

:class:`InMemoryManifest` is the twin.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

FORMAT = 1
_SEGMENT = re.compile(r"^segment-(\d{12})\.jsonl$")


@dataclass(frozen=True)
class ManifestEntry:
    """A verified copy of one file (see the module docstring)."""

    path: str
    size: int
    mtime_ns: int
    checksum: str
    target_mtime_ns: int
    copied_at: float


class Manifest(Protocol):
    @property
    def where(self) -> str:
        """Where the manifest is kept, for messages."""
        ...

    def load(self) -> dict[str, ManifestEntry]:
        """Every entry recorded and not forgotten, by path."""
        ...

    def record(self, entries: Sequence[ManifestEntry], forgotten: Sequence[str] = ()) -> None:
        """Add ``entries`` (replacing those of the same paths) and drop ``forgotten``; durable on return."""
        ...

    def compact(self) -> None:
        """Fold what was recorded into one snapshot (same content)."""
        ...


def _apply(state: dict[str, ManifestEntry], entries: Sequence[ManifestEntry], forgotten: Sequence[str]) -> None:
    for e in entries:
        state[e.path] = e
    for path in forgotten:
        state.pop(path, None)


class InMemoryManifest:
    """The twin; ``records`` counts the durable records made."""

    def __init__(self) -> None:
        self.entries: dict[str, ManifestEntry] = {}
        self.records = 0
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return "memory"

    def load(self) -> dict[str, ManifestEntry]:
        with self._lock:
            return dict(self.entries)

    def record(self, entries: Sequence[ManifestEntry], forgotten: Sequence[str] = ()) -> None:
        with self._lock:
            _apply(self.entries, entries, forgotten)
            self.records += 1

    def compact(self) -> None:
        pass


def _entry(data: Mapping[str, Any]) -> ManifestEntry:
    return ManifestEntry(path=str(data["path"]), size=int(data["size"]), mtime_ns=int(data["mtime_ns"]),
                         checksum=str(data["checksum"]), target_mtime_ns=int(data["target_mtime_ns"]),
                         copied_at=float(data["copied_at"]))


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class CorruptManifest(Exception):
    """A manifest file cannot be read; the message names it."""


class FileManifest:
    """The manifest in the folder ``folder`` (see the module docstring). One writer at a time."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._lock = threading.Lock()
        self._next_seq: int | None = None

    @property
    def where(self) -> str:
        return str(self.folder)

    def _segments(self) -> list[tuple[int, Path]]:
        if not self.folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := _SEGMENT.match(p.name))]
        return sorted(found)

    def _snapshot(self) -> tuple[int, dict[str, ManifestEntry]]:
        path = self.folder / "snapshot.json"
        if not path.exists():
            return -1, {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return int(data["through"]), {e["path"]: _entry(e) for e in data["entries"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptManifest(f"{path}: not a manifest snapshot ({exc}); move it away to copy every "
                                  f"file again") from exc

    def _read(self) -> tuple[int, dict[str, ManifestEntry]]:
        through, state = self._snapshot()
        last = through
        for seq, path in self._segments():
            last = max(last, seq)
            if seq <= through:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                    if data.get("forget"):
                        state.pop(str(data["path"]), None)
                    else:
                        entry = _entry(data)
                        state[entry.path] = entry
                except (ValueError, KeyError, TypeError) as exc:
                    raise CorruptManifest(f"{path}, line {n}: not a manifest entry ({exc})") from exc
        return last, state

    def load(self) -> dict[str, ManifestEntry]:
        with self._lock:
            last, state = self._read()
            self._next_seq = last + 1
            return state

    def record(self, entries: Sequence[ManifestEntry], forgotten: Sequence[str] = ()) -> None:
        if not entries and not forgotten:
            return
        lines = [json.dumps(asdict(e), sort_keys=True) for e in entries]
        lines += [json.dumps({"path": p, "forget": True}) for p in forgotten]
        with self._lock:
            if self._next_seq is None:
                self._next_seq = self._read()[0] + 1
            self.folder.mkdir(parents=True, exist_ok=True)
            _write_atomic(self.folder / f"segment-{self._next_seq:012d}.jsonl", "\n".join(lines) + "\n")
            self._next_seq += 1

    def compact(self) -> None:
        with self._lock:
            last, state = self._read()
            if last < 0:
                return
            self.folder.mkdir(parents=True, exist_ok=True)
            body = {"format": FORMAT, "through": last,
                    "entries": [asdict(state[p]) for p in sorted(state)]}
            _write_atomic(self.folder / "snapshot.json", json.dumps(body, sort_keys=True))
            for seq, path in self._segments():
                if seq <= last:
                    path.unlink(missing_ok=True)
            self._next_seq = last + 1
