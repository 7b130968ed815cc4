"""Writing a replica from a source snapshot (the bootstrap's copy step) and replica DDL.

The one-shot snapshot write replaces the replica atomically (one Delta commit with
``overwriteSchema``), so a bootstrap killed half-way is simply redone at the same pinned version.
A chunked bootstrap (:mod:`lakemirror.sinks.batch.chunked_bootstrap`) writes the snapshot as one
commit per chunk (:func:`write_chunk`), each under a Delta transaction id of its own, so a killed
bootstrap resumes at the first chunk the replica's transaction records do not name.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Mapping, Sequence

from lakemirror import tables
from lakemirror.identifiers import sql_string
from lakemirror.schema import Column, columns_from_struct
from lakemirror.sinks.merge.apply_choice import ReplicaFacts
from lakemirror.sinks.merge.delta_merge import observed_metrics
from lakemirror.sinks.merge.planner import add_columns_sql
from lakemirror.sinks.txn import TxnId
from lakemirror.tables import TableLocation
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Table properties lakemirror sets on every replica it creates.
PIPELINE_PROPERTY = "lakemirror.pipelineId"
SOURCE_PROPERTY = "lakemirror.source"
EPOCH_PROPERTY = "lakemirror.epoch"
BOOTSTRAP_VERSION_PROPERTY = "lakemirror.bootstrapVersion"
#: The Delta table feature that lets column names hold characters Parquet cannot (spaces, commas…).
COLUMN_MAPPING_PROPERTY = "delta.columnMapping.mode"


def creation_options(source_properties: Mapping[str, str]) -> dict[str, str]:
    """Writer options for a replica of a source with these properties.

    A source with column mapping may have column names Parquet cannot hold (``' ,;{}()\\n\\t='``),
    now or after a later ADD COLUMNS, so its replica is created with column mapping too (by name:
    physical names are the replica's own business)."""
    mode = (source_properties.get(COLUMN_MAPPING_PROPERTY) or "none").lower()
    return {COLUMN_MAPPING_PROPERTY: "name"} if mode in ("name", "id") else {}


def write_snapshot(snapshot: "DataFrame", target: TableLocation, columns: Sequence[Column],
                   properties: Mapping[str, str], source_properties: Mapping[str, str] | None = None) -> None:
    """Replace ``target`` with ``snapshot``'s ``columns``, then stamp the replica's properties."""
    projected = snapshot.select(*[f"`{c.name.replace('`', '``')}`" for c in columns])
    tables.write(projected, target, "overwrite", overwriteSchema="true", **creation_options(source_properties or {}))
    set_properties(snapshot.sparkSession, target, properties)


def set_properties(spark: "SparkSession", target: TableLocation, properties: Mapping[str, str]) -> None:
    if not properties:
        return
    pairs = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in sorted(properties.items()))
    run_sql(spark, f"ALTER TABLE {target.sql} SET TBLPROPERTIES ({pairs})")


def replica_columns(spark: "SparkSession", target: TableLocation) -> tuple[Column, ...]:
    return columns_from_struct(tables.read(spark, target).schema)


def replica_properties(spark: "SparkSession", target: TableLocation) -> dict[str, str]:
    row = run_sql(spark, f"DESCRIBE DETAIL {target.sql}").collect()[0]
    return dict(row["properties"] or {})


def replica_facts(spark: "SparkSession", target: TableLocation) -> ReplicaFacts:
    """What choosing how batches reach a replica needs to know of it (one DESCRIBE DETAIL and a
    row count, which Delta answers from file statistics), and whether the driver's delta-rs reaches
    it (:func:`lakemirror.object_store.delta_rs_unreachable`)."""
    import importlib.util

    from lakemirror.object_store import delta_rs_unreachable, is_s3a, session_s3a_conf

    detail = run_sql(spark, f"DESCRIBE DETAIL {target.sql}").collect()[0].asDict()
    replica = tables.read(spark, target)
    features = detail.get("tableFeatures")
    local = target.path is not None and tables.is_local_table(str(detail.get("location") or ""))
    on_s3 = target.path is not None and is_s3a(target.path)
    hadoop = session_s3a_conf(spark) if on_s3 else {}
    unreachable = None if local else delta_rs_unreachable(target.path, hadoop, own_jvm=tables.has_own_jvm(spark))
    if not local and unreachable is None and not on_s3:
        unreachable = "the replica is not a directory of the driver's file system"
    return ReplicaFacts(size_bytes=int(detail["sizeInBytes"] or 0), rows=replica.count(),
                        columns=tuple(replica.columns), properties=dict(detail["properties"] or {}),
                        observable=hasattr(spark, "_jsparkSession"),  # classic PySpark, not Spark Connect
                        local=local, object_store=not local and unreachable is None,
                        unreachable=unreachable or "",
                        features=tuple(features) if features is not None else None,
                        driver_engine=importlib.util.find_spec("deltalake") is not None)


def add_columns(spark: "SparkSession", target: TableLocation, added: Sequence[Column]) -> None:
    run_sql(spark, add_columns_sql(target.sql, added))


# -- chunked bootstrap (lakemirror.sinks.batch.chunked_bootstrap) -----------------------------------


def write_chunk(chunk: "DataFrame", target: TableLocation, columns: Sequence[Column], txn: TxnId, *, first: bool,
                source_properties: Mapping[str, str] | None = None) -> int | None:
    """Commit one bootstrap chunk to ``target`` under the Delta transaction ``txn``; the rows it
    wrote, counted while it wrote them where the session can observe a write (a JVM of its own),
    else None (:func:`committed_rows` reads them from the commit).

    The first chunk replaces the replica (``overwriteSchema``, as the one-shot copy does); the others
    append. Delta skips the write when ``txn`` is already recorded in the replica: a chunk is never
    written twice (and nothing is counted)."""
    projected = chunk.select(*[f"`{c.name.replace('`', '``')}`" for c in columns])
    options = {"txnAppId": txn.app_id, "txnVersion": str(txn.version), "userMetadata": txn.tag()}
    if first:
        return write_counted(projected, target, "overwrite", overwriteSchema="true", **options,
                             **creation_options(source_properties or {}))
    return write_counted(projected, target, "append", **options)


def write_counted(df: "DataFrame", target: TableLocation, mode: str, **options: str) -> int | None:
    """Write ``df`` to ``target``; the rows written, counted while they are written where the
    session can observe a write (a JVM of its own), else None. A write Delta skips as a replay
    counts nothing (None)."""
    observation = None
    if tables.has_own_jvm(df.sparkSession):
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        observation = Observation(f"lakemirror_write_{uuid.uuid4().hex}")
        df = df.observe(observation, F.count(F.lit(1)).alias("n"))
    tables.write(df, target, mode, **options)
    observed = None if observation is None else observed_metrics(observation)
    return None if observed is None else int(observed["n"])


def committed_rows(spark: "SparkSession", target: TableLocation, tags: set[str],
                   recent: int | None = None) -> dict[str, int]:
    """The rows each commit of ``target`` tagged with one of ``tags`` (its ``userMetadata``) wrote,
    as its ``numOutputRows`` says; among the ``recent`` newest commits, or all of them."""
    out: dict[str, int] = {}
    for row in tables.history(spark, target, recent).select("userMetadata", "operationMetrics").collect():
        rows = (row["operationMetrics"] or {}).get("numOutputRows")
        if row["userMetadata"] in tags and row["userMetadata"] not in out and rows is not None:
            out[row["userMetadata"]] = int(rows)
    return out


def recorded_transactions(spark: "SparkSession", target: TableLocation, app_ids: Sequence[str]) -> dict[str, int]:
    """Which of ``app_ids`` the replica's log records, with their versions (public APIs only).

    A replica on the driver's file system is asked through delta-rs (``transaction_version``: the
    ``txn`` actions, which survive log cleanup in checkpoints); elsewhere (object storage, Spark
    Connect) through ``DESCRIBE HISTORY`` and the tags the writes carry in ``userMetadata``. History
    is cleaned after ``delta.logRetentionDuration``: a chunk committed before that is not seen here,
    and its rewrite is then skipped by Delta itself (the same ``txnAppId``/``txnVersion``), so a
    chunk is still never written twice."""
    if not tables.exists(spark, target):
        return {}
    wanted = set(app_ids)
    location = target.path
    if location is not None and tables.is_local_table(location):
        from deltalake import DeltaTable

        folder = tables.local_dir(location)
        replica = DeltaTable(str(folder))
        found = {app: replica.transaction_version(app) for app in wanted}
        return {app: int(v) for app, v in found.items() if v is not None}
    out: dict[str, int] = {}
    for row in run_sql(spark, f"DESCRIBE HISTORY {target.sql}").select("userMetadata").collect():
        meta = row["userMetadata"]
        if meta and '"lakemirror_txn"' in meta:
            tag = json.loads(meta)
            app = tag["lakemirror_txn"]
            if app in wanted:
                out[app] = max(out.get(app, -1), int(tag["batch"]))
    return out


def drop_path_table(spark: "SparkSession", path: str) -> None:
    """Delete the Delta table at ``path`` (a bootstrap's change log) and its folder: on the
    driver's file system directly, elsewhere through Hadoop's public FileSystem API where the
    session has a JVM of its own; over Spark Connect it is left (keys only, small)."""
    import shutil

    folder = tables.local_dir(path)
    if folder is not None:
        if folder.is_dir():
            shutil.rmtree(folder)
        return
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    if fs.exists(hpath):
        fs.delete(hpath, True)
