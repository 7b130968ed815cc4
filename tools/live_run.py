"""What both demos do with the daemon once their sources exist: serve, watch, stop, catch up, drain.

:func:`start_spark` checks what the daemon needs before Spark starts and starts it;
:func:`run_live` starts the daemon's supervisor and HTTP server and the demo's writer, redraws the
screen every :data:`DRAW_SECONDS` until Ctrl-C (or the demo's duration), then stops the writer, lets
the demo's own catch-up run, draws once more, and always drains the supervisor and closes the server.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.supervisor.control.loop import Supervisor, TableView

R = TypeVar("R")
#: How often the screen is redrawn while the writer writes.
DRAW_SECONDS = 2.0
#: How long the writer's thread is given to end its transaction once told to stop.
WRITER_JOIN_SECONDS = 60.0


class Writer(Protocol):
    """A demo's writer: a thread that changes the sources until :attr:`stop` is set."""

    thread: threading.Thread
    stop: threading.Event
    commits: int


def start_spark(app: "DaemonContext", port_setting: str) -> "SparkSession":
    """Java, Delta's jars and the HTTP port checked (one line each, before Spark starts), then Spark."""
    app.preflight()
    app.bind(port_setting)
    print("starting Spark (local[2]) with Delta…", flush=True)
    return app.spark


def show(text: str, tty: bool) -> None:
    """``text`` on the screen: in place of the last on a terminal, appended otherwise."""
    if tty:
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n\n(Ctrl-C to stop)\n")
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run_live(app: "DaemonContext", writer: Writer, draw: Callable[["list[TableView]", bool], None],
             duration: float | None, catch_up: Callable[["Supervisor"], R],
             stop: threading.Event | None = None, tty: bool | None = None) -> R:
    """The daemon and ``writer`` running until Ctrl-C (or ``duration`` seconds), ``draw(views, tty)``
    every :data:`DRAW_SECONDS`; then the writer stopped and ``catch_up(supervisor)`` run (its result is
    returned) and a last ``draw`` for the log. The supervisor is drained within the settings'
    ``drain_timeout_seconds`` and the server closed whatever happens. ``stop``: set to end the run
    (by default Ctrl-C and SIGTERM set it); ``tty``: whether the screen is redrawn in place."""
    if stop is None:
        from lakemirror.daemon.signals import ShutdownSignals

        signals = ShutdownSignals()
        signals.install()
        stop = signals.stop
    tty = sys.stdout.isatty() if tty is None else tty
    sup = app.supervisor
    app.server.start()
    app.write_endpoint_file()
    sup.start()
    writer.thread.start()
    started, next_draw = time.time(), 0.0
    try:
        while not stop.is_set() and (duration is None or time.time() - started < duration):
            sup.tick()
            if time.time() >= next_draw:
                next_draw = time.time() + DRAW_SECONDS
                draw(sup.views(), tty)
            stop.wait(0.5)
        print("\nstopping the writer; letting the replicas catch up…", flush=True)
        writer.stop.set()
        writer.thread.join(WRITER_JOIN_SECONDS)
        result = catch_up(sup)
        draw(sup.views(), False)
        return result
    finally:
        sup.shutdown(app.settings.drain_timeout_seconds)
        app.server.close()
