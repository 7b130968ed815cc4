"""A chunked bootstrap SIGKILLed inside a chunk and between chunks (the daemon as a real process,
killed by the runner's armed fault points, ``LAKEMIRROR_TEST_KILL_AT``): each restart resumes at the
first chunk the replica's transaction records do not name; no chunk is committed twice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from lakemirror import tables
from lakemirror.daemon.context import KILL_AT_ENV
from lakemirror.identifiers import TableName
from lakemirror.sources.catalog import LocalCatalog

#: In the slow tier: the default tier resumes a crashed chunked bootstrap in-process
#: (tests/integration/test_chunked_bootstrap.py), and SIGKILLs a daemon per sink kind (the crash-torture smokes).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHUNKS = 8


def run_until_killed(config: Path, log: Path, kill_at: str) -> int:
    proc = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", "run", str(config)],
                          stdout=log.open("ab"), stderr=subprocess.STDOUT, timeout=900,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", KILL_AT_ENV: kill_at})
    return proc.returncode


def test_a_killed_chunked_bootstrap_resumes_and_writes_no_chunk_twice(spark: Any, tmp_path: Path) -> None:
    warehouse = tmp_path / "lakehouse"
    catalog = LocalCatalog(warehouse)
    src = catalog.locate(TableName("shop", "main", "orders"))
    dst = catalog.locate(TableName("mirror", "main", "orders"))
    spark.sql(f"CREATE TABLE {src.sql} (id BIGINT NOT NULL, v BIGINT) USING DELTA "
              f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    for i in range(CHUNKS):
        spark.range(i * 10, i * 10 + 10).selectExpr("id", "id AS v").coalesce(1).write.format("delta") \
            .mode("append").save(src.path)
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline_id": "e2e", "source_catalog": "shop", "destination_catalog": "mirror", "schema_name": "main",
        "checkpoint_volume": str(tmp_path / "ck"), "trigger_interval_seconds": 0.5, "lag_interval_seconds": 0.5,
        "bootstrap": {"chunk_bytes": 1, "parallel_chunks": 1},
        "runtime": {"warehouse": str(warehouse), "shuffle_partitions": 2}, "http": {"port": 0}}))
    log = tmp_path / "daemon.log"

    # Killed while the 4th chunk (chunk 3) is read and not yet committed, then after the 2nd chunk
    # the restarted daemon commits (chunk 4).
    assert run_until_killed(config, log, "bootstrap_inside_chunk:4") == -9
    assert run_until_killed(config, log, "bootstrap_between_chunks:2") == -9
    text = log.read_text()
    assert "resuming the bootstrap at version" in text and "3 of 8 chunks already committed" in text

    endpoint = tmp_path / "ck" / "e2e" / "daemon.json"
    endpoint.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "lakemirror.daemon.cli", "run", str(config)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                url = json.loads(endpoint.read_text())["url"]
                with urllib.request.urlopen(f"{url}/status", timeout=5) as resp:
                    table = {t["table"]: t for t in json.load(resp)["tables"]}.get("orders")
                if table and table["state"] == "running":
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"not running after the restarts:\n{log.read_text()[-3000:]}")
    finally:
        proc.terminate()
        proc.wait(120)

    want = sorted(tuple(r) for r in tables.read(spark, src).collect())
    got = sorted(tuple(r) for r in tables.read(spark, dst).select("id", "v").collect())
    assert got == want
    assert "5 of 8 chunks already committed" in log.read_text()
    committed = [int(n) for n in re.findall(r"bootstrap chunk (\d+) committed", log.read_text())]
    assert sorted(committed) == list(range(CHUNKS)), committed  # each chunk committed once, over three runs
    tags = [h["userMetadata"] for h in tables.delta_table(spark, dst).history().collect()
            if "/bootstrap/chunk/" in str(h["userMetadata"])]
    assert len(tags) == CHUNKS == len(set(tags))
