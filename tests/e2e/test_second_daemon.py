"""One writer per pipeline, with real daemon processes: a second `lakemirror run` of a running
pipeline exits 2 with one line naming the holder and leaves the first daemon and its daemon.json
alone; once the first is SIGKILLed, the next start takes the lease over at once (same host, its
process gone). The lease itself, two processes racing for it and a dead holder's takeover are
tested without Spark in tests/unit/test_lease.py and tests/unit/test_daemon_lease.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LAKEMIRROR = [sys.executable, "-m", "lakemirror.daemon.cli"]


def answering(endpoint: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float = 240) -> dict[str, Any]:
    """daemon.json once the daemon it names answers /status."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"the daemon died:\n{log.read_text()[-3000:]}"
        try:
            found = json.loads(endpoint.read_text())
            with urllib.request.urlopen(f"{found['url']}/status", timeout=5):
                return found  # type: ignore[no-any-return]
        except (OSError, ValueError, KeyError):
            time.sleep(0.5)
    raise AssertionError(f"the daemon never answered:\n{log.read_text()[-3000:]}")


def test_a_second_daemon_is_refused_and_a_killed_ones_lease_is_taken_over(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline_id": "one", "source_catalog": "shop", "destination_catalog": "mirror", "schema_name": "main",
        "tables": ["orders"], "checkpoint_volume": str(tmp_path / "ck"), "lag_interval_seconds": 0.5,
        "runtime": {"warehouse": str(tmp_path / "lake"), "shuffle_partitions": 2}, "http": {"port": 0}}))
    endpoint = tmp_path / "ck" / "one" / "daemon.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "first.log"
    first = subprocess.Popen([*LAKEMIRROR, "run", str(config)], stdout=log.open("ab"), stderr=subprocess.STDOUT,
                             env=env)
    try:
        held = answering(endpoint, first, log)
        second = subprocess.run([*LAKEMIRROR, "run", str(config)], capture_output=True, text=True, timeout=120,
                                env=env)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "pipeline one is already run by host" in lines[0], second.stderr
        assert f"pid {first.pid}" in lines[0] and held["url"] in lines[0] and str(config) in lines[0]
        assert json.loads(endpoint.read_text()) == held, "daemon.json is the first daemon's, untouched"
        paused = subprocess.run([*LAKEMIRROR, "pause", str(config), "orders"], capture_output=True, text=True,
                                timeout=60, env=env)
        assert paused.returncode == 0, paused.stderr  # the running daemon is still found and answers

        first.send_signal(signal.SIGKILL)
        first.wait(60)
        log2 = tmp_path / "second.log"
        third = subprocess.Popen([*LAKEMIRROR, "run", str(config)], stdout=log2.open("ab"),
                                 stderr=subprocess.STDOUT, env=env)
        try:
            taken = answering(endpoint, third, log2)
            assert taken["pid"] == third.pid
            assert "took the lease over" in log2.read_text()
            third.send_signal(signal.SIGTERM)
            assert third.wait(180) == 0, log2.read_text()[-3000:]
            assert not endpoint.exists()
        finally:
            if third.poll() is None:
                third.kill()
                third.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
