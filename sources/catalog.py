"""Catalog introspection: list a schema's tables, locate them, describe them.

Two implementations of one :class:`Catalog` protocol:

- :class:`LocalCatalog`, the embedded default: a lakehouse under one warehouse directory, local or
  on object storage (``s3a://bucket/lakehouse``). ``prod.orders.order_items`` lives at
  ``<warehouse>/prod/orders/order_items`` as a path-based Delta table, so configs written for
  Unity Catalog read the same locally. A primary key is
  declared with the table property ``lakemirror.primaryKey``.
- :class:`UnityCatalog`, on Databricks: tables by name, keys from PRIMARY KEY constraints, and
  the backing tables of Streaming Tables (:meth:`UnityCatalog.backing_table`).

What ``lakemirror replicate`` plans its work over is a :class:`Discovery`: the schemas and tables of
a source catalog, read through either catalog by :class:`SparkDiscovery`, or given as data by its
twin :class:`InMemoryDiscovery`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from lakemirror import tables
from lakemirror.delta_log.layout import LOG_DIR
from lakemirror.errors import TerminalError
from lakemirror.identifiers import TableName, quote, sql_string
from lakemirror.schema import Column, columns_from_struct
from lakemirror.sources.keys import PRIMARY_KEY_PROPERTY, parse_declared
from lakemirror.sources.log_description import describe_from_log
from lakemirror.sources.streaming_tables import SqlRunner, resolve_backing_table
from lakemirror.sql_exec import run_sql
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CDF_PROPERTY = "delta.enableChangeDataFeed"


def enable_change_feed_sql(location: TableLocation) -> str:
    """The statement that turns a table's change data feed on (what a refusal tells a person to run)."""
    return f"ALTER TABLE {location.sql} SET TBLPROPERTIES ('{CDF_PROPERTY}' = 'true')"


@dataclass(frozen=True)
class TableInfo:
    location: TableLocation
    table_id: str | None
    columns: tuple[Column, ...]
    properties: dict[str, str] = field(default_factory=dict)
    declared_key: tuple[str, ...] = ()

    @property
    def cdf_enabled(self) -> bool:
        return self.properties.get(CDF_PROPERTY, "false").lower() == "true"


class TableMissing(TerminalError):
    code = "table_missing"


class Catalog(Protocol):
    def locate(self, name: TableName) -> TableLocation: ...
    def list_tables(self, spark: "SparkSession", catalog: str, schema: str) -> list[TableName]: ...
    def describe(self, spark: "SparkSession", name: TableName) -> TableInfo: ...
    def ensure_schema(self, spark: "SparkSession", catalog: str, schema: str) -> None: ...


def _detail(spark: "SparkSession", loc: TableLocation) -> tuple[str | None, dict[str, str]]:
    row = run_sql(spark, f"DESCRIBE DETAIL {loc.sql}").collect()[0]
    return row["id"], dict(row["properties"] or {})


def table_id(spark: "SparkSession", loc: TableLocation) -> str | None:
    """The Delta table id (``metaData.id``) as the log says now: it changes when a table is
    dropped and recreated.

    A path-based table's id comes from Delta Kernel's snapshot of its log, read in the driver, or
    else from Delta's own snapshot, brought up to date: a Spark job over the commits since the
    last checkpoint where the writer left no checksum files, paid on every batch where the stream
    does not keep that snapshot up to date itself (the Kernel-based source does not).
    ``DESCRIBE DETAIL`` (the way for tables known by name, and without a JVM) also counts the
    table's files, a log replay of its own after each commit of a table written without checksum
    files.
    """
    if loc.path is not None:
        found = _kernel_table_id(spark, loc.path) or _logged_table_id(spark, loc.path)
        if found is not None:
            return found
    return _detail(spark, loc)[0]


def _kernel_table_id(spark: "SparkSession", path: str) -> str | None:
    """The id in Delta Kernel's latest snapshot of the table at ``path`` (a listing of its log, and
    its protocol and metadata read from the last checkpoint and the commits since, in the driver);
    None where that cannot be read (no table there, no JVM, a feature Kernel does not read)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return None
    try:
        engine = jvm.io.delta.kernel.defaults.engine.DefaultEngine.create(spark._jsc.hadoopConfiguration())
        snapshot = jvm.io.delta.kernel.TableManager.loadSnapshot(path).build(engine)
        return str(snapshot.getMetadata().getId())
    except Exception:  # noqa: BLE001 (Delta's own snapshot or DESCRIBE DETAIL answers, or names the problem)
        return None


def _logged_table_id(spark: "SparkSession", path: str) -> str | None:
    """The id in Delta's updated snapshot of the table at ``path`` (a listing of its log, plus the
    protocol and metadata of new commits); None where that cannot be read (no table there, no JVM
    under Spark Connect, Delta's internals changed): ``DESCRIBE DETAIL`` then answers or raises."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return None
    try:
        none = jvm.scala.Option.empty()
        snapshot = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path).update(False, none, none)
        return str(snapshot.metadata().id()) if snapshot.version() >= 0 else None
    except Exception:  # noqa: BLE001 (DESCRIBE DETAIL reads it, or names the problem)
        return None


class LocalCatalog:
    """Path-based Delta tables under ``warehouse/<catalog>/<schema>/<table>``.

    ``warehouse`` is a local directory, or a URI of a file system Spark's Hadoop reads (such as
    ``s3a://bucket/lakehouse``): its folders are then listed through Hadoop's FileSystem, and
    :attr:`warehouse` stays the URI string."""

    def __init__(self, warehouse: str | Path) -> None:
        self.warehouse: Path | str = (Path(warehouse).resolve() if tables.is_local_path(str(warehouse))
                                      else str(warehouse).rstrip("/"))

    def _folder(self, *parts: str) -> str:
        if isinstance(self.warehouse, Path):
            return str(self.warehouse.joinpath(*parts))
        return "/".join((self.warehouse, *parts))

    def locate(self, name: TableName) -> TableLocation:
        return TableLocation(name, self._folder(name.catalog, name.schema, name.table))

    def list_folders(self, spark: "SparkSession", *parts: str) -> list[str]:
        """Names of the visible folders under ``warehouse/<parts>`` (none if it does not exist)."""
        if isinstance(self.warehouse, Path):
            folder = self.warehouse.joinpath(*parts)
            return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) \
                if folder.is_dir() else []
        from lakemirror.object_store import list_folders

        return [n for n in list_folders(spark, self._folder(*parts)) if not n.startswith(".")]

    def list_tables(self, spark: "SparkSession", catalog: str, schema: str) -> list[TableName]:
        if isinstance(self.warehouse, Path):
            folder = self.warehouse / catalog / schema
            if not folder.is_dir():
                return []
            return sorted(TableName(catalog, schema, p.name) for p in folder.iterdir()
                          if (p / LOG_DIR).is_dir() and not p.name.startswith("."))
        from lakemirror.object_store import list_folders

        return sorted(TableName(catalog, schema, name) for name in self.list_folders(spark, catalog, schema)
                      if LOG_DIR in list_folders(spark, self._folder(catalog, schema, name)))

    def describe(self, spark: "SparkSession", name: TableName) -> TableInfo:
        """The table's description, read from its log on the driver where delta-rs reads it
        (:mod:`lakemirror.sources.log_description`), else by Spark."""
        loc = self.locate(name)
        logged = describe_from_log(spark, loc.path)
        if logged is not None:
            return TableInfo(loc, logged.table_id, logged.columns, logged.properties,
                             parse_declared(logged.properties.get(PRIMARY_KEY_PROPERTY)))
        return self.describe_by_spark(spark, name)

    def describe_by_spark(self, spark: "SparkSession", name: TableName) -> TableInfo:
        """The table's description as Spark reads it: ``DESCRIBE DETAIL`` and the schema of a read."""
        loc = self.locate(name)
        if not tables.exists(spark, loc):
            raise TableMissing(f"table {name} does not exist (no Delta table at {loc.path})", table=str(name))
        table_id, props = _detail(spark, loc)
        columns = columns_from_struct(tables.read(spark, loc).schema)
        return TableInfo(loc, table_id, columns, props, parse_declared(props.get(PRIMARY_KEY_PROPERTY)))

    def ensure_schema(self, spark: "SparkSession", catalog: str, schema: str) -> None:
        if isinstance(self.warehouse, Path):  # object stores have no folders to create
            (self.warehouse / catalog / schema).mkdir(parents=True, exist_ok=True)


class UnityCatalog:
    """Tables addressed by three-part name in the session's catalog (Databricks Unity Catalog)."""

    def locate(self, name: TableName) -> TableLocation:
        return TableLocation(name, None)

    def list_tables(self, spark: "SparkSession", catalog: str, schema: str) -> list[TableName]:
        rows = run_sql(spark, f"SHOW TABLES IN {quote(catalog)}.{quote(schema)}").collect()
        return sorted(TableName(catalog, schema, r["tableName"]) for r in rows if not r["isTemporary"])

    def declared_key(self, spark: "SparkSession", name: TableName) -> tuple[str, ...]:
        info = f"{quote(name.catalog)}.information_schema"
        rows = run_sql(spark, 
            f"SELECT k.column_name FROM {info}.table_constraints c "
            f"JOIN {info}.key_column_usage k ON c.constraint_catalog = k.constraint_catalog "
            f"AND c.constraint_schema = k.constraint_schema AND c.constraint_name = k.constraint_name "
            f"WHERE c.constraint_type = 'PRIMARY KEY' AND c.table_schema = {sql_string(name.schema)} "
            f"AND c.table_name = {sql_string(name.table)} ORDER BY k.ordinal_position"
        ).collect()
        return tuple(r["column_name"] for r in rows)

    def describe(self, spark: "SparkSession", name: TableName) -> TableInfo:
        loc = self.locate(name)
        if not tables.exists(spark, loc):
            raise TableMissing(f"table {name} does not exist or is not visible to this principal", table=str(name))
        table_id, props = _detail(spark, loc)
        columns = columns_from_struct(spark.table(name.sql).schema)
        declared = self.declared_key(spark, name) or parse_declared(props.get(PRIMARY_KEY_PROPERTY))
        return TableInfo(loc, table_id, columns, props, declared)

    def ensure_schema(self, spark: "SparkSession", catalog: str, schema: str) -> None:
        run_sql(spark, f"CREATE SCHEMA IF NOT EXISTS {quote(catalog)}.{quote(schema)}")

    @staticmethod
    def backing_table(sql: "SqlRunner", name: TableName) -> TableName:
        """The Delta table holding ``name``'s data: ``name`` itself, or for a Streaming Table (or
        materialized view) of a declarative pipeline its backing table in ``__databricks_internal``
        (see :mod:`lakemirror.sources.streaming_tables`)."""
        return resolve_backing_table(sql, name)


class Discovery(Protocol):
    def list_schemas(self, catalog: str) -> list[str]: ...
    def list_tables(self, catalog: str, schema: str) -> list[str]: ...


def volume_path(name: TableName) -> str:
    """Where Databricks compute reads and writes the files of the Unity Catalog volume ``name``."""
    return f"/Volumes/{name.catalog}/{name.schema}/{name.table}"


class InMemoryDiscovery:
    """The twin: ``{catalog: {schema: [tables]}}``, and ``volumes`` the same way."""

    def __init__(self, tree: Mapping[str, Mapping[str, Sequence[str]]],
                 volumes: Mapping[str, Mapping[str, Sequence[str]]] | None = None) -> None:
        self.tree = tree
        self.volumes = volumes or {}

    def list_volumes(self, catalog: str, schema: str) -> list[str]:
        return sorted(self.volumes.get(catalog, {}).get(schema, ()))

    def list_schemas(self, catalog: str) -> list[str]:
        return sorted(self.tree.get(catalog, {}))

    def list_tables(self, catalog: str, schema: str) -> list[str]:
        return sorted(self.tree.get(catalog, {}).get(schema, ()))


class SparkDiscovery:
    """Schemas and tables of a source catalog, local lakehouse or Unity Catalog."""

    def __init__(self, spark: "SparkSession", catalog: Catalog) -> None:
        self.spark = spark
        self.catalog = catalog

    def list_schemas(self, catalog: str) -> list[str]:
        if isinstance(self.catalog, LocalCatalog):
            return self.catalog.list_folders(self.spark, catalog)
        rows = run_sql(self.spark, f"SHOW SCHEMAS IN {quote(catalog)}").collect()
        return sorted(r[0] for r in rows)

    def list_tables(self, catalog: str, schema: str) -> list[str]:
        return [t.table for t in self.catalog.list_tables(self.spark, catalog, schema)]

    def list_volumes(self, catalog: str, schema: str) -> list[str]:
        """The Unity Catalog volumes of a schema; none in a local lakehouse (its directories are
        copied as ``volumes`` entries of the file instead)."""
        if isinstance(self.catalog, LocalCatalog):
            return []
        rows = run_sql(self.spark, f"SHOW VOLUMES IN {quote(catalog)}.{quote(schema)}").collect()
        return sorted(str(r["volume_name"]) for r in rows)
