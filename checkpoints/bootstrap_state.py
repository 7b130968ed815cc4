"""The durable plan of a table's chunked bootstrap: the chunks, what each was read at, and the
change-feed capture rounds.

Which chunks are *committed* is not kept here: the replica's own Delta transaction records say so
(:func:`lakemirror.sinks.batch.snapshot_copy.recorded_transactions`), so progress and data cannot
disagree. What is kept is what a restart must reuse exactly: the chunks (a restart never re-plans),
the source version each chunk was read at (saved before its commit: the changes it still needs
start after it) and the rows its commit wrote, each capture round's version range (saved before
the round reads anything, so a round redone after a crash reads the same range under the same
transaction version, and Delta skips what it committed), and the bootstrap's final version. A small
JSON document per table and epoch (the plan's own form:
:class:`lakemirror.sinks.batch.bootstrap_plan.BootstrapPlan`), written atomically; with an in-memory twin.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from lakemirror.checkpoints import layout


#: A plan as its JSON document; its ``epoch`` field says which epoch it belongs to.
PlanDocument = dict[str, Any]


class BootstrapStore(Protocol):
    def load(self, table_slug: str, epoch: int) -> PlanDocument | None: ...
    def save(self, table_slug: str, plan: PlanDocument) -> None: ...
    def forget(self, table_slug: str) -> None: ...


class InMemoryBootstrapStore:
    def __init__(self) -> None:
        self.plans: dict[str, str] = {}

    def load(self, table_slug: str, epoch: int) -> PlanDocument | None:
        text = self.plans.get(table_slug)
        plan: PlanDocument | None = None if text is None else json.loads(text)
        return plan if plan is not None and int(plan["epoch"]) == epoch else None

    def save(self, table_slug: str, plan: PlanDocument) -> None:
        self.plans[table_slug] = json.dumps(plan)

    def forget(self, table_slug: str) -> None:
        self.plans.pop(table_slug, None)


class FileBootstrapStore:
    """``<dir>/<table>.json``; each save an atomic replace."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self._lock = threading.Lock()

    def _path(self, table_slug: str) -> Path:
        return self.dir / f"{table_slug}.json"

    def load(self, table_slug: str, epoch: int) -> PlanDocument | None:
        path = self._path(table_slug)
        if not path.exists():
            return None
        plan: PlanDocument = json.loads(path.read_text(encoding="utf-8"))
        return plan if int(plan["epoch"]) == epoch else None

    def save(self, table_slug: str, plan: PlanDocument) -> None:
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(plan, fh)
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
        return FileBootstrapStore(layout.bootstrap_dir(directory))
    return InMemoryBootstrapStore()
