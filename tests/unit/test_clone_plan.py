"""Clone planning (pure) and the Databricks DEEP CLONE SQL, checked against a recording executor."""

from __future__ import annotations

import pytest

from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.clone import CloneState, DeepCloner, deep_clone_sql, is_window_error, plan_clone
from lakemirror.sinks.sql import RecordingSql

GOOD = CloneState(source_version=9, source_id="abc", cdf_enabled=True, replica_exists=True,
                  mirrored_version=5, mirrored_source_id="abc")


def test_incremental_when_everything_lines_up():
    plan = plan_clone(GOOD)
    assert (plan.mode, plan.from_version, plan.to_version) == ("incremental", 6, 9)


@pytest.mark.parametrize("change, reason", [
    (dict(replica_exists=False), "does not exist"),
    (dict(mirrored_version=None), "does not record"),
    (dict(mirrored_source_id="other"), "replaced"),
    (dict(mirrored_version=12), "newer"),
    (dict(schema_changed=True), "schema"),
    (dict(cdf_enabled=False), "change data feed"),
    (dict(has_key=False), "no usable key"),
])
def test_full_copy_otherwise(change, reason):
    plan = plan_clone(CloneState(**{**GOOD.__dict__, **change}))
    assert plan.mode == "full" and reason in plan.reason and plan.to_version == 9


def test_noop_when_already_mirrored_and_force_full():
    assert plan_clone(CloneState(**{**GOOD.__dict__, "mirrored_version": 9})).mode == "noop"
    assert plan_clone(GOOD, force_full=True).mode == "full"


def test_window_errors_recognised():
    assert is_window_error(RuntimeError("[DELTA_MISSING_CHANGE_DATA] Error getting change data"))
    assert not is_window_error(RuntimeError("[DELTA_CONCURRENT_APPEND] conflict"))


def test_deep_clone_sql_quotes_names():
    sql = deep_clone_sql(TableName("prod", "o`s", "t"), TableName("mirror", "os", "t-1"), 42)
    assert sql == "CREATE OR REPLACE TABLE `mirror`.`os`.`t-1` DEEP CLONE `prod`.`o``s`.`t` VERSION AS OF 42"
    with pytest.raises(ValueError):
        deep_clone_sql(TableName("a", "b", "c"), TableName("a", "b", "d"), -1)


def test_deep_cloner_runs_exactly_these_statements():
    fake = RecordingSql({"DESCRIBE HISTORY": [{"version": 17}], "DESCRIBE DETAIL": [{"id": "tid-1"}]})
    result = DeepCloner(fake).clone(TableName("prod", "sales", "orders"), TableName("dr", "sales", "orders"))
    assert fake.statements == [
        "DESCRIBE HISTORY `prod`.`sales`.`orders` LIMIT 1",
        "DESCRIBE DETAIL `prod`.`sales`.`orders`",
        "CREATE OR REPLACE TABLE `dr`.`sales`.`orders` DEEP CLONE `prod`.`sales`.`orders` VERSION AS OF 17",
        "ALTER TABLE `dr`.`sales`.`orders` SET TBLPROPERTIES ('lakemirror.cloneSource' = 'prod.sales.orders', "
        "'lakemirror.cloneSourceId' = 'tid-1', 'lakemirror.cloneSourceVersion' = '17')",
    ]
    assert result.source_version == 17


def test_a_replica_gets_column_mapping_when_its_source_has_it() -> None:
    from lakemirror.sinks.batch.snapshot_copy import creation_options

    assert creation_options({"delta.columnMapping.mode": "name"}) == {"delta.columnMapping.mode": "name"}
    assert creation_options({"delta.columnMapping.mode": "ID"}) == {"delta.columnMapping.mode": "name"}
    assert creation_options({"delta.columnMapping.mode": "none"}) == {}
    assert creation_options({}) == {}
