"""The metadata planner (pure) and the sync executor against a recording SQL executor."""

from __future__ import annotations

import pytest

from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.metadata_sync import (
    MetadataSync, Overwrite, TableMetadata, parse_describe_columns, plan_table_metadata,
)
from lakemirror.sinks.sql import RecordingSql
from lakemirror.tables import TableLocation

ALL = ["table_comment", "column_comment", "table_property", "table_tag", "column_tag"]


def test_comments_properties_and_tags_are_quoted_and_escaped():
    src = TableMetadata(comment="it's a `tick` \\ table", column_comments={"A`b": "col's"},
                        properties={"team": "o'hara", "delta.appendOnly": "true", "lakemirror.epoch": "3"},
                        tags={"pii": "yes"}, column_tags={"A`b": {"class": "x'y"}})
    dst = TableMetadata(column_comments={"a`B": None})
    assert plan_table_metadata("`c`.`s`.`t`", src, dst, ALL) == [
        "COMMENT ON TABLE `c`.`s`.`t` IS 'it\\'s a `tick` \\\\ table'",
        "ALTER TABLE `c`.`s`.`t` ALTER COLUMN `a``B` COMMENT 'col\\'s'",
        "ALTER TABLE `c`.`s`.`t` SET TBLPROPERTIES ('team' = 'o\\'hara')",
        "ALTER TABLE `c`.`s`.`t` SET TAGS ('pii' = 'yes')",
        "ALTER TABLE `c`.`s`.`t` ALTER COLUMN `a``B` SET TAGS ('class' = 'x\\'y')",
    ]


def test_overwrite_flags_keep_existing_values():
    src = TableMetadata(comment="new", properties={"a": "1", "b": "2"}, tags={"t": "1", "u": "2"})
    dst = TableMetadata(comment="old", properties={"a": "0"}, tags={"t": "0"})
    keep = Overwrite(comments=False, properties=False, tags=False)
    assert plan_table_metadata("t", src, dst, ALL, keep) == [
        "ALTER TABLE t SET TBLPROPERTIES ('b' = '2')", "ALTER TABLE t SET TAGS ('u' = '2')"]
    assert plan_table_metadata("t", src, dst, ALL)[0] == "COMMENT ON TABLE t IS 'new'"
    assert plan_table_metadata("t", src, src, ALL) == []


def test_object_types_select_and_validate():
    src = TableMetadata(comment="c", properties={"a": "1"})
    assert plan_table_metadata("t", src, TableMetadata(), ["table_property"]) == ["ALTER TABLE t SET TBLPROPERTIES ('a' = '1')"]
    with pytest.raises(ValueError):
        plan_table_metadata("t", src, TableMetadata(), ["bogus"])


def test_describe_parsing_stops_at_sections():
    rows = [{"col_name": "id", "data_type": "int", "comment": None},
            {"col_name": "x", "data_type": "string", "comment": "hi"},
            {"col_name": "", "data_type": "", "comment": ""},
            {"col_name": "# Partitioning", "data_type": "", "comment": ""}]
    assert parse_describe_columns(rows) == {"id": None, "x": "hi"}


def test_unity_catalog_tags_read_from_information_schema_and_set():
    def tags(stmt):
        return [{"tag_name": "owner", "tag_value": "data's"}] if "`prod`" in stmt else []

    fake = RecordingSql({"DESCRIBE DETAIL": [{"description": None, "properties": {}}],
                         "DESCRIBE TABLE": [], "SELECT tag_name": tags, "SELECT volume_name": lambda s: (
                             [{"volume_name": "raw", "tag_name": "k", "tag_value": "v"}] if "`prod`" in s else [])})
    sync = MetadataSync(fake, unity_catalog=True)
    src, dst = TableName("prod", "sales", "orders"), TableName("dr", "sales", "orders")
    out = sync.sync_table(TableLocation(src), TableLocation(dst), ["table_tag"])
    assert out.statements == ("ALTER TABLE `dr`.`sales`.`orders` SET TAGS ('owner' = 'data\\'s')",)
    assert ("SELECT tag_name, tag_value FROM `prod`.information_schema.table_tags "
            "WHERE schema_name = 'sales' AND table_name = 'orders'") in fake.statements
    container = sync.sync_container_tags(src, dst, ["catalog_tag", "schema_tag", "volume_tag"])
    assert container == ["ALTER CATALOG `dr` SET TAGS ('owner' = 'data\\'s')",
                         "ALTER SCHEMA `dr`.`sales` SET TAGS ('owner' = 'data\\'s')",
                         "ALTER VOLUME `dr`.`sales`.`raw` SET TAGS ('k' = 'v')"]
    assert fake.statements[-1] == container[-1]


def test_tags_are_skipped_off_unity_catalog():
    fake = RecordingSql({"DESCRIBE DETAIL": [{"description": None, "properties": {}}]})
    sync = MetadataSync(fake, unity_catalog=False)
    loc = TableLocation(TableName("a", "b", "c"), "/tmp/x")
    assert sync.sync_table(loc, loc, ["table_tag", "column_tag"]).statements == ()
    assert not any("information_schema" in s for s in fake.statements)
