"""Durable per-table pipeline state: bootstrap epochs and pauses.

The epoch is part of every Delta transaction id the table's writes use, so a reset checkpoint
(new epoch, batch ids from 0 again) can never be mistaken for a replay of old batches.
State is a small JSON document per table, written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

from lakemirror.checkpoints import layout


@dataclass(frozen=True)
class TableProgress:
    """What a pipeline remembers about one table between runs."""

    epoch: int = 0                        # 0 = never bootstrapped
    bootstrap_version: int | None = None  # the snapshot version V of the current epoch
    bootstrapped: bool = False            # the snapshot at V is committed in the replica
    source_table_id: str | None = None    # Delta table id of the source when bootstrapped
    paused: bool = False

    def next_epoch(self, version: int, source_table_id: str | None) -> "TableProgress":
        return replace(self, epoch=self.epoch + 1, bootstrap_version=version,
                       bootstrapped=False, source_table_id=source_table_id)


class StateStore(Protocol):
    def load(self, table_slug: str) -> TableProgress: ...
    def save(self, table_slug: str, progress: TableProgress) -> None: ...


class InMemoryStateStore:
    def __init__(self) -> None:
        self.tables: dict[str, TableProgress] = {}

    def load(self, table_slug: str) -> TableProgress:
        return self.tables.get(table_slug, TableProgress())

    def save(self, table_slug: str, progress: TableProgress) -> None:
        self.tables[table_slug] = progress


class FileStateStore:
    """JSON files under ``<root>/state/``; each save is an atomic replace."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.dir = layout.state_dir(root)
        self._lock = threading.Lock()

    def _path(self, table_slug: str) -> Path:
        return self.dir / f"{table_slug}.json"

    def load(self, table_slug: str) -> TableProgress:
        path = self._path(table_slug)
        if not path.exists():
            return TableProgress()
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {k: v for k, v in data.items() if k in TableProgress.__dataclass_fields__}
        return TableProgress(**known)

    def save(self, table_slug: str, progress: TableProgress) -> None:
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(asdict(progress), fh, indent=2, sort_keys=True)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self._path(table_slug))
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
