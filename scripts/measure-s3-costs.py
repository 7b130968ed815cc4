"""The two figures docs/deployment.md ("Object storage") quotes, measured on this machine.

  .venv/bin/python scripts/measure-s3-costs.py start [RUNS]    session start with and without hadoop-aws
  .venv/bin/python scripts/measure-s3-costs.py append [RUNS]   a checkpoint-table append on S3: Spark, delta-rs

``start`` launches RUNS pairs of fresh Python processes, alternating, each timing a local session's start
to the end of its first job, with Delta's jars only or with the s3 group too. ``append`` starts the
local S3 server (scripts/s3-server.sh) and times RUNS one-row appends to a checkpoint table in it, by
Spark and by delta-rs (the storage options derived from the session's s3a settings). Medians printed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PORT = "9177"

START = """
import sys, time
t = time.perf_counter()
from pyspark.sql import SparkSession
from lakemirror.daemon.jars import jar_paths
jars = jar_paths() + (jar_paths(group="s3") if sys.argv[1] == "s3" else [])
spark = (SparkSession.builder.master("local[2]").config("spark.jars", ",".join(jars))
         .config("spark.ui.enabled", "false").getOrCreate())
spark.range(1).collect()
print(time.perf_counter() - t)
"""


def measure_start(runs: int) -> None:
    times: dict[str, list[float]] = {"delta": [], "s3": []}
    for _ in range(runs):
        for group in times:
            out = subprocess.run([sys.executable, "-c", START, group], capture_output=True, text=True, check=True)
            times[group].append(float(out.stdout.strip().splitlines()[-1]))
    for group, values in times.items():
        print(f"session start + first job, jars {group:5}: median {statistics.median(values):.1f} s "
              f"({', '.join(f'{v:.1f}' for v in values)})")


def measure_append(runs: int) -> None:
    import boto3
    from deltalake import write_deltalake

    from lakemirror import tables
    from lakemirror.checkpoints.delta_store import arrow_rows
    from lakemirror.checkpoints.records import CHECKPOINT_DDL, CheckpointRow
    from lakemirror.daemon.config import RuntimeSettings
    from lakemirror.daemon.spark import local_session
    from lakemirror.identifiers import TableName
    from lakemirror.object_store import delta_rs_target
    from lakemirror.tables import TableLocation

    script = str(REPO / "scripts" / "s3-server.sh")
    url = subprocess.run([script, "start", PORT], capture_output=True, text=True, check=True).stdout.strip()
    try:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="k",
                     aws_secret_access_key="k").create_bucket(Bucket="lm-costs")
        conf = {"spark.hadoop.fs.s3a.endpoint": url, "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
                "spark.hadoop.fs.s3a.path.style.access": "true", "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
                "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                "spark.hadoop.fs.s3a.access.key": "k", "spark.hadoop.fs.s3a.secret.key": "k"}
        spark = local_session(RuntimeSettings(warehouse="s3a://lm-costs/wh", shuffle_partitions=2, spark_conf=conf))
        loc = TableLocation(TableName("a", "b", "c"), "s3a://lm-costs/wh/checkpoints")
        tables.write(spark.createDataFrame([], CHECKPOINT_DDL), loc, "append")
        now = datetime.now(timezone.utc)
        row = CheckpointRow("p", "s.s.t", "d.s.t", 1, 0, "app", 1, 1, 1, 1, 1, 1, 0, 0, 0.5, None, False, now, now)
        writer = spark.newSession()
        uri, options = delta_rs_target(spark, loc.path or "")
        by_spark, by_delta_rs = [], []
        for _ in range(runs):
            t = time.perf_counter()
            tables.write(writer.createDataFrame([tuple(row.as_dict().values())], CHECKPOINT_DDL), loc, "append")
            by_spark.append(time.perf_counter() - t)
            t = time.perf_counter()
            write_deltalake(uri, arrow_rows([row]), mode="append", storage_options=options)
            by_delta_rs.append(time.perf_counter() - t)
        assert tables.read(spark, loc).count() == 2 * runs
        for name, values in (("Spark", by_spark), ("delta-rs", by_delta_rs)):
            print(f"checkpoint append on S3 by {name:8}: median {statistics.median(values):.2f} s "
                  f"({', '.join(f'{v:.2f}' for v in values)})")
        spark.stop()
    finally:
        subprocess.run([script, "stop", PORT], check=False)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if what == "start":
        measure_start(count)
    elif what == "append":
        measure_append(count)
    else:
        sys.exit(__doc__)
