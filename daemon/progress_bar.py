"""The bootstrap's progress bar on the daemon's terminal (``lakemirror run`` attached to a TTY).

While tables bootstrap, the last line of the terminal shows each one's chunks done, rows copied, rate
and ETA (:class:`~lakemirror.sinks.batch.bootstrap_plan.BootstrapProgress`); log lines keep scrolling
above it (:class:`BarAwareHandler` clears the bar, writes the record, draws the bar again). Without
a TTY nothing is drawn: logs get the plain ``bootstrap chunk N committed`` lines, and ``status``,
``/status`` and the metrics carry the same figures.
"""

from __future__ import annotations

import logging
import shutil
import threading
from typing import TextIO

from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.supervisor.control.observer import NoopObserver
from lakemirror.supervisor.control.table_state import TableState, TableStatus

CLEAR_LINE = "\r\x1b[2K"


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def describe(table: str, p: BootstrapProgress, width: int = 20) -> str:
    """One table's bar: ``orders [#####...] 3/20 chunks, 1.2M/20.0M rows, 310.0k rows/s, ETA 40s``."""
    done = p.chunks_done / p.chunks_total if p.chunks_total else 0.0
    if p.rows_total:
        done = min(1.0, p.rows_copied / p.rows_total)
    filled = int(width * done)
    rate, eta = p.rows_per_second, p.eta_seconds
    rows = _count(p.rows_copied) + (f"/{_count(p.rows_total)}" if p.rows_total is not None else "")
    return (f"{table} [{'#' * filled}{'.' * (width - filled)}] {p.chunks_done}/{p.chunks_total} chunks, {rows} rows"
            + (f", {_count(rate)} rows/s" if rate else "") + (f", ETA {eta:.0f}s" if eta is not None else ""))


class BootstrapBar(NoopObserver):
    """The supervisor's observer for bootstrap progress, drawn as the terminal's last line."""

    def __init__(self, stream: TextIO, columns: int | None = None) -> None:
        self.stream = stream
        self.columns = columns
        self.lock = threading.RLock()
        self.running: dict[str, BootstrapProgress] = {}

    def line(self) -> str:
        columns = self.columns or shutil.get_terminal_size((120, 24)).columns
        text = "bootstrap: " + " | ".join(describe(t, p) for t, p in sorted(self.running.items()))
        return text[:max(10, columns - 1)]

    def bootstrap_progressed(self, table: str, progress: BootstrapProgress) -> None:
        with self.lock:
            if progress.chunks_done >= progress.chunks_total:
                self.running.pop(table, None)
            else:
                self.running[table] = progress
            self.stream.write(CLEAR_LINE)
            self.draw()

    def state_changed(self, table: str, status: TableStatus) -> None:
        if status.state != TableState.BOOTSTRAPPING:  # done, failed, paused or stopped: off the bar
            self._off_the_bar(table)

    def _off_the_bar(self, table: str) -> None:
        with self.lock:
            if self.running.pop(table, None) is not None:
                self.stream.write(CLEAR_LINE)
                self.draw()

    def draw(self) -> None:
        """The bar again, on the current (cleared) line; nothing while no table bootstraps."""
        if self.running:
            self.stream.write(self.line())
        self.stream.flush()


class BarAwareHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes log records to the bar's terminal above the bar."""

    def __init__(self, bar: BootstrapBar) -> None:
        super().__init__(bar.stream)
        self.bar = bar

    def emit(self, record: logging.LogRecord) -> None:
        with self.bar.lock:
            if self.bar.running:
                self.stream.write(CLEAR_LINE)
            super().emit(record)
            self.bar.draw()


def attach(stream: TextIO) -> BootstrapBar | None:
    """On a TTY: a bar on ``stream``, the root logger's handlers for ``stream`` replaced by one that
    keeps the bar below the log lines. Otherwise None (logs stay plain lines)."""
    if not stream.isatty():
        return None
    bar = BootstrapBar(stream)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is stream:
            replacement = BarAwareHandler(bar)
            replacement.setFormatter(handler.formatter)
            replacement.setLevel(handler.level)
            root.removeHandler(handler)
            root.addHandler(replacement)
    return bar
