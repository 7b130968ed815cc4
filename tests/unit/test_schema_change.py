"""How a table's columns changed, as a relaunch for a schema change says it."""

from __future__ import annotations

from lakemirror.schema import Column, schema_change

BEFORE = (Column("id", "bigint", False), Column("v", "string"), Column("n", "int"))


def test_the_same_columns_are_no_change() -> None:
    assert schema_change(BEFORE, tuple(BEFORE)) is None
    assert schema_change((), ()) is None


def test_each_kind_of_change_is_named() -> None:
    after = (Column("id", "bigint", True), Column("v", "string"), Column("n", "bigint"), Column("note", "string"))
    assert schema_change(BEFORE, after) == "added note; id is now nullable; n int is now bigint"
    assert schema_change(BEFORE, BEFORE[:2]) == "dropped n"
    assert schema_change(BEFORE, (BEFORE[0], Column("v", "string", False), BEFORE[2])) == "v is now NOT NULL"


def test_a_new_order_alone_is_a_change() -> None:
    assert schema_change(BEFORE, (BEFORE[1], BEFORE[0], BEFORE[2])) == "columns reordered"
