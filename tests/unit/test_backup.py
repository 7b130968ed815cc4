"""The backup operation: Streaming Tables' backing tables deep cloned into the backup catalog, other
tables shared through their schemas, materialized views and streaming checkpoints refused by name with
the reason, then the schemas added to the share (a fake workspace that accepts only requests valid for
databricks-sdk's models)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from lakemirror.checkpoints.audit import InMemoryAuditLog
from lakemirror.daemon.context import ReplicateContext
from lakemirror.daemon.settings.replicate import load_replicate_config
from lakemirror.errors import ConfigError
from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.backup import ShareSchemas, backup_table
from lakemirror.sinks.batch.routing import ByOperation
from lakemirror.sinks.sql import RecordingSql
from lakemirror.sources.catalog import InMemoryDiscovery
from tests.unit.databricks_workspace_fake import FakeWorkspace

PID = "0f0e-11"
INTERNAL = "`__databricks_internal`.`__dlt_materialization_schema_0f0e_11`"


def workspace() -> RecordingSql:
    kinds = {"events": "STREAMING_TABLE", "daily": "MATERIALIZED_VIEW", "orders": "MANAGED"}

    def detail(stmt: str) -> list[dict[str, Any]]:
        name = stmt.rsplit("`.`", 1)[-1].rstrip("`")
        piped = name in ("events", "daily")
        return [{"id": f"id-{name}", "properties": {"pipelines.pipelineId": PID} if piped else {}}]

    def kind(stmt: str) -> list[dict[str, Any]]:
        name = stmt.rsplit("`.`", 1)[-1].rstrip("`")
        return [{"col_name": "Type", "data_type": kinds[name]}]

    return RecordingSql({"DESCRIBE DETAIL": detail, "DESCRIBE TABLE EXTENDED": kind,
                         "SHOW TABLES IN": [{"tableName": "events"}, {"tableName": "daily"}],
                         "DESCRIBE HISTORY": [{"version": 7}]})


def test_a_streaming_table_is_deep_cloned_from_its_backing_table_into_the_backup_catalog() -> None:
    sql = workspace()
    details = backup_table(sql, TableName("prod", "sales", "events"), "prod_backup")
    assert details["action"] == "deep_clone" and details["share_schema"] == "prod_backup.sales"
    assert "CREATE SCHEMA IF NOT EXISTS `prod_backup`.`sales`" in sql.statements
    assert (f"CREATE OR REPLACE TABLE `prod_backup`.`sales`.`events` DEEP CLONE {INTERNAL}.`events` VERSION AS OF 7"
            in sql.statements)


def test_an_ordinary_table_is_shared_through_its_schema_and_a_materialized_view_refused() -> None:
    from lakemirror.sources.streaming_tables import UnsupportedObject

    sql = workspace()
    assert backup_table(sql, TableName("prod", "sales", "orders"), "b")["share_schema"] == "prod.sales"
    with pytest.raises(UnsupportedObject, match="prod.sales.daily is a materialized view and is not replicated"):
        backup_table(sql, TableName("prod", "sales", "daily"), "b")
    assert not [s for s in sql.statements if "CLONE" in s]


def test_streaming_checkpoints_and_a_local_runtime_are_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        load_replicate_config(None, data={"runtime": {"mode": "databricks"}, "operations": ["backup"],
                                          "catalogs": [{"name": "prod", "target_catalog": "dr"}],
                                          "backup": {"include_checkpoints": True}})
    [(where, why)] = caught.value.problems
    assert where.endswith("backup.include_checkpoints") and "streaming checkpoints are not backed up" in why
    assert "progress through its own source" in why
    with pytest.raises(ConfigError, match="set runtime.mode: databricks"):
        load_replicate_config(None, data={"operations": ["backup"],
                                          "catalogs": [{"name": "prod", "target_catalog": "dr"}]})


class Backups:
    """The backup operation on the recording workspace; a materialized view fails like the real one."""

    def __init__(self) -> None:
        self.sql = workspace()

    def run(self, operation: str, job: Any, tag: str) -> dict[str, Any]:
        return backup_table(self.sql, job.source, job.settings.options["backup"]["catalog"].format(
            catalog=job.source.catalog))

    def cancel(self, tag: str) -> None:
        pass


def test_a_backup_run_clones_refuses_and_then_adds_the_schemas_to_the_share() -> None:
    src = FakeWorkspace("aws:1:src", name="src")
    src.catalogs["prod"] = {"name": "prod"}
    for s in ("prod.sales", "prod_backup.sales"):
        src.schemas[s] = {"name": "sales", "catalog_name": s.split(".")[0], "full_name": s}
    src.shares["lakemirror_prod"] = {"name": "lakemirror_prod", "objects": [{"name": "prod.sales"}]}
    config = load_replicate_config(None, data={
        "runtime": {"mode": "databricks"}, "operations": ["backup"], "retry": {"max_attempts": 3},
        "catalogs": [{"name": "prod", "target_catalog": "dr"}]})
    audit = InMemoryAuditLog()
    with src:
        context = ReplicateContext(config, out=io.StringIO()).replace(
            audit=audit, execution_user="me",
            discovery=InMemoryDiscovery({"prod": {"sales": ["events", "daily", "orders"]}}),
            operations=ByOperation(Backups(), {"backup_share": ShareSchemas(src.client)}))
        summary = context.run()
    rows = sorted((r.object_type, r.object_name, r.status, r.operation_type) for r in audit.records)
    assert rows == [("share", "lakemirror_prod", "success", "backup"),
                    ("table", "daily", "failed", "backup"), ("table", "events", "success", "backup"),
                    ("table", "orders", "success", "backup")]
    daily = next(r for r in audit.records if r.object_name == "daily")
    assert "materialized view" in (daily.error_message or "") and daily.attempt_number == 1  # not retried
    assert [o["name"] for o in src.shares["lakemirror_prod"]["objects"]] == ["prod.sales", "prod_backup.sales"]
    assert not summary.ok and src.rejected == []
