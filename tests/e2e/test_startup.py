"""The daemon as a real process, starting and failing to start: one line and nothing left behind
when it cannot start, and nothing written outside the configured paths when it can."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from lakemirror.identifiers import TableName
from lakemirror.sources.catalog import LocalCatalog

pytestmark = pytest.mark.e2e

LAKEMIRROR = [sys.executable, "-m", "lakemirror.daemon.cli"]


def config(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "pipeline_id": "boot", "source_catalog": "shop", "destination_catalog": "mirror", "schema_name": "main",
        "checkpoint_volume": str(tmp_path / "ck"), "trigger_interval_seconds": 0.5, "lag_interval_seconds": 0.5,
        "runtime": {"warehouse": str(tmp_path / "lakehouse"), "shuffle_partitions": 2}, "http": {"port": 0}}
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_to_exit(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(exist_ok=True)
    return subprocess.run([*LAKEMIRROR, "run", str(path)], capture_output=True, text=True, timeout=180, cwd=cwd)


def assert_one_line_and_nothing_left(done: subprocess.CompletedProcess[str], tmp_path: Path, cwd: Path,
                                     expected: str) -> None:
    err = done.stderr.strip()
    assert done.returncode == 1, err
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("lakemirror: cannot start: ") and expected in last, err
    assert not (tmp_path / "ck").exists(), "no daemon.json, no pipeline folder"
    assert list(cwd.iterdir()) == [], "nothing in the working directory"


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


def test_a_port_in_use_is_one_line_and_leaves_nothing(tmp_path: Path, busy_port: int) -> None:
    done = run_to_exit(config(tmp_path, http={"port": busy_port}), tmp_path / "cwd")
    assert_one_line_and_nothing_left(done, tmp_path, tmp_path / "cwd",
                                     f"port {busy_port} on 127.0.0.1 is in use: set http.port")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_connect_mode_checks_its_needs_before_binding_the_port(tmp_path: Path, busy_port: int) -> None:
    with socket.socket() as s:  # a port nothing listens on: the Connect server is down
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    # the HTTP port is busy too: the mode's prerequisites are reported first, before any bind
    done = run_to_exit(config(tmp_path, runtime={"mode": "connect", "spark_remote": f"sc://127.0.0.1:{down}"},
                              http={"port": busy_port}), tmp_path / "cwd")
    assert_one_line_and_nothing_left(done, tmp_path, tmp_path / "cwd", "Spark Connect")
    assert "PACKAGE_NOT_INSTALLED" not in done.stderr and "is in use" not in done.stderr


def test_spark_that_does_not_start_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    # a heap no machine has: a valid size, but the JVM cannot reserve it and exits before Spark starts
    path = config(tmp_path, runtime={"driver_memory": "9999t"})
    done = run_to_exit(path, tmp_path / "cwd")
    assert_one_line_and_nothing_left(done, tmp_path, tmp_path / "cwd", "Spark did not start in local mode")


#: In the slow tier: every daemon of the crash-torture smokes in the default tier runs in an empty
#: working directory of its own and its proof fails when anything was written there
#: (tests/torture/harness.py, DaemonProcess).
@pytest.mark.slow
def test_an_accepted_run_writes_nothing_in_the_working_directory(spark: Any, tmp_path: Path) -> None:
    src = LocalCatalog(tmp_path / "lakehouse").locate(TableName("shop", "main", "orders"))
    spark.sql(f"CREATE TABLE {src.sql} (id BIGINT NOT NULL, v BIGINT) USING DELTA "
              f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', 'lakemirror.primaryKey' = 'id')")
    spark.sql(f"INSERT INTO {src.sql} SELECT id, 0 FROM range(0, 10)")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    log = tmp_path / "daemon.log"
    proc = subprocess.Popen([*LAKEMIRROR, "run", str(config(tmp_path))], cwd=cwd, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    endpoint = tmp_path / "ck" / "boot" / "daemon.json"
    try:
        deadline = time.time() + 180
        running = False
        while time.time() < deadline and not running:
            assert proc.poll() is None, log.read_text()[-3000:]
            if endpoint.exists():
                try:
                    with urllib.request.urlopen(f"{json.loads(endpoint.read_text())['url']}/status", timeout=5) as r:
                        running = any(t["state"] == "running" for t in json.load(r)["tables"])
                except (OSError, ValueError, KeyError):
                    pass
            time.sleep(0.5)
        assert running, log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    assert list(cwd.iterdir()) == [], f"written outside the configured paths: {sorted(os.listdir(cwd))}"
    assert not endpoint.exists()


def test_the_demo_on_a_port_in_use_is_one_line(tmp_path: Path, busy_port: int) -> None:
    done = subprocess.run([*LAKEMIRROR, "demo", "--workdir", str(tmp_path / "demo"), "--port", str(busy_port),
                           "--duration", "1"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (f"lakemirror: cannot start: port {busy_port} on 127.0.0.1 is in use: set the "
                                   f"demo's port (`make demo PORT=…` or `lakemirror demo --port …`; 0: any free "
                                   f"port) to a free port, or stop the other process")
