"""The recipe a user writes instead of lakemirror: one always-on change-feed stream per table.

    .venv/bin/python -m bench.recipe CONFIG.json        # runs until SIGTERM, then stops its queries

This is the job the production workload (bench/production.py) runs beside lakemirror, in a process
and JVM of its own as a user would run it, written the way a competent user writes it from Delta's
documentation (and the shape of a streaming-CDC recipe: a processor that starts one query per
table, keeps each key's latest change in ``foreachBatch`` and MERGEs it into the target):

- each table's change feed is read by Delta's streaming source (``readChangeFeed``), with no
  ``startingVersion``: the first batch is the table as it is at the start (every row an insert),
  the next ones its changes, so the stream bootstraps the target itself;
- ``foreachBatch`` keeps the last change per key (the highest ``_commit_version``; inside one
  version a delete ranks before an insert; ``update_preimage`` rows dropped) and applies it by one
  ``MERGE`` (delete, update every column, insert), under Delta's idempotent-write confs
  ``spark.databricks.delta.write.txnAppId`` (one per table) and ``txnVersion`` (the batch id), set
  on the batch's own session (each query runs in a clone of the session, so one table's confs
  never reach another) and unset after: a batch replayed after a crash is skipped by Delta;
- the target is created empty with the source's schema when it does not exist;
- Spark's and Delta's defaults otherwise (shuffle partitions, adaptive execution, the FIFO
  scheduler, Delta's snapshot partitions, the rate limits of Delta's source), with the trigger
  interval and the session's resources (master, driver memory) lakemirror gets in the same run.
  The Spark UI and its console progress bar are off (a run on a shared machine must not take its
  ports; the bar only fills the job's log).

Configuration (JSON): ``master``, ``driver_memory``, ``trigger_seconds``, ``keys`` (the key
columns), ``spark_conf`` (the store's settings: ``spark.hadoop.fs.s3a.*``), and ``tables``: for
each table its ``source``, ``target`` and ``checkpoint`` locations and its ``app_id``.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any, Sequence

#: Delta's session confs for an idempotent write (DML included): an (app id, version) already in
#: the target's log makes the write a no-op.
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
#: The change feed's own columns: not copied to the target.
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def latest_change_per_key(changes: Any, keys: Sequence[str]) -> Any:
    """One row per key: its last change in the batch (highest ``_commit_version``; inside one version
    a delete before an insert, so the insert wins), without ``update_preimage`` rows."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*keys).orderBy(
        F.col("_commit_version").desc(), F.when(F.col("_change_type") == "delete", 0).otherwise(1).desc())
    return (changes.where(F.col("_change_type") != "update_preimage")
            .withColumn("_rank", F.row_number().over(order)).where(F.col("_rank") == 1).drop("_rank"))


def upsert_batch(batch: Any, batch_id: int, *, target: str, keys: Sequence[str], app_id: str) -> None:
    """``foreachBatch``: the batch's last change per key MERGEd into ``target`` under the batch's
    transaction id (``app_id``, ``batch_id``)."""
    from delta.tables import DeltaTable

    session = batch.sparkSession  # the query's own session: confs set here stay with this table
    columns = [c for c in batch.columns if c not in CDF_COLUMNS]
    latest = latest_change_per_key(batch, keys)
    on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    values = {f"`{c}`": f"s.`{c}`" for c in columns}
    session.conf.set(TXN_APP_ID, app_id)
    session.conf.set(TXN_VERSION, str(batch_id))
    try:
        (DeltaTable.forPath(session, target).alias("t").merge(latest.alias("s"), on)
         .whenMatchedDelete(condition="s._change_type = 'delete'")
         .whenMatchedUpdate(condition="s._change_type != 'delete'", set=values)
         .whenNotMatchedInsert(condition="s._change_type != 'delete'", values=values)
         .execute())
    finally:
        session.conf.unset(TXN_APP_ID)
        session.conf.unset(TXN_VERSION)


def create_target(spark: Any, source: str, target: str) -> None:
    """The target, empty, with the source's columns, unless it exists."""
    from delta.tables import DeltaTable

    schema = spark.read.format("delta").load(source).schema
    DeltaTable.createIfNotExists(spark).location(target).addColumns(schema).execute()


def start_table(spark: Any, *, source: str, target: str, checkpoint: str, keys: Sequence[str], app_id: str,
                trigger_seconds: float, name: str) -> Any:
    """One table's always-on query: its change feed, each batch upserted into ``target``."""
    create_target(spark, source, target)
    changes = spark.readStream.format("delta").option("readChangeFeed", "true").load(source)
    return (changes.writeStream.queryName(name)
            .foreachBatch(partial(upsert_batch, target=target, keys=list(keys), app_id=app_id))
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .start())


def session(config: dict[str, Any]) -> Any:
    """A local session with Delta and the store's settings; Spark's and Delta's defaults otherwise."""
    from pyspark.sql import SparkSession

    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.spark import DELTA_CONFS, LOG4J_CONFIG, session_jars

    jars = session_jars(RuntimeSettings(master=config["master"], spark_conf=config.get("spark_conf", {})), s3a=True)
    builder = (SparkSession.builder.master(config["master"]).appName("cdc-recipe")
               .config("spark.jars", ",".join(jars))
               .config("spark.driver.memory", config["driver_memory"])
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"))
    for key, value in {**DELTA_CONFS, **config.get("spark_conf", {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.recipe CONFIG.json", file=sys.stderr)
        return 2
    config = json.loads(Path(args[0]).read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    spark = session(config)
    queries = [start_table(spark, source=t["source"], target=t["target"], checkpoint=t["checkpoint"],
                           keys=config["keys"], app_id=t["app_id"], trigger_seconds=config["trigger_seconds"],
                           name=name)
               for name, t in config["tables"].items()]
    print(f"recipe: {len(queries)} queries running", flush=True)
    failed = None
    while not stop.wait(1.0):
        failed = next((q for q in queries if not q.isActive), None)
        if failed is not None:
            break
    for q in queries:
        q.stop()
    if failed is not None:
        print(f"recipe: query {failed.name} stopped: {failed.exception()}", file=sys.stderr, flush=True)
        return 1
    print("recipe: stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
