"""The daemon as a real process: refuses bad config before starting, drains on SIGTERM,
survives SIGKILL, and resumes from its checkpoints with nothing lost or doubled."""

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

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.merge.delta_merge import is_txn_tag
from lakemirror.sources.catalog import LocalCatalog

pytestmark = pytest.mark.e2e

LAKEMIRROR = [sys.executable, "-m", "lakemirror.daemon.cli"]


def test_invalid_config_exits_2_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({
        "source_catalog": "prod", "destination_catalog": "prod.mirror", "schema_name": "orders",
        "checkpoint_volume": str(tmp_path / "ck"), "trigger_interval_seconds": -1, "tabels": ["x"]}))
    proc = subprocess.run([*LAKEMIRROR, "run", str(config)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "destination_catalog" in proc.stderr and "trigger_interval_seconds" in proc.stderr
    assert "tabels" in proc.stderr and "unknown setting" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ck").exists(), "nothing may start for an invalid config"


class Daemon:
    def __init__(self, config: Path, pipeline_dir: Path, log: Path) -> None:
        self.config, self.pipeline_dir, self.log = config, pipeline_dir, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        (self.pipeline_dir / "daemon.json").unlink(missing_ok=True)
        self.proc = subprocess.Popen([*LAKEMIRROR, "run", str(self.config)], stdout=self.log.open("ab"),
                                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def status(self) -> dict[str, Any] | None:
        endpoint = self.pipeline_dir / "daemon.json"
        if not endpoint.exists():
            return None
        try:
            url = json.loads(endpoint.read_text())["url"]
            with urllib.request.urlopen(f"{url}/status", timeout=5) as resp:
                return json.load(resp)  # type: ignore[no-any-return]
        except (OSError, ValueError, KeyError):
            return None

    def wait_until(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc is not None and self.proc.poll() is None, f"daemon died:\n{self.log.read_text()[-3000:]}"
            st = self.status()
            if st is not None and predicate(st):
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}; last status {self.status()}\n{self.log.read_text()[-3000:]}")

    def stop(self, sig: int, timeout: float = 120) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


#: In the slow tier: each crash-torture smoke of the default tier SIGKILLs a daemon and
#: ends each run by SIGTERM, checking the drain exits 0.
@pytest.mark.slow
def test_daemon_drains_on_sigterm_and_survives_sigkill(spark: Any, tmp_path: Path) -> None:
    warehouse = tmp_path / "lakehouse"
    catalog = LocalCatalog(warehouse)
    src = catalog.locate(TableName("shop", "main", "orders"))
    dst = catalog.locate(TableName("mirror", "main", "orders"))
    spark.sql(f"CREATE TABLE {src.sql} (id BIGINT NOT NULL, v BIGINT) USING DELTA "
              f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"INSERT INTO {src.sql} SELECT id, 0 FROM range(0, 100)")
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline_id": "e2e", "source_catalog": "shop", "destination_catalog": "mirror", "schema_name": "main",
        "checkpoint_volume": str(tmp_path / "ck"), "trigger_interval_seconds": 0.5, "lag_interval_seconds": 0.5,
        "runtime": {"warehouse": str(warehouse), "shuffle_partitions": 2}, "http": {"port": 0}}))
    daemon = Daemon(config, tmp_path / "ck" / "e2e", tmp_path / "daemon.log")

    def latest() -> int:
        return int(tables.delta_table(spark, src).history(1).collect()[0]["version"])

    def caught_up(st: dict[str, Any]) -> bool:
        t = {r["table"]: r for r in st["tables"]}.get("orders")
        return bool(t and t["state"] == "running" and (t["applied_through"] or -1) >= latest())

    def assert_equal() -> None:
        want = sorted(tuple(r) for r in tables.read(spark, src).collect())
        got = sorted(tuple(r) for r in tables.read(spark, dst).select("id", "v").collect())
        assert got == want

    daemon.start()
    daemon.wait_until(caught_up, 180, "bootstrap and first catch-up")
    assert_equal()

    spark.sql(f"UPDATE {src.sql} SET v = v + 1 WHERE id % 2 = 0")
    daemon.wait_until(caught_up, 120, "catch-up after an update")
    assert daemon.stop(signal.SIGTERM) == 0, daemon.log.read_text()[-3000:]
    assert not (daemon.pipeline_dir / "daemon.json").exists()

    spark.sql(f"DELETE FROM {src.sql} WHERE id < 10")
    spark.sql(f"INSERT INTO {src.sql} SELECT id, 5 FROM range(0, 5)")
    daemon.start()
    daemon.wait_until(caught_up, 180, "catch-up after a graceful restart")
    assert_equal()

    spark.sql(f"UPDATE {src.sql} SET v = v * 10 WHERE id > 50")
    time.sleep(1.0)
    daemon.stop(signal.SIGKILL)  # a crash, wherever the batch happened to be
    spark.sql(f"INSERT INTO {src.sql} SELECT id, 7 FROM range(100, 120)")
    daemon.start()
    daemon.wait_until(caught_up, 180, "catch-up after a crash")
    assert_equal()
    assert daemon.stop(signal.SIGTERM) == 0

    batches = [h["userMetadata"] for h in tables.delta_table(spark, dst).history().collect()
               if is_txn_tag(h["userMetadata"])]  # MERGE or rewrite
    assert batches and len(batches) == len(set(batches)), "a micro-batch was committed twice"
