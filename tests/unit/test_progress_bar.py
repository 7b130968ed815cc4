"""The bootstrap's progress bar on the daemon's terminal: what it draws, that log lines scroll above
it, that a finished bootstrap leaves no bar, and that nothing is drawn without a TTY."""

from __future__ import annotations

import io
import logging

from lakemirror.daemon.progress_bar import CLEAR_LINE, BarAwareHandler, BootstrapBar, attach, describe
from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.supervisor.control.observer import NoopObserver, Observers
from lakemirror.supervisor.control.table_state import TableStatus


def progress(done: int, total: int = 20, rows_total: int | None = 20_000_000, now: float = 10.0) -> BootstrapProgress:
    rows = done * 1_000_000
    return BootstrapProgress(version=7, chunks_total=total, chunks_done=done, rows_total=rows_total,
                             rows_copied=rows, started_at=0.0, now=now, rows_copied_this_run=rows, chunks_copied=done)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_table_line_shows_chunks_rows_rate_and_eta() -> None:
    assert describe("orders", progress(5)) == (
        "orders [#####...............] 5/20 chunks, 5.0M/20.0M rows, 500.0k rows/s, ETA 30s")
    unknown_rows = describe("t", progress(0, rows_total=None))
    assert unknown_rows.startswith("t [....................] 0/20 chunks, 0 rows") and "ETA" not in unknown_rows


def test_the_bar_is_the_last_line_log_records_scroll_above_it_and_a_finished_bootstrap_clears_it() -> None:
    term = Terminal()
    bar = BootstrapBar(term, columns=200)
    handler = BarAwareHandler(bar)
    handler.setFormatter(logging.Formatter("%(message)s"))
    bar.bootstrap_progressed("orders", progress(5))
    bar.bootstrap_progressed("users", progress(1, total=2, rows_total=None))
    handler.emit(logging.LogRecord("x", logging.INFO, __file__, 1, "a log line", None, None))
    screen = term.getvalue()
    last = screen.rsplit("\n", 1)
    assert last[0].endswith(CLEAR_LINE + "a log line"), "the record replaces the bar's line"
    assert last[1].startswith("bootstrap: orders [#####") and " | users [" in last[1], "the bar is drawn below it"
    bar.bootstrap_progressed("orders", progress(20))
    bar.bootstrap_progressed("users", progress(2, total=2, rows_total=None))
    assert term.getvalue().endswith(CLEAR_LINE), "no table bootstraps: the line is left empty"
    handler.emit(logging.LogRecord("x", logging.INFO, __file__, 1, "after", None, None))
    assert term.getvalue().endswith(CLEAR_LINE + "after\n")


def test_a_table_that_leaves_its_bootstrap_unfinished_leaves_the_bar() -> None:
    from lakemirror.supervisor.control.table_state import TableState

    term = Terminal()
    bar = BootstrapBar(term, columns=200)
    bar.bootstrap_progressed("orders", progress(5))
    bar.state_changed("orders", TableStatus(state=TableState.BOOTSTRAPPING))
    assert "orders" in bar.running
    bar.state_changed("orders", TableStatus(state=TableState.DEGRADED))
    assert not bar.running and term.getvalue().endswith(CLEAR_LINE)


def test_the_bar_fits_the_terminal() -> None:
    bar = BootstrapBar(Terminal(), columns=40)
    bar.bootstrap_progressed("a_table_with_a_long_name", progress(3))
    assert len(bar.line()) == 39


def test_without_a_tty_nothing_is_drawn_and_the_log_handlers_stay() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    assert attach(io.StringIO()) is None
    assert root.handlers == before


def test_on_a_tty_the_handler_of_that_stream_is_replaced_with_its_format() -> None:
    root = logging.getLogger()
    term = Terminal()
    plain = logging.StreamHandler(term)
    plain.setFormatter(logging.Formatter("LOG %(message)s"))
    root.addHandler(plain)
    try:
        bar = attach(term)
        assert bar is not None and plain not in root.handlers
        mine = [h for h in root.handlers if isinstance(h, BarAwareHandler)]
        assert len(mine) == 1 and mine[0].formatter is plain.formatter
    finally:
        for h in [h for h in root.handlers if isinstance(h, BarAwareHandler) or h is plain]:
            root.removeHandler(h)


def test_observers_pass_every_event_to_each() -> None:
    seen: list[tuple[str, str]] = []

    class Recording(NoopObserver):
        def __init__(self, name: str) -> None:
            self.name = name

        def bootstrap_progressed(self, table: str, p: BootstrapProgress) -> None:
            seen.append((self.name, table))

        def retry_scheduled(self, table: str, status: TableStatus) -> None:
            seen.append((self.name, "-" + table))

    both = Observers(Recording("a"), Recording("b"))
    both.bootstrap_progressed("t", progress(1))
    both.retry_scheduled("t", TableStatus())
    assert seen == [("a", "t"), ("b", "t"), ("a", "-t"), ("b", "-t")]
