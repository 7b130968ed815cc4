"""The batch sub-tasks over Spark Connect, through the server scripts/connect-server.sh starts (no
Delta Connect plugin): ``lakemirror replicate`` as a process clones and then clones incrementally,
and the daemon's scheduled sub-tasks sweep the source's changes, repair a drift introduced in the
replica and copy comments and properties; at the end the replica equals the source row for row."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lakemirror import tables
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.settings import load_settings
from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.clone import CLONE_VERSION_PROPERTY
from lakemirror.sinks.batch.snapshot_copy import replica_properties
from lakemirror.sources.catalog import LocalCatalog

from tests.integration.test_connect import remote  # noqa: F401 (the module's Connect session)

#: In the slow tier: the default tier replicates over Spark Connect (tests/integration/test_connect.py)
#: and runs each operation against a local session (test_incremental.py; test_reconcile.py, which
#: also syncs metadata).
pytestmark = [pytest.mark.integration, pytest.mark.connect, pytest.mark.slow]

SOURCE, REPLICA = TableName("src", "sales", "orders"), TableName("dst", "sales", "orders")
COLUMNS = ["id", "v", "n"]


def rows(spark: Any, loc: tables.TableLocation) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in tables.read(spark, loc).select(*COLUMNS).collect()), key=repr)


def replicate(config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``lakemirror replicate`` as its own process (a Connect client: no JVM of its own)."""
    cli = Path(sys.executable).with_name("lakemirror")
    return subprocess.run([str(cli), "replicate", str(config), *flags], capture_output=True, text=True,
                          timeout=600, check=False)


def audit_details(spark: Any, loc: tables.TableLocation, operation: str) -> list[dict[str, Any]]:
    """The details of the successful audit rows of ``operation``, oldest first."""
    found = (tables.read(spark, loc).where("status = 'success'").orderBy("logging_time")
             .select("details").collect())
    details = [json.loads(r["details"]) for r in found]
    return [d for d in details if d["operation"] == operation]


def run_now(ctx: DaemonContext, now: list[float]) -> Callable[[str], None]:
    """Runs one scheduled sub-task through the daemon's SubtaskService: the clock moves on to its
    due time (the schedules are chosen so that no other sub-task is due then) and the run happens
    on the calling thread."""
    def run(task: str) -> None:
        views = {v.task: v for v in ctx.subtasks.views()}
        due = views[task].next_run_at
        assert due is not None and due >= now[0]
        now[0] = due
        ctx.subtasks.tick()
        after = {v.task: v for v in ctx.subtasks.views()}
        assert {t: v.runs - views[t].runs for t, v in after.items()} == {t: int(t == task) for t in after}
        assert after[task].last_outcome == "success", after[task].last_error
    return run


def test_clone_sweep_reconcile_and_metadata_over_connect(remote: Any, connect_server: str,  # noqa: F811
                                                          tmp_path: Path) -> None:
    assert not tables.has_own_jvm(remote)
    warehouse, checkpoints = tmp_path / "lakehouse", tmp_path / "checkpoints"
    catalog = LocalCatalog(warehouse)
    src, rep = catalog.locate(SOURCE), catalog.locate(REPLICA)
    runtime = {"mode": "connect", "spark_remote": connect_server, "warehouse": str(warehouse)}
    remote.sql(f"CREATE TABLE {src.sql} (id BIGINT NOT NULL COMMENT 'the key', v STRING, n INT) USING DELTA "
               f"COMMENT 'orders' TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', "
               f"'lakemirror.primaryKey' = 'id', 'team' = 'sales')")
    remote.sql(f"INSERT INTO {src.sql} SELECT id, concat('v', id), CAST(id AS INT) FROM range(0, 40)")

    # 1. `lakemirror replicate` in connect mode: a full copy, then a clone of the change range.
    config = tmp_path / "replicate.yaml"
    config.write_text(yaml.safe_dump({
        "checkpoint_volume": str(checkpoints), "runtime": runtime, "retry": {"max_attempts": 1},
        "catalogs": [{"name": "src", "target_catalog": "dst", "include_schemas": ["sales"]}]}))
    first = replicate(config, "--operation", "clone")
    assert first.returncode == 0, first.stdout + first.stderr
    assert rows(remote, rep) == rows(remote, src)
    audit = catalog.locate(TableName("dst", "continuous_sync", "audit_log"))
    assert audit_details(remote, audit, "clone")[-1]["mode"] == "full"

    remote.sql(f"INSERT INTO {src.sql} VALUES (100, 'new', 1), (101, 'new', 2)")
    remote.sql(f"UPDATE {src.sql} SET v = 'upd', n = n + 1000 WHERE id < 5")
    remote.sql(f"DELETE FROM {src.sql} WHERE id >= 35 AND id < 100")
    second = replicate(config, "--operation", "clone")
    assert second.returncode == 0, second.stdout + second.stderr
    cloned = audit_details(remote, audit, "clone")[-1]
    assert cloned["mode"] == "incremental" and cloned["rows_changed"] == 2 + 5 + 5, cloned
    assert rows(remote, rep) == rows(remote, src)

    # 2. The daemon's scheduled sub-tasks, in connect mode, on the same tables.
    settings = load_settings(None, {
        "pipeline_id": "connect-subtasks", "source_catalog": "src", "destination_catalog": "dst",
        "schema_name": "sales", "checkpoint_volume": str(checkpoints), "runtime": runtime, "http": {"port": 0},
        "exclude_tables": ["orders"],
        # Due at +1000 and +2000 (sweep), +2500 (repair), +2800 (check): one at a time.
        "schedules": [
            {"name": "sweep", "operations": ["incremental"], "every_seconds": 1000,
             "tables": ["orders"], "retry": {"max_attempts": 1}},
            {"name": "repair", "operations": ["reconcile", "metadata"], "every_seconds": 2500, "tables": ["orders"],
             "reconcile": {"repair": True, "buckets": 16}, "retry": {"max_attempts": 1}},
            {"name": "check", "operations": ["reconcile", "metadata"], "every_seconds": 2800, "tables": ["orders"],
             "reconcile": {"repair": False}, "retry": {"max_attempts": 1}}]})
    now = [1_000_000.0]

    def inline(target: Callable[[], None], name: str) -> threading.Thread:
        target()
        return threading.Thread(target=lambda: None, name=name)

    ctx = DaemonContext(settings).replace(spark=remote, metrics=Metrics("connect-subtasks", CollectorRegistry()),
                                          clock=lambda: now[0], spawn=inline)
    run = run_now(ctx, now)

    # Inserts, updates and deletes, swept from the version the clone recorded.
    remote.sql(f"INSERT INTO {src.sql} VALUES (200, 'late', 7)")
    remote.sql(f"UPDATE {src.sql} SET v = 'again' WHERE id IN (1, 100)")
    remote.sql(f"DELETE FROM {src.sql} WHERE id IN (2, 101)")
    run("sweep")
    swept = audit_details(remote, audit, "incremental")[-1]
    assert (swept["action"], swept["rows_inserted"], swept["rows_updated"], swept["rows_deleted"]) == \
        ("adopt", 1, 2, 2), swept
    assert swept["batches"] >= 1 and swept["batches_replayed"] == 0 and swept["rows_read"] >= 5, swept
    assert rows(remote, rep) == rows(remote, src)
    version = tables.latest_version(remote, src)
    assert replica_properties(remote, rep)[CLONE_VERSION_PROPERTY] == str(version)

    # A second sweep continues the epoch.
    remote.sql(f"UPDATE {src.sql} SET n = -n WHERE id = 3")
    run("sweep")
    again = audit_details(remote, audit, "incremental")[-1]
    assert (again["action"], again["rows_updated"], again["batches_replayed"]) == ("stream", 1, 0), again
    assert rows(remote, rep) == rows(remote, src)

    # 3. A drift in the replica (a row lost, a row changed, a row that should not be there), and new
    # comments and a changed property at the source: reconciled, repaired and synced.
    remote.sql(f"COMMENT ON TABLE {src.sql} IS 'orders, it\\'s v2'")
    remote.sql(f"ALTER TABLE {src.sql} ALTER COLUMN v COMMENT 'the value'")
    remote.sql(f"ALTER TABLE {src.sql} SET TBLPROPERTIES ('team' = 'ops')")
    remote.sql(f"DELETE FROM {rep.sql} WHERE id = 10")
    remote.sql(f"UPDATE {rep.sql} SET v = 'drifted' WHERE id = 11")
    remote.sql(f"INSERT INTO {rep.sql} VALUES (999, 'stray', 0)")
    assert rows(remote, rep) != rows(remote, src)
    run("repair")
    results = catalog.locate(TableName("dst", "continuous_sync", "reconciliation"))
    found = tables.read(remote, results).orderBy("checked_at").collect()[-1]
    assert (found["missing_keys"], found["extra_keys"], found["different_keys"], found["repaired"]) == \
        (1, 1, 1, True), found
    assert list(found["sample_missing"]) == ['{"id":10}'] and list(found["sample_extra"]) == ['{"id":999}']
    detail = remote.sql(f"DESCRIBE DETAIL {rep.sql}").collect()[0]
    assert detail["description"] == "orders, it's v2" and detail["properties"]["team"] == "ops"
    comments = {r["col_name"]: r["comment"] for r in remote.sql(f"DESCRIBE TABLE {rep.sql}").collect()}
    assert comments["v"] == "the value" and comments["id"] == "the key"
    assert audit_details(remote, audit, "metadata")[-1]["statements"] >= 3
    run("check")  # a reconciliation without repair fails on any mismatch; nothing left to sync either
    last = tables.read(remote, results).orderBy("checked_at").collect()[-1]
    assert (last["status"], last["repaired"]) == ("equal", False), last
    assert audit_details(remote, audit, "metadata")[-1]["statements"] == 0

    assert rows(remote, rep) == rows(remote, src)
    # Nothing the batch functions set stays in the client's session.
    assert remote.conf.get("spark.databricks.delta.write.txnAppId", None) is None
