"""Streaming Tables on Databricks: the backing table is found from the pipeline id and deep-cloned;
checked statement by statement against a recording fake of the SQL layer (no workspace)."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.operations import SparkOperations
from lakemirror.sinks.sql import RecordingSql
from lakemirror.sources.catalog import UnityCatalog
from lakemirror.sources.streaming_tables import BackingTableMissing, backing_candidates, resolve_backing_table
from lakemirror.supervisor.subtasks.batch_runner import TableJob, TaskSettings

ST = TableName("prod", "sales", "events")
PID = "1a2b3c4d-0000-4e5f-9a8b-123456789abc"
SCHEMA = "__dlt_materialization_schema_1a2b3c4d_0000_4e5f_9a8b_123456789abc"
SHOW = f"SHOW TABLES IN `__databricks_internal`.`{SCHEMA}`"
TYPE = "DESCRIBE TABLE EXTENDED `prod`.`sales`.`events`"


def workspace(backing: list[str], *, pipeline_id: str | None = PID, kind: str = "STREAMING_TABLE") -> RecordingSql:
    def detail(stmt: str) -> list[dict[str, Any]]:
        if "`__databricks_internal`" in stmt:
            return [{"id": "backing-id", "properties": {}}]
        return [{"id": "st-id", "properties": {"pipelines.pipelineId": pipeline_id} if pipeline_id else {}}]

    return RecordingSql({"DESCRIBE DETAIL": detail, "SHOW TABLES IN": [{"tableName": t} for t in backing],
                         "DESCRIBE HISTORY": [{"version": 12}],
                         "DESCRIBE TABLE EXTENDED": [{"col_name": "id", "data_type": "bigint"},
                                                     {"col_name": "Type", "data_type": kind}]})


def test_the_candidates_follow_the_pipeline_id_with_underscores() -> None:
    assert [str(c) for c in backing_candidates(ST, PID)] == [
        f"__databricks_internal.{SCHEMA}.events",
        f"__databricks_internal.{SCHEMA}.__materialization_mat_1a2b3c4d_0000_4e5f_9a8b_123456789abc_events_1",
        f"__databricks_internal.{SCHEMA}.__materialization_mat_events_1"]


@pytest.mark.parametrize("present, chosen", [
    (["events", "__materialization_mat_events_1"], "events"),
    (["__event_log", "__materialization_mat_events_1"], "__materialization_mat_events_1"),
])
def test_the_first_existing_candidate_is_the_backing_table(present: list[str], chosen: str) -> None:
    fake = workspace(present)
    assert resolve_backing_table(fake, ST) == TableName("__databricks_internal", SCHEMA, chosen)
    assert fake.statements == ["DESCRIBE DETAIL `prod`.`sales`.`events`", TYPE, SHOW]


def test_an_ordinary_table_is_its_own_backing_table() -> None:
    fake = workspace([], pipeline_id=None)
    assert UnityCatalog.backing_table(fake, ST) == ST
    assert fake.statements == ["DESCRIBE DETAIL `prod`.`sales`.`events`"]


def test_a_materialized_view_is_refused_by_name_with_the_reason() -> None:
    from lakemirror.sources.streaming_tables import UnsupportedObject

    fake = workspace(["events"], kind="MATERIALIZED_VIEW")
    with pytest.raises(UnsupportedObject, match="prod.sales.events is a materialized view and is not replicated: "
                                                "a materialized view is the result of its query"):
        resolve_backing_table(fake, ST)
    assert SHOW not in fake.statements  # nothing looked up, nothing cloned


def test_a_missing_backing_table_is_refused_naming_what_was_tried() -> None:
    with pytest.raises(BackingTableMissing, match="__materialization_mat_events_1") as info:
        resolve_backing_table(workspace(["__event_log"]), ST)
    assert PID in str(info.value)


class FakeSession:
    """The few SparkSession calls SparkOperations makes on Databricks, answered by RecordingSql."""

    def __init__(self, sql: RecordingSql) -> None:
        self.recording = sql

    def newSession(self) -> "FakeSession":  # noqa: N802 (Spark's name)
        return self

    def addTag(self, tag: str) -> None:  # noqa: N802
        pass

    def removeTag(self, tag: str) -> None:  # noqa: N802
        pass

    def sql(self, statement: str) -> Any:
        rows = self.recording.sql(statement)

        class Row(dict[str, Any]):
            def asDict(self, recursive: bool = False) -> dict[str, Any]:  # noqa: N802
                return dict(self)

        class Frame:
            def collect(self) -> list[Row]:
                return [Row(r) for r in rows]

        return Frame()


def test_clone_of_a_streaming_table_deep_clones_its_backing_table() -> None:
    fake = workspace(["__materialization_mat_events_1"])
    ops = SparkOperations(FakeSession(fake), UnityCatalog(), results=None, unity_catalog=True)  # type: ignore[arg-type]
    details = ops.run("clone", TableJob(ST, TableName("dr", "sales", "events"), TaskSettings()), "tag-1")
    backing = f"`__databricks_internal`.`{SCHEMA}`.`__materialization_mat_events_1`"
    assert fake.statements == [
        "DESCRIBE DETAIL `prod`.`sales`.`events`",
        TYPE,
        SHOW,
        f"DESCRIBE HISTORY {backing} LIMIT 1",
        f"DESCRIBE DETAIL {backing}",
        f"CREATE OR REPLACE TABLE `dr`.`sales`.`events` DEEP CLONE {backing} VERSION AS OF 12",
        "ALTER TABLE `dr`.`sales`.`events` SET TBLPROPERTIES ('lakemirror.cloneSource' = 'prod.sales.events', "
        "'lakemirror.cloneSourceId' = 'backing-id', 'lakemirror.cloneSourceVersion' = '12')",
    ]
    assert details["source_version"] == 12 and "backing table" in str(details["reason"])


def test_clone_of_an_ordinary_table_is_unchanged() -> None:
    fake = workspace([], pipeline_id=None)
    ops = SparkOperations(FakeSession(fake), UnityCatalog(), results=None, unity_catalog=True)  # type: ignore[arg-type]
    ops.run("clone", TableJob(ST, TableName("dr", "sales", "events"), TaskSettings()), "tag-2")
    assert fake.statements[1:4] == ["DESCRIBE HISTORY `prod`.`sales`.`events` LIMIT 1",
                                    "DESCRIBE DETAIL `prod`.`sales`.`events`",
                                    "CREATE OR REPLACE TABLE `dr`.`sales`.`events` DEEP CLONE "
                                    "`prod`.`sales`.`events` VERSION AS OF 12"]
