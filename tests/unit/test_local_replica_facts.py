"""A local replica read by delta-rs: Spark's names of its types and features (pure), and its facts
where delta-rs can tell them exactly (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from lakemirror.delta_log.protocol import protocol_features
from lakemirror.schema import Column, columns_from_delta_schema, spark_type_name
from lakemirror.sinks.merge.local_replica import LocalReplica


def test_delta_type_names_become_sparks() -> None:
    assert [spark_type_name(t) for t in ("long", "integer", "short", "byte", "string", "decimal(10,2)",
                                         "timestamp_ntz", "date", "binary")] == [
        "bigint", "int", "smallint", "tinyint", "string", "decimal(10,2)", "timestamp_ntz", "date", "binary"]
    nested = {"type": "map", "keyType": "string", "valueType": {"type": "array", "containsNull": True, "elementType": {
        "type": "struct", "fields": [{"name": "a b", "type": "long", "nullable": True, "metadata": {}},
                                     {"name": "c", "type": "double", "nullable": False, "metadata": {}}]}},
              "valueContainsNull": True}
    assert spark_type_name(nested) == "map<string,array<struct<a b:bigint,c:double>>>"
    with pytest.raises(ValueError):
        spark_type_name({"type": "udt"})
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": False, "metadata": {}},
                                           {"name": "v", "type": "string", "nullable": True, "metadata": {}}]}
    assert columns_from_delta_schema(schema) == (Column("id", "bigint", False), Column("v", "string", True))


def test_features_as_spark_lists_them() -> None:
    assert protocol_features(1, 2, None, None) == ("appendOnly", "invariants")
    assert protocol_features(1, 4, None, None) == ("appendOnly", "changeDataFeed", "checkConstraints",
                                                   "generatedColumns", "invariants")
    assert "columnMapping" in (protocol_features(2, 5, None, None) or ())
    assert "columnMapping" not in (protocol_features(1, 6, None, None) or ())
    assert protocol_features(3, 7, ["deletionVectors"], ["deletionVectors", "appendOnly"]) == (
        "appendOnly", "deletionVectors")
    assert protocol_features(1, 7, None, ["changeDataFeed", "appendOnly"]) == ("appendOnly", "changeDataFeed"), \
        "a protocol that names features implies none"


def test_a_local_replica_written_by_delta_rs_has_its_facts_read_from_its_log(tmp_path: Path) -> None:
    path = tmp_path / "replica"
    write_deltalake(str(path), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}),
                    configuration={"delta.logRetentionDuration": "interval 30 days"})
    write_deltalake(str(path), pa.table({"id": pa.array([4], pa.int64()), "v": ["d"]}), mode="append")
    local = LocalReplica.open(str(path))
    assert local is not None
    facts = local.facts(observable=True)
    assert facts is not None
    assert (facts.rows, facts.columns, facts.local, facts.driver_engine) == (4, ("id", "v"), True, True)
    assert facts.properties == {"delta.logRetentionDuration": "interval 30 days"} and facts.features == ("appendOnly", "invariants")
    assert facts.size_bytes == sum(f.stat().st_size for f in path.glob("*.parquet"))
    assert local.columns() == (Column("id", "bigint", True), Column("v", "string", True))


def test_a_replica_elsewhere_or_missing_is_not_read_here(tmp_path: Path) -> None:
    assert LocalReplica.open(None) is None
    assert LocalReplica.open("s3a://bucket/replica") is None
    assert LocalReplica.open(str(tmp_path / "none")) is None
    (tmp_path / "bad" / "_delta_log").mkdir(parents=True)
    (tmp_path / "bad" / "_delta_log" / "00000000000000000000.json").write_text(json.dumps({"nonsense": 1}))
    assert LocalReplica.open(str(tmp_path / "bad")) is None, "a log delta-rs cannot read: Spark reads it"
