"""A run's detailed execution log, written as files beside the audit table's rows.

With ``execution_log`` set in a ``lakemirror replicate`` file, every log record of the run (lakemirror's
and Spark's Python side, every SQL statement at DEBUG included: :mod:`lakemirror.sql_exec`) is
written, from the start of the run to its end, to ``<folder>/replicate-<start>-<run id>.jsonl`` (one
JSON object a line: ``time``, ``level``, ``logger``, ``thread``, ``run_id``, ``message`` and, for an
error, ``exception`` with the full stack trace) and/or ``….log`` (the same as text lines). The run id
is on every line of both. The console keeps its own level: the files may hold DEBUG lines the console
does not show.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Sequence

from lakemirror.secrets import redact

TEXT_FORMAT = "%(asctime)s %(levelname)s run=%(run_id)s [%(threadName)s] %(name)s: %(message)s"


class RunId(logging.Filter):
    """Stamps ``run_id`` on every record a handler writes."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.run_id = self.run_id
        return True


class JsonLines(logging.Formatter):
    """One JSON object per record; credentials redacted from the message and the trace."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "thread": record.threadName,
               "run_id": getattr(record, "run_id", None), "message": redact(record.getMessage())}
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


class RedactedText(logging.Formatter):
    """Text lines; a record of several lines (a trace, a long statement) carries the run id on each."""

    def format(self, record: logging.LogRecord) -> str:
        first, *rest = redact(super().format(record)).split("\n")
        tag = f"run={getattr(record, 'run_id', '-')}"
        return "\n".join([first, *(f"    {tag} | {line}" for line in rest)])


def paths(folder: str | Path, run_id: str, formats: Sequence[str], started: float) -> dict[str, Path]:
    stamp = datetime.fromtimestamp(started, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = Path(folder) / f"replicate-{stamp}-{run_id}"
    return {f: base.with_suffix(".jsonl" if f == "json" else ".log") for f in formats}


@contextmanager
def execution_log(run_id: str, folder: str | Path, formats: Sequence[str], level: str = "DEBUG",
                  logger: logging.Logger | None = None, started: float | None = None) -> Iterator[dict[str, Path]]:
    """Write the records of the block to the run's files (see the module docstring)."""
    root = logger or logging.getLogger()
    files = paths(folder, run_id, formats, time.time() if started is None else started)
    Path(folder).mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = []
    for fmt, path in files.items():
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setLevel(level)
        handler.addFilter(RunId(run_id))
        handler.setFormatter(JsonLines() if fmt == "json" else RedactedText(TEXT_FORMAT))
        handlers.append(handler)
    previous = root.level
    wanted = logging.getLevelName(level)
    quieted: list[logging.Handler] = []
    if isinstance(wanted, int) and (previous == logging.NOTSET or wanted < previous):
        # The console keeps showing what it showed: its handlers take the old level.
        for h in root.handlers:
            if h.level == logging.NOTSET:
                h.setLevel(previous or logging.WARNING)
                quieted.append(h)
        root.setLevel(wanted)
    for h in handlers:
        root.addHandler(h)
    try:
        yield files
    finally:
        for h in handlers:
            root.removeHandler(h)
            h.close()
        root.setLevel(previous)
        for h in quieted:
            h.setLevel(logging.NOTSET)
