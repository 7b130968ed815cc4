"""The control API on a running daemon (real Spark + Delta): a pipeline POSTed over HTTP replicates,
shows its state, cdf-check judges a schema, and DELETE stops it and removes its checkpoints."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.error import HTTPError

import pytest
from prometheus_client import CollectorRegistry

from lakemirror import tables
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.metrics import Metrics
from lakemirror.identifiers import TableName

pytestmark = pytest.mark.integration


def call(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_post_get_cdf_check_and_delete_on_a_running_daemon(spark: Any, tmp_path: Path) -> None:
    warehouse, checkpoints = tmp_path / "lakehouse", tmp_path / "checkpoints"
    settings = load_settings(None, {
        "pipeline_id": "main", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
        "tables": [], "checkpoint_volume": str(checkpoints), "http": {"port": 0},
        "runtime": {"mode": "local", "warehouse": str(warehouse)}})
    app = DaemonContext(settings).replace(spark=spark, metrics=Metrics("main", CollectorRegistry()))
    source = app.catalog.locate(TableName("src", "sales", "orders"))
    raw = app.catalog.locate(TableName("src", "sales", "raw_events"))
    spark.sql(f"CREATE TABLE {source.sql} (id BIGINT NOT NULL, status STRING) USING DELTA "
              f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"INSERT INTO {source.sql} SELECT id, 'new' FROM range(0, 30)")
    spark.sql(f"CREATE TABLE {raw.sql} (payload STRING) USING DELTA")
    url = app.server.url
    stop = threading.Event()
    daemon = threading.Thread(target=app.run, args=(stop,), name="daemon", daemon=True)
    daemon.start()
    try:
        deadline = time.time() + 60
        while not (checkpoints / "main" / "daemon.token").is_file() and time.time() < deadline:
            time.sleep(0.1)
        # no http.auth_token: the daemon generated one, readable by its user only, as the CLI reads it
        token = (checkpoints / "main" / "daemon.token").read_text().strip()
        assert call("GET", f"{url}/api/continuous-sync")[0] == 401
        code, answer = call("POST", f"{url}/api/continuous-sync", token=token, body={
            "pipeline_id": "api1", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
            "tables": ["orders"], "checkpoint_volume": str(checkpoints), "trigger_interval_seconds": 0.5,
            "lag_interval_seconds": 0.5, "allow_schema_evolution": True})
        assert (code, answer) == (201, {"job_id": "api1", "run_url": ""})

        spark.sql(f"UPDATE {source.sql} SET status = 'paid' WHERE id % 3 = 0")
        latest = int(tables.delta_table(spark, source).history(1).collect()[0]["version"])
        deadline, view = time.time() + 120, {}
        while time.time() < deadline:
            view = call("GET", f"{url}/api/continuous-sync/api1", token=token)[1]["tables"][0]
            if view["state"] == "running" and (view["applied_through"] or -1) >= latest \
                    and view["lag_seconds"] == 0:
                break
            time.sleep(0.5)
        assert view["table"] == "orders" and view["state"] == "running", view
        assert view["applied_through"] >= latest and view["versions_behind"] == 0, view
        replica = app.catalog.locate(TableName("dst", "sales", "orders"))
        rows = sorted(tuple(r) for r in tables.read(spark, replica).select("id", "status").collect())
        assert rows == sorted(tuple(r) for r in tables.read(spark, source).collect())

        code, listed = call("GET", f"{url}/api/continuous-sync", token=token)
        assert code == 200 and [p["job_id"] for p in listed["pipelines"]] == ["main", "api1"]

        code, answer = call("POST", f"{url}/api/continuous-sync", token=token, body={
            "pipeline_id": "nested", "source_catalog": "src", "destination_catalog": "dst2", "schema_name": "sales",
            "tables": ["orders"], "checkpoint_volume": str(checkpoints / "api1")})
        assert code == 409 and str(checkpoints / "api1" / "nested") in answer["error"], answer
        assert str(checkpoints / "main") not in answer["error"] and str(checkpoints / "api1") in answer["error"]
        with urllib.request.urlopen(f"{url}/", timeout=30) as page:
            assert page.status == 200 and b'<tr data-table="orders">' not in page.read()  # main has no tables

        code, check = call("GET", f"{url}/api/incremental/cdf-check?catalog=src&schema=sales", token=token)
        assert code == 200 and check["ready"] is False
        verdicts = {t["table"]: t for t in check["tables"]}
        assert verdicts["src.sales.orders"]["ready"] and verdicts["src.sales.orders"]["key"] == ["id"]
        assert verdicts["src.sales.orders"]["key_rule"] == "column named id"
        not_ready = verdicts["src.sales.raw_events"]
        assert not not_ready["ready"] and not not_ready["cdf_enabled"] and not_ready["key"] is None
        assert not_ready["fixes"][0] == (f"ALTER TABLE {raw.sql} SET TBLPROPERTIES "
                                         f"('delta.enableChangeDataFeed' = 'true')")

        assert (checkpoints / "api1").is_dir()
        handle = app.pipelines.get("api1")
        assert handle is not None
        runners = [handle.supervisor._tables[t].runner for t in handle.supervisor._tables]  # noqa: SLF001 (test introspection)
        # Tables take turns and small batches are planned from the commit files: a table's query runs
        # only while Spark plans a batch, so the table's running state is what is checked before the DELETE.
        assert runners and view["state"] == "running"
        code, answer = call("DELETE", f"{url}/api/continuous-sync/api1?cleanup_checkpoints=true", token=token)
        assert (code, answer) == (200, {"job_id": "api1", "stopped": True, "checkpoints_deleted": True})
        assert not (checkpoints / "api1").exists()
        assert call("GET", f"{url}/api/continuous-sync/api1", token=token)[0] == 404
        assert not any(r.query_running for r in runners), "every query of the pipeline stopped"
        assert not [q.name for q in spark.streams.active if (q.name or "").startswith("lakemirror:api1:")]
    finally:
        stop.set()
        daemon.join(60)
    assert not daemon.is_alive()
