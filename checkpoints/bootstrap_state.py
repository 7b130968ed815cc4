"""The durable plan of a table's chunked bootstrap: the chunk list and the catch-up rounds.

Which chunks are *committed* is not kept here: the replica's own Delta transaction records say so
(:func:`lakemirror.sinks.snapshot_copy.committed_chunks`), so progress and data cannot disagree.
What is kept is what a restart must reuse exactly: the chunks (a restart never re-plans), and each
catch-up round's version range, saved before the round writes anything, so a round redone after a
crash reads the same range under the same transaction version (and Delta skips what it committed).
A small JSON document per table and epoch, written atomically; with an in-memory twin.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from lakemirror.sources.chunks import Chunk


@dataclass(frozen=True)
class CatchUpRound:
    number: int        # the round's Delta transaction version
    after: int         # applies source versions after this one ...
    through: int       # ... up to and including this one
    done: bool = False


@dataclass(frozen=True)
class BootstrapPlan:
    epoch: int
    version: int                             # the pinned snapshot version V
    chunks: tuple[Chunk, ...]
    rounds: tuple[CatchUpRound, ...] = field(default_factory=tuple)

    @property
    def applied_through(self) -> int:
        """The last source version the replica holds: V, or the last finished round's end."""
        done = [r.through for r in self.rounds if r.done]
        return max(done) if done else self.version

    def with_round(self, r: CatchUpRound) -> "BootstrapPlan":
        return replace(self, rounds=tuple(x for x in self.rounds if x.number != r.number) + (r,))

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "version": self.version, "chunks": [c.to_json() for c in self.chunks],
                "rounds": [r.__dict__ for r in self.rounds]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "BootstrapPlan":
        return cls(int(data["epoch"]), int(data["version"]), tuple(Chunk.from_json(c) for c in data["chunks"]),
                   tuple(CatchUpRound(**r) for r in data.get("rounds", ())))


class BootstrapStore(Protocol):
    def load(self, table_slug: str, epoch: int) -> BootstrapPlan | None: ...
    def save(self, table_slug: str, plan: BootstrapPlan) -> None: ...
    def forget(self, table_slug: str) -> None: ...


class InMemoryBootstrapStore:
    def __init__(self) -> None:
        self.plans: dict[str, BootstrapPlan] = {}

    def load(self, table_slug: str, epoch: int) -> BootstrapPlan | None:
        plan = self.plans.get(table_slug)
        return plan if plan is not None and plan.epoch == epoch else None

    def save(self, table_slug: str, plan: BootstrapPlan) -> None:
        self.plans[table_slug] = plan

    def forget(self, table_slug: str) -> None:
        self.plans.pop(table_slug, None)


class FileBootstrapStore:
    """``<dir>/<table>.json``; each save an atomic replace."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self._lock = threading.Lock()

    def _path(self, table_slug: str) -> Path:
        return self.dir / f"{table_slug}.json"

    def load(self, table_slug: str, epoch: int) -> BootstrapPlan | None:
        path = self._path(table_slug)
        if not path.exists():
            return None
        plan = BootstrapPlan.from_json(json.loads(path.read_text(encoding="utf-8")))
        return plan if plan.epoch == epoch else None

    def save(self, table_slug: str, plan: BootstrapPlan) -> None:
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(plan.to_json(), fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self._path(table_slug))
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise

    def forget(self, table_slug: str) -> None:
        self._path(table_slug).unlink(missing_ok=True)


def bootstrap_store_for(states: object) -> BootstrapStore:
    """The bootstrap store beside a state store: files beside a file store's state files, else in memory."""
    directory = getattr(states, "dir", None)
    if isinstance(directory, Path):
        return FileBootstrapStore(directory.parent / "bootstrap")
    return InMemoryBootstrapStore()
