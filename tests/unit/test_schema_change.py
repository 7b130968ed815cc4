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


def test_a_change_stream_with_a_column_the_launch_did_not_plan_relaunches_the_table() -> None:
    """The stream's own columns (its change-feed columns aside) against the launch's: a column added
    after the launch described the source would be in every batch and written by no plan."""
    import pytest

    from lakemirror.errors import SchemaChangeRestart
    from lakemirror.supervisor.change_feed.stream_wiring import require_stream_columns

    feed = ["_change_type", "_commit_version", "_commit_timestamp"]
    require_stream_columns("s.t", ["id", "v", "n", *feed], BEFORE)  # the same columns, in any order
    require_stream_columns("s.t", ["n", "id", "v", *feed], BEFORE)
    require_stream_columns("s.t", ["anything", *feed], ())  # nothing planned yet: nothing to compare
    with pytest.raises(SchemaChangeRestart, match=r"s\.t: the source's schema changed since the table's launch "
                                                  r"\(added note\); restarting the stream") as added:
        require_stream_columns("s.t", ["id", "v", "n", "note", *feed], BEFORE)
    assert added.value.table == "s.t"
    with pytest.raises(SchemaChangeRestart, match=r"\(added note; dropped n\)"):
        require_stream_columns("s.t", ["id", "v", "note", *feed], BEFORE)
