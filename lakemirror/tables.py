"""Where a table lives, and the few Delta I/O calls every layer shares.

A :class:`TableLocation` is either path-based (the embedded local lakehouse, where a three-part
name maps to ``<warehouse>/<catalog>/<schema>/<table>``) or catalog-managed (Unity Catalog on
Databricks, addressed by name). pyspark is imported lazily so pure modules may import the type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakemirror.delta_log.layout import LOG_DIR
from lakemirror.identifiers import TableName, quote
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pathlib import Path

    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame, DataFrameReader, SparkSession


@dataclass(frozen=True)
class TableLocation:
    name: TableName
    path: str | None = None  # set: a path-based Delta table; None: resolved by the catalog

    @property
    def sql(self) -> str:
        """How SQL text refers to the table (``delta.`/path``` or the quoted name)."""
        return f"delta.{quote(self.path)}" if self.path else self.name.sql

    def __str__(self) -> str:
        return str(self.name)


def has_own_jvm(spark: "SparkSession") -> bool:
    """Whether the session drives a JVM of its own process (local Spark, a Databricks job), where a
    streaming query's batch function runs in this Python process; under Spark Connect it runs on
    the server."""
    return getattr(spark, "_jvm", None) is not None


def own_session(spark: "SparkSession") -> "SparkSession":
    """A session of its own (confs, temp views) sharing ``spark``'s cluster: ``newSession`` with a
    JVM of its own; over Spark Connect, which has no ``newSession``, a new server-side session."""
    if has_own_jvm(spark) or not hasattr(spark, "client"):
        return spark.newSession()
    # A new server session on the same address (and token), like ``builder.remote(url).create()``.
    # Not ``cloneSession``: a foreachBatch query started in a clone failed to start its Python worker.
    from pyspark.sql import SparkSession

    channel = spark.client._builder  # noqa: SLF001 (the address the session was made with)
    params = "".join(f";{k}={v}" for k, v in channel._params.items() if k != "session_id")  # noqa: SLF001
    return SparkSession.builder.remote(f"sc://{channel.url.netloc}/{params}").create()  # type: ignore[attr-defined,no-any-return]


def release_session(session: "SparkSession", parent: "SparkSession") -> None:
    """Give back a session :func:`own_session` made from ``parent`` once its work is done. Over
    Spark Connect it is a session of the server's, holding state there until released; a session
    with a JVM of its own (``newSession``) holds nothing worth releasing. A Connect server this
    process started itself (``remote("local")``) would stop with the session: it is left alone."""
    import os

    if session is parent or has_own_jvm(session) or not hasattr(session, "client"):
        return
    if "SPARK_LOCAL_REMOTE" in os.environ:
        return
    session.stop()


def reader(spark: "SparkSession", loc: TableLocation, **options: Any) -> "DataFrameReader":
    r = spark.read.format("delta")
    for k, v in options.items():
        r = r.option(k, v)
    return r


def read(spark: "SparkSession", loc: TableLocation, **options: Any) -> "DataFrame":
    r = reader(spark, loc, **options)
    return r.load(loc.path) if loc.path else r.table(str(loc.name.sql))


def read_stream(spark: "SparkSession", loc: TableLocation, **options: Any) -> "DataFrame":
    r = spark.readStream.format("delta")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(loc.path) if loc.path else r.table(loc.name.sql)


def delta_table(spark: "SparkSession", loc: TableLocation) -> "DeltaTable":
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, loc.path) if loc.path else DeltaTable.forName(spark, loc.name.sql)


def exists(spark: "SparkSession", loc: TableLocation) -> bool:
    """Whether the Delta table is there. Without a JVM of its own (Spark Connect, where Delta's
    Python API needs the Connect plugin that Maven Central does not serve) a path is asked by SQL."""
    if loc.path and not has_own_jvm(spark):
        try:
            run_sql(spark, f"DESCRIBE DETAIL {loc.sql}").collect()
        except Exception as exc:  # noqa: BLE001 (only "no Delta table there" means False)
            text = str(exc)
            if any(m in text for m in ("DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_NOT_FOUND", "PATH_NOT_FOUND",
                                       "is not a Delta table", "doesn't exist", "does not exist")):
                return False
            raise
        return True
    if loc.path:
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(spark, loc.path))
    return bool(spark.catalog.tableExists(loc.name.sql))


def history(spark: "SparkSession", loc: TableLocation, limit: int | None = None) -> "DataFrame":
    """The table's commits, newest first (``DESCRIBE HISTORY``'s columns): Delta's Python API in a
    session with its own JVM, the SQL statement over Spark Connect (no Delta plugin there)."""
    if has_own_jvm(spark):
        table = delta_table(spark, loc)
        return table.history(limit) if limit is not None else table.history()
    return run_sql(spark, f"DESCRIBE HISTORY {loc.sql}" + (f" LIMIT {int(limit)}" if limit is not None else ""))


def latest_version(spark: "SparkSession", loc: TableLocation) -> int:
    """The table's newest version (the first row of :func:`history`, so it works over Spark
    Connect too)."""
    return int(history(spark, loc, 1).select("version").collect()[0]["version"])


def write(df: "DataFrame", loc: TableLocation, mode: str, **options: Any) -> None:
    w = df.write.format("delta").mode(mode)
    for k, v in options.items():
        w = w.option(k, v)
    if loc.path:
        w.save(loc.path)
    else:
        w.saveAsTable(loc.name.sql)


#: How many of a table's newest commits are searched first for a tagged commit (a replayed batch's
#: commit is almost always among them); only when it is not there is the whole history read.
RECENT_COMMITS = 100


def tagged_commits(spark: "SparkSession", loc: TableLocation, user_metadata: str, *columns: str) -> list[Any]:
    """Rows (``userMetadata`` and ``columns``) of the commits whose ``userMetadata`` is
    ``user_metadata``, newest first."""
    recent = history(spark, loc, RECENT_COMMITS).select("userMetadata", *columns).collect()
    found = [r for r in recent if r["userMetadata"] == user_metadata]
    if found or len(recent) < RECENT_COMMITS:
        return found
    quoted = user_metadata.replace("'", "''")
    return history(spark, loc).where(f"userMetadata = '{quoted}'").select("userMetadata", *columns).collect()


def is_local_path(location: str) -> bool:
    """Whether ``location`` is on the driver's own file system (a plain path or ``file:``)."""
    from urllib.parse import urlparse

    return urlparse(location).scheme in ("", "file")


def local_dir(location: str) -> "Path | None":
    """``location`` as a directory of the driver's own file system; None when it is elsewhere."""
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    if not is_local_path(location):
        return None
    parsed = urlparse(location)
    return Path(unquote(parsed.path) if parsed.scheme else location)


def is_local_table(location: str) -> bool:
    """Whether a Delta table's location is a directory this (the driver's) process can see."""
    path = local_dir(location)
    return path is not None and (path / LOG_DIR).is_dir()
