"""lakemirror.sinks.merge.planner: the MERGE plan as data, column selection and schema diffs."""

from __future__ import annotations

import pytest

from lakemirror.schema import Column
from lakemirror.sinks.merge.planner import (
    ColumnSelection, SchemaDiff, add_columns_sql, diff_schema, plan_merge, rank_sql,
)

ORDERS = (
    Column("order_id", "bigint", nullable=False),
    Column("region", "string", nullable=True),
    Column("amount", "decimal(10,2)"),
    Column("note", "string"),
)


def test_single_not_null_key_uses_equality() -> None:
    plan = plan_merge(ORDERS, ["order_id"])
    assert plan.keys == ("order_id",)
    assert plan.match_condition == "t.`order_id` = s.`order_id`"


def test_nullable_key_uses_null_safe_equality() -> None:
    plan = plan_merge(ORDERS, ["order_id", "region"])
    assert plan.match_condition == "t.`order_id` = s.`order_id` AND t.`region` <=> s.`region`"


def test_plan_fields() -> None:
    plan = plan_merge(ORDERS, ["order_id"])
    assert plan.column_names == ("order_id", "region", "amount", "note")
    assert plan.change_filter == "`_change_type` <> 'update_preimage'"
    assert plan.delete_condition == "s.`__lm_op` = 'delete'"
    assert plan.upsert_condition == "s.`__lm_op` <> 'delete'"
    assert plan.assignments == {
        "`order_id`": "s.`order_id`", "`region`": "s.`region`",
        "`amount`": "s.`amount`", "`note`": "s.`note`",
    }
    assert plan.latest_expr == (
        "max_by(struct(`order_id` AS `order_id`, `region` AS `region`, `amount` AS `amount`, "
        "`note` AS `note`, `_change_type` AS `__lm_op`), "
        "struct(`_commit_version`, " + rank_sql() + "))"
    )


def test_rank_orders_delete_before_insert_and_postimage() -> None:
    assert rank_sql() == ("CASE `_change_type` WHEN 'delete' THEN 0 WHEN 'insert' THEN 1 "
                          "WHEN 'update_postimage' THEN 1 END")


def test_cdf_metadata_columns_never_reach_the_replica() -> None:
    cols = ORDERS + (Column("_change_type", "string"), Column("_commit_version", "bigint"),
                     Column("_commit_timestamp", "timestamp"))
    plan = plan_merge(cols, ["order_id"])
    assert plan.column_names == ("order_id", "region", "amount", "note")


def test_weird_column_names_are_quoted_everywhere() -> None:
    cols = (Column("k`ey", "int", nullable=False), Column("a.b c", "string"))
    plan = plan_merge(cols, ["k`ey"])
    assert plan.match_condition == "t.`k``ey` = s.`k``ey`"
    assert plan.assignments == {"`k``ey`": "s.`k``ey`", "`a.b c`": "s.`a.b c`"}
    assert "`a.b c` AS `a.b c`" in plan.latest_expr


@pytest.mark.parametrize("keys, fragment", [
    ([], "at least one key column"),
    (["order_id", "order_id"], "key columns repeat: ['order_id', 'order_id']"),
    (["missing"], "key column(s) ['missing'] are not in the source columns"),
    (["ORDER_ID"], "key column(s) ['ORDER_ID'] are not in the source columns"),
])
def test_key_errors(keys: list[str], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        plan_merge(ORDERS, keys)
    assert fragment in str(info.value)


# -- ColumnSelection -----------------------------------------------------------------------------

def test_include_keeps_only_named_columns_in_source_order() -> None:
    plan = plan_merge(ORDERS, ["order_id"], ColumnSelection(include=("note", "order_id")))
    assert plan.column_names == ("order_id", "note")
    assert set(plan.assignments) == {"`order_id`", "`note`"}


def test_exclude_drops_named_columns() -> None:
    plan = plan_merge(ORDERS, ["order_id"], ColumnSelection(exclude=("note", "amount")))
    assert plan.column_names == ("order_id", "region")
    assert "`note`" not in plan.latest_expr


def test_excluding_a_key_is_refused() -> None:
    with pytest.raises(ValueError, match="key column 'order_id' cannot be excluded"):
        plan_merge(ORDERS, ["order_id"], ColumnSelection(exclude=("order_id",)))


def test_include_without_the_key_is_refused() -> None:
    with pytest.raises(ValueError, match="key column 'order_id' cannot be excluded"):
        plan_merge(ORDERS, ["order_id"], ColumnSelection(include=("amount",)))


def test_selection_naming_an_unknown_column_is_refused() -> None:
    with pytest.raises(ValueError, match="column 'nope' named in include/exclude is not in the source"):
        plan_merge(ORDERS, ["order_id"], ColumnSelection(exclude=("nope",)))
    with pytest.raises(ValueError, match="column 'nope' named in include/exclude"):
        plan_merge(ORDERS, ["order_id"], ColumnSelection(include=("order_id", "nope")))


# -- diff_schema / add_columns_sql ---------------------------------------------------------------

def test_identical_schemas_give_an_empty_diff() -> None:
    diff = diff_schema(ORDERS, ORDERS)
    assert diff == SchemaDiff()
    assert diff.is_empty and diff.is_additive
    assert diff.describe() == "no change"


def test_added_column_is_additive() -> None:
    diff = diff_schema(ORDERS + (Column("email", "string"),), ORDERS)
    assert diff.added == (Column("email", "string"),)
    assert diff.dropped == () and diff.retyped == ()
    assert diff.is_additive and not diff.is_empty
    assert diff.describe() == "added email string"


def test_dropped_and_retyped_columns_are_not_additive() -> None:
    source = (Column("order_id", "bigint", False), Column("region", "int"), Column("amount", "decimal(10,2)"))
    diff = diff_schema(source, ORDERS)
    assert diff.added == ()
    assert diff.dropped == ("note",)
    assert diff.retyped == (("region", "string", "int"),)
    assert not diff.is_additive
    assert diff.describe() == "dropped note; retyped region string->int"


def test_names_and_types_compare_case_insensitively() -> None:
    replica = (Column("ORDER_ID", "BIGINT", False), Column("Region", "STRING"))
    source = (Column("order_id", "bigint", False), Column("region", "string"))
    assert diff_schema(source, replica).is_empty


def test_add_columns_sql_quotes_names() -> None:
    sql = add_columns_sql("`c`.`s`.`t`", [Column("we`ird col", "string"), Column("a.b", "int")])
    assert sql == "ALTER TABLE `c`.`s`.`t` ADD COLUMNS (`we``ird col` string, `a.b` int)"


def test_add_columns_sql_needs_columns() -> None:
    with pytest.raises(ValueError, match="no columns to add"):
        add_columns_sql("`c`.`s`.`t`", [])
