"""A source described from its log by delta-rs on the driver (no Spark): its id, its columns typed as
Spark names them, its properties and the key they declare; None where there is no table."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sources.catalog import LocalCatalog
from lakemirror.sources.log_description import describe_from_log

NO_SPARK: object = object()  # a local path is read without the session


def test_a_local_table_is_described_from_its_latest_metadata(tmp_path: Path) -> None:
    path = tmp_path / "src" / "sales" / "orders"
    first = pa.table({"a": pa.array([1], pa.int64()), "b": pa.array(["x"], pa.string())})
    write_deltalake(str(path), first, configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(path)).alter.set_table_properties({"lakemirror.primaryKey": "a, b"}, raise_if_not_exists=False)
    wider = first.append_column("c", pa.array([1.5], pa.float64()))
    write_deltalake(str(path), wider, mode="append", schema_mode="merge")

    info = LocalCatalog(tmp_path).describe(NO_SPARK, TableName("src", "sales", "orders"))  # type: ignore[arg-type]

    assert info.table_id == DeltaTable(str(path)).metadata().id
    assert info.columns == (Column("a", "bigint", True), Column("b", "string", True), Column("c", "double", True))
    assert info.cdf_enabled and info.declared_key == ("a", "b")
    assert info.properties["lakemirror.primaryKey"] == "a, b"
    logged = describe_from_log(NO_SPARK, str(path))  # type: ignore[arg-type]
    assert logged is not None and logged.version == 2


def test_no_table_there_is_no_description(tmp_path: Path) -> None:
    assert describe_from_log(NO_SPARK, str(tmp_path / "nothing")) is None  # type: ignore[arg-type]
    (tmp_path / "empty" / "_delta_log").mkdir(parents=True)
    assert describe_from_log(NO_SPARK, str(tmp_path / "empty")) is None  # type: ignore[arg-type]
    assert describe_from_log(NO_SPARK, None) is None  # type: ignore[arg-type]
