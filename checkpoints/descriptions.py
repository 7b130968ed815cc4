"""Where each table's kept source description lives between runs (:mod:`lakemirror.sources.described`).

One small JSON document per table, in the table's folder of the pipeline's checkpoints
(``<checkpoint_volume>/<pipeline>/<table slug>/description.json``), written atomically (temp file and
rename). It is a cache: a missing, damaged or unwritable file costs a launch one description by
Spark, never a wrong one, so a failure to write it is logged and ignored.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

FILE_NAME = "description.json"


class DescriptionStore(Protocol):
    def load(self, table_slug: str) -> Any:
        """The document kept for the table (None when there is none or it cannot be read)."""
        ...

    def save(self, table_slug: str, document: dict[str, Any]) -> None:
        """Keep ``document`` for the table (best effort)."""
        ...


class InMemoryDescriptionStore:
    def __init__(self) -> None:
        self.documents: dict[str, dict[str, Any]] = {}

    def load(self, table_slug: str) -> Any:
        return self.documents.get(table_slug)

    def save(self, table_slug: str, document: dict[str, Any]) -> None:
        self.documents[table_slug] = json.loads(json.dumps(document))  # what a file would give back


class FileDescriptionStore:
    """``<root>/<table slug>/description.json``; ``root`` is the pipeline's checkpoint folder."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, table_slug: str) -> Path:
        return self.root / table_slug / FILE_NAME

    def load(self, table_slug: str) -> Any:
        try:
            return json.loads(self.path(table_slug).read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return None

    def save(self, table_slug: str, document: dict[str, Any]) -> None:
        target = self.path(table_slug)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(document, fh, sort_keys=True)
                os.replace(tmp, target)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.info("table %s: the source's description could not be kept in %s: %s", table_slug, target, exc)
