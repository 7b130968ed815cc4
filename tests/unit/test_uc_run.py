"""The uc_objects operation end to end in ``lakemirror replicate`` (databricks mode): credentials,
locations, catalogs, schemas, volumes, views (rewritten, in dependency order) and grants, each an
audited job, against fake workspaces that accept only requests valid for databricks-sdk's models."""

from __future__ import annotations

import io
from typing import Any

from lakemirror.checkpoints.audit import InMemoryAuditLog
from lakemirror.daemon.context import ReplicateContext
from lakemirror.daemon.settings.replicate import load_replicate_config
from lakemirror.sinks.sql import RecordingSql
from lakemirror.sources.catalog import InMemoryDiscovery
from tests.unit.databricks_workspace_fake import FakeWorkspace
from tests.unit.test_streaming_tables import FakeSession


def views_workspace() -> RecordingSql:
    texts = {"v1": "SELECT * FROM prod.sales.orders", "v2": "SELECT count(*) AS n FROM v1",
             "bad": "SELECT * FROM prod.sales.nowhere"}

    def describe(stmt: str) -> list[dict[str, Any]]:
        name = stmt.rsplit("`.`", 1)[-1].rstrip("`")
        return [{"col_name": "View Text", "data_type": texts[name]}, {"col_name": "Comment", "data_type": None}]

    def create(stmt: str) -> list[dict[str, Any]]:
        if "nowhere" in stmt:
            raise RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] nowhere")
        return []

    return RecordingSql({"SHOW SCHEMAS IN `prod`": [{"databaseName": "sales"}],
                         "SHOW VIEWS IN `prod`.`sales`": [{"viewName": n, "isTemporary": False} for n in texts],
                         "DESCRIBE TABLE EXTENDED": describe, "CREATE OR REPLACE VIEW": create})


def test_every_object_in_order_remapped_with_grants_and_audited() -> None:
    src, dst = FakeWorkspace("aws:1:src", name="src"), FakeWorkspace("aws:2:dst", name="dst")
    src.catalogs["prod"] = {"name": "prod", "comment": "production"}
    src.schemas["prod.sales"] = {"name": "sales", "catalog_name": "prod", "full_name": "prod.sales"}
    src.volumes["prod.sales.files"] = {"name": "files", "catalog_name": "prod", "schema_name": "sales",
                                       "full_name": "prod.sales.files", "volume_type": "MANAGED"}
    src.storage_credentials["role"] = {"name": "role", "aws_iam_role": {"role_arn": "arn:aws:iam::1:role/r"}}
    src.external_locations["raw"] = {"name": "raw", "url": "s3://prod/raw", "credential_name": "role"}
    src.grants[("catalog", "prod")] = {"analysts": {"USE_CATALOG"}}
    src.grants[("table", "prod.sales.orders")] = {"analysts": {"SELECT"}}
    src.grants[("table", "prod.sales.v1")] = {"analysts": {"SELECT"}}
    sql = views_workspace()
    with src, dst:
        config = load_replicate_config(None, data={
            "runtime": {"mode": "databricks"}, "operations": ["uc_objects"], "retry": {"max_attempts": 1},
            "workspaces": {"source": {"host": src.server.host, "token": "x"},
                           "target": {"host": dst.server.host, "token": "x"}},
            "uc_objects": {"object_types": ["storage_credential", "external_location", "catalog", "schema", "volume",
                                            "view", "table_grants"],
                           "external_locations": ["raw"], "principals": {"analysts": "dr-analysts"},
                           "location_urls": {"s3://prod": "s3://dr"}},
            "catalogs": [{"name": "prod", "target_catalog": "dr"}]})
        audit = InMemoryAuditLog()
        summary = ReplicateContext(config, out=io.StringIO()).replace(
            spark=FakeSession(sql), audit=audit, execution_user="me",
            discovery=InMemoryDiscovery({"prod": {"sales": ["orders"]}})).run()
    order = [(r.object_type, r.object_name, r.status) for r in audit.records]
    assert [o[0] for o in order] == ["storage_credential", "external_location", "catalog", "schema", "volume",
                                     "view", "view", "view", "table_grants"]
    assert {o[1]: o[2] for o in order if o[0] == "view"} == {"v1": "success", "bad": "failed", "v2": "success"}
    assert all(r.operation_type == "uc_replication" for r in audit.records)
    assert not summary.ok and [o.job.target.table for o in summary.failed] == ["bad"]
    assert dst.external_locations["raw"]["url"] == "s3://dr/raw" and "role" in dst.storage_credentials
    assert dst.volumes["dr.sales.files"]["volume_type"] == "MANAGED"
    assert dst.grants[("catalog", "dr")] == {"dr-analysts": {"USE_CATALOG"}}
    assert dst.grants[("table", "dr.sales.orders")] == {"dr-analysts": {"SELECT"}}
    assert dst.grants[("table", "dr.sales.v1")] == {"dr-analysts": {"SELECT"}}
    creates = [s for s in sql.statements if s.startswith("CREATE OR REPLACE VIEW")]
    assert sorted(creates[:2]) == ["CREATE OR REPLACE VIEW `dr`.`sales`.`bad` AS SELECT * FROM dr.sales.nowhere",
                                   "CREATE OR REPLACE VIEW `dr`.`sales`.`v1` AS SELECT * FROM dr.sales.orders"]
    assert creates[-1] == "CREATE OR REPLACE VIEW `dr`.`sales`.`v2` AS SELECT count(*) AS n FROM v1"
    assert "USE `dr`.`sales`" in sql.statements
    assert src.rejected == [] and dst.rejected == []


def test_what_cannot_be_listed_fails_named_and_the_other_objects_are_replicated() -> None:
    src, dst = FakeWorkspace("aws:1:src", name="src"), FakeWorkspace("aws:2:dst", name="dst")
    for cat in ("prod", "hr"):
        src.catalogs[cat] = {"name": cat}
    for full in ("prod.sales", "prod.ops"):
        cat, name = full.split(".")
        src.schemas[full] = {"name": name, "catalog_name": cat, "full_name": full}
    src.volumes["prod.sales.files"] = {"name": "files", "catalog_name": "prod", "schema_name": "sales",
                                       "full_name": "prod.sales.files", "volume_type": "MANAGED"}
    original = src.handle

    def handle(method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        if method == "GET" and path.endswith("/schemas") and query.get("catalog_name") == ["hr"]:
            return 403, {"error_code": "PERMISSION_DENIED", "message": "no USE CATALOG on hr"}
        if method == "GET" and path.endswith("/volumes") and query.get("schema_name") == ["ops"]:
            return 403, {"error_code": "PERMISSION_DENIED", "message": "no USE SCHEMA on prod.ops"}
        return original(method, path, query, body)

    src.server.dynamic = handle
    with src, dst:
        config = load_replicate_config(None, data={
            "runtime": {"mode": "databricks"}, "operations": ["uc_objects"], "retry": {"max_attempts": 1},
            "workspaces": {"source": {"host": src.server.host, "token": "x"},
                           "target": {"host": dst.server.host, "token": "x"}},
            "uc_objects": {"object_types": ["catalog", "schema", "volume"]},
            "catalogs": [{"name": "prod", "target_catalog": "dr"}, {"name": "hr", "target_catalog": "dr_hr"}]})
        audit = InMemoryAuditLog()
        summary = ReplicateContext(config, out=io.StringIO()).replace(
            spark=FakeSession(RecordingSql({})), audit=audit, execution_user="me",
            discovery=InMemoryDiscovery({})).run()
    rows = {(r.object_type, r.catalog_name, r.schema_name, r.object_name): (r.status, r.error_message)
            for r in audit.records}
    assert rows[("schema", "dr_hr", "*", "*")][0] == "failed"
    assert "the schemas of catalog hr could not be listed" in str(rows[("schema", "dr_hr", "*", "*")][1])
    assert rows[("volume", "dr", "ops", "*")][0] == "failed"
    assert "the volumes of prod.ops could not be listed" in str(rows[("volume", "dr", "ops", "*")][1])
    assert "USE_SCHEMA" in str(rows[("volume", "dr", "ops", "*")][1])  # the privileges this operation uses
    assert "CREATE_RECIPIENT" not in str(rows[("volume", "dr", "ops", "*")][1])
    assert "dr.sales.files" in dst.volumes and {"dr.sales", "dr.ops"} <= set(dst.schemas)
    assert sorted(str(o.job.source) for o in summary.failed) == ["hr.`*`.`*`", "prod.ops.`*`"]
