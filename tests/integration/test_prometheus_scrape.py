"""A real Prometheus server (Debian's package, installed by scripts/install-services.sh) scrapes a
running daemon on loopback, and the lag query the dashboard and the alert rules use returns a value."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return list(json.load(response)["data"]["result"])
    except OSError:  # the server is still starting
        return []


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package prometheus: "
                                               "run scripts/install-services.sh)")
def test_prometheus_scrapes_the_daemon_and_the_lag_query_returns_a_value(pipeline, tmp_path: Path) -> None:
    pipeline.create("orders", "id BIGINT NOT NULL, status STRING")
    pipeline.sql("orders", "INSERT INTO {t} SELECT id, 'new' FROM range(0, 20)")
    server = pipeline.app.server
    server.start()
    prom_port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: lakemirror\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{server.port}']}}]\n")
    assert PROMETHEUS is not None
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    try:
        pipeline.start()
        pipeline.wait_caught_up("orders")
        pipeline.sql("orders", "UPDATE {t} SET status = 'paid' WHERE id < 5")
        pipeline.wait_caught_up("orders")
        latest = pipeline.latest_version("orders")
        lag: list[dict[str, Any]] = []
        applied: list[dict[str, Any]] = []
        deadline = time.time() + 90
        while time.time() < deadline and not (lag and applied and float(applied[0]["value"][1]) == latest):
            pipeline.app.supervisor.tick()  # keeps probing lag while Prometheus scrapes
            lag = _query(prom_port, 'lakemirror_lag_seconds{job="lakemirror", pipeline="test"}')
            applied = _query(prom_port, 'lakemirror_last_applied_version{job="lakemirror", pipeline="test"}')
            time.sleep(0.5)
        log = (tmp_path / "prometheus.log").read_text()[-2000:]
        assert lag, f"Prometheus returned no lakemirror_lag_seconds; its log ends:\n{log}"
        assert "orders" in lag[0]["metric"]["table"]
        assert float(lag[0]["value"][1]) >= 0.0
        assert applied and float(applied[0]["value"][1]) == latest, applied
        up = _query(prom_port, 'up{job="lakemirror"}')
        assert up and up[0]["value"][1] == "1"
    finally:
        prom.terminate()
        prom.wait(20)
        server.close()
