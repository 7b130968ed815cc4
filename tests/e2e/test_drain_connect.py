"""SIGTERM to a daemon whose Spark Connect server has gone away: it exits within
``drain_timeout_seconds`` and a few seconds, with its lease released and no ``daemon.json`` left.

Its Spark Connect client retries every call for ten minutes and more: the query's ``stop()``, the
last batches' outcomes, the session's clean-up at exit. Once a daemon whose server had gone stayed
up 40 minutes after SIGTERM. This test starts a Connect server of its own (it is stopped under the
daemon), a daemon replicating through it, waits for a table to run, stops the server, sends
SIGTERM, and times the exit. Launches a Connect server and a daemon: ``make test-all`` only; the
mechanism (a stop that never returns, a tick stuck on the server) is tested without Spark in
tests/unit/test_drain.py and tests/unit/test_halts.py.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from lakemirror.checkpoints.lease_store import FileLeaseStore
from lakemirror.daemon.drain import EXIT_GRACE_SECONDS
from lakemirror.daemon.exit_codes import EXIT_DRAIN_INCOMPLETE, EXIT_OK
from lakemirror.identifiers import TableName
from lakemirror.sources.catalog import LocalCatalog
from tests.torture.harness import DaemonProcess, Writer

pytestmark = [pytest.mark.e2e, pytest.mark.connect, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "connect-server.sh"
DRAIN = 10.0
#: The exit's allowance past the drain: the exit guard's grace, and a few seconds for a loaded machine.
MARGIN = EXIT_GRACE_SECONDS + 5.0
#: How long a table may take to run over the server (its Python workers start on a busy machine).
START_SECONDS = 900.0


@pytest.fixture
def own_connect_server(tmp_path: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    """A Spark Connect server of this test's own (it is stopped under the daemon): its address and
    how to stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    logs = tmp_path / "connect-server"
    logs.mkdir()
    started = subprocess.run([str(SCRIPT), "start", port, str(logs)], capture_output=True, text=True, check=False)
    if started.returncode != 0:
        raise RuntimeError(f"scripts/connect-server.sh start failed: {started.stderr.strip()[-2000:]}")

    def stop() -> None:
        subprocess.run([str(SCRIPT), "stop", port, str(logs)], capture_output=True, text=True, check=False)

    try:
        yield f"sc://127.0.0.1:{port}", stop
    finally:
        stop()


def test_sigterm_after_the_connect_server_went_away_exits_within_the_drain_timeout(
        spark: Any, own_connect_server: tuple[str, Callable[[], None]], tmp_path: Path) -> None:
    remote, stop_server = own_connect_server
    lakehouse = tmp_path / "lakehouse"
    writer = Writer(spark, LocalCatalog(str(lakehouse)), TableName("src", "drain", "_"), seed=5)
    writer.create()
    for _ in range(3):
        writer.step()
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline_id": "drain", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "drain",
        "checkpoint_volume": str(tmp_path / "ck"), "trigger_interval_seconds": 0.5, "lag_interval_seconds": 1,
        "drain_timeout_seconds": DRAIN,
        "runtime": {"mode": "connect", "spark_remote": remote, "warehouse": str(lakehouse), "shuffle_partitions": 2},
        "http": {"port": 0}}))
    daemon = DaemonProcess(config, tmp_path / "ck" / "drain", tmp_path / "daemon.log")
    daemon.start()
    try:
        writer.start(0.7)
        deadline = time.monotonic() + START_SECONDS
        while True:
            assert daemon.proc is not None and daemon.proc.poll() is None, daemon.tail()
            views = (daemon.status() or {}).get("tables", [])
            if any(v["state"] == "running" for v in views):
                break
            assert time.monotonic() < deadline, f"no table ran in {START_SECONDS:g} s: {views}\n{daemon.tail()}"
            time.sleep(1.0)
        writer.stop()
        stop_server()
        asked = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.wait_exit(DRAIN + MARGIN + 120)
        seconds = time.monotonic() - asked
    finally:
        writer.stop()
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.kill()
    said = [line for line in daemon.tail(20000).splitlines()
            if any(words in line for words in ("draining:", "drained in", "drain incomplete"))]
    print(f"\nSIGTERM with the Connect server gone: exit {code} after {seconds:.1f}s "
          f"(drain_timeout_seconds {DRAIN:g})", *said, sep="\n")
    assert code is not None, f"the daemon was still running {DRAIN + MARGIN + 120:.0f}s after SIGTERM:\n{daemon.tail()}"
    assert seconds <= DRAIN + MARGIN, f"exit {code} after {seconds:.1f}s, past {DRAIN + MARGIN:g}s:\n{daemon.tail()}"
    assert code in (EXIT_OK, EXIT_DRAIN_INCOMPLETE), daemon.tail()
    assert not (daemon.pipeline_dir / "daemon.json").exists()
    newest = FileLeaseStore(daemon.pipeline_dir / "lease").newest()
    assert newest is not None and newest.record is not None and newest.record.released, "the lease was not released"
    log = daemon.tail(20000)
    assert ("drain incomplete" in log) == (code == EXIT_DRAIN_INCOMPLETE) and ("drained in" in log) == (code == EXIT_OK)
