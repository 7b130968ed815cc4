"""The demos' shared run (:mod:`lakemirror.tools.live_run`) over a real composition root with no
tables: the daemon serves, the writer runs until the run is stopped, then the writer is stopped
before the catch-up, the screen is drawn once more for the log, and the supervisor and the server
are closed even when the catch-up fails."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.settings import load_settings
from lakemirror.tools.live_run import run_live


class Writer:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.commits = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.commits += 1
        self.stop.wait(30)


class NoSpark:
    """The session: a run with no tables never touches it."""


def app(tmp_path: Path) -> DaemonContext:
    (tmp_path / "lake").mkdir()
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"source_catalog: demo\ndestination_catalog: demo_mirror\nschema_name: shop\n"
                    f"checkpoint_volume: {tmp_path / 'ck'}\nhttp: {{port: 0, host: 127.0.0.1}}\n"
                    f"runtime: {{mode: local, warehouse: {tmp_path / 'lake'}}}\n")
    return DaemonContext(load_settings(path)).replace(spark=NoSpark(), checkpoints=InMemoryCheckpointStore())


def test_the_run_stops_the_writer_before_the_catch_up_and_closes_the_daemon(tmp_path: Path) -> None:
    ctx, stop = app(tmp_path), threading.Event()
    writer, drawn = Writer(), []

    def draw(views: Any, tty: bool) -> None:
        drawn.append(tty)
        stop.set()  # the operator's Ctrl-C, once the screen is drawn

    def catch_up(sup: Any) -> str:
        assert writer.stop.is_set() and not writer.thread.is_alive()
        assert sup is ctx.supervisor and ctx.server.url.startswith("http://127.0.0.1:")
        return "caught up"

    assert run_live(ctx, writer, draw, None, catch_up, stop=stop, tty=True) \
        == "caught up"
    assert writer.commits == 1 and drawn == [True, False]
    with pytest.raises(OSError):  # the server's socket is closed
        ctx.server.server.socket.getsockname()


def test_a_failed_catch_up_still_closes_the_daemon(tmp_path: Path) -> None:
    ctx, stop = app(tmp_path), threading.Event()
    writer = Writer()

    def catch_up(sup: Any) -> None:
        raise RuntimeError("the catch-up failed")

    with pytest.raises(RuntimeError, match="the catch-up failed"):
        run_live(ctx, writer, lambda views, tty: None, 0.0, catch_up, stop=stop, tty=False)
    with pytest.raises(OSError):
        ctx.server.server.socket.getsockname()
