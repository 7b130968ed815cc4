"""The two figures docs/deployment.md ("Object storage") quotes, measured on this machine.

  .venv/bin/python scripts/measure-s3-costs.py start [RUNS]    session start with and without hadoop-aws
  .venv/bin/python scripts/measure-s3-costs.py append [RUNS]   a checkpoint-table append on S3: Spark, delta-rs
  .venv/bin/python scripts/measure-s3-costs.py batch [CYCLES] [spark|driver|both]
                                                             one batch on S3: S3 requests, Spark jobs, commit to replica

``start`` launches RUNS pairs of fresh Python processes, alternating, each timing a local session's start
to the end of its first job, with Delta's jars only or with the s3 group too. ``append`` starts the
local S3 server (scripts/s3-server.sh) and times RUNS one-row appends to a checkpoint table in it, by
Spark and by delta-rs (the storage options derived from the session's s3a settings). Medians printed.
``batch`` runs one table with the production settings (``spark``: Spark's MERGE, DeltaSource plans each
batch) and/or the driver path (``driver``: the defaults, a delta-rs MERGE on the driver and batches
planned from the source's commit files), each on a table of its own on the same S3 server.
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
    from lakemirror.daemon.settings import RuntimeSettings
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


def _requests(lines: list[str]) -> "Counter[str]":
    """moto's request log lines, by method and what they touch (the bucket's prefixes and file kinds)."""
    import re
    from collections import Counter

    out: Counter[str] = Counter()
    for line in lines:
        m = re.search(r"\"(?:\x1b\[[0-9;]*m)?(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP", line)  # 4xx lines are coloured
        if not m:
            continue
        method, url = m.groups()
        from urllib.parse import parse_qs, unquote, urlparse

        parsed = urlparse(url)
        query = parse_qs(parsed.query)
        path = unquote(parsed.path) + (" " + query["prefix"][0] if "prefix" in query else "")
        table = ("checkpoints" if "continuous_sync" in path else "source" if "/src/" in path
                 else "replica" if "/dst/" in path else "other")
        if "list-type" in query or ("prefix" in query and method == "GET"):
            kind = "LIST"
        elif "_delta_log" in path:
            name = path.rsplit("/", 1)[-1]
            kind = f"{method} log " + ("checkpoint" if "checkpoint" in name else "crc" if path.endswith(".crc")
                                       else "json" if path.endswith(".json") else "other")
        elif "_change_data" in path:
            kind = f"{method} change data"
        elif path.endswith(".parquet"):
            kind = f"{method} data"
        else:
            kind = f"{method} other"
        out[f"{table}: {kind}"] += 1
    return out


#: ``batch``'s apply paths: the settings each runs with (on top of bench/production.py's PRODUCTION).
BATCH_PATHS: dict[str, dict[str, object]] = {
    "spark": {},
    "driver": {"driver_apply": True, "rewrite_below_bytes": 64 * 1024 * 1024},
}


def measure_batch(cycles: int, paths: tuple[str, ...] = ("spark",), rows: int = 100_000) -> None:
    """One table on the S3 server per apply path: the moto request log's lines counted for the
    writer's commits alone, the daemon idle, and each cycle from the writer's commit returning to the
    replica reflecting it (the idle rate taken off); Spark's event log gives the jobs of each
    micro-batch (by ``streaming.sql.batchId``)."""
    import random
    import tempfile
    from collections import Counter

    sys.path.insert(0, str(REPO))
    from bench.production import S3Daemon, S3Server, S3Site
    from bench.workload import SourceTable

    s3 = S3Server(port=int(PORT) + 1)
    s3.start()
    log = s3.run_dir / f"moto-{s3.port}.log"
    site = S3Site(s3)

    def mark() -> int:
        return len(log.read_text(errors="replace").splitlines())

    def since(n: int) -> "Counter[str]":
        return _requests(log.read_text(errors="replace").splitlines()[n:])

    results = []
    try:
        for path in paths:
            events = Path(tempfile.mkdtemp(prefix="bench-events-"))
            workdir = Path(tempfile.mkdtemp(prefix="bench-batch-"))
            warehouse = site.warehouse(workdir)
            src = SourceTable(site.uri(warehouse, "src", "t00"), rows, storage_options=s3.storage_options)
            src.create()
            rng = random.Random(1)
            stamp = 0
            n0 = mark()
            for _ in range(3):
                stamp += 1
                src.change(rng, 0.01, stamp)
            writer = since(n0)
            daemon = S3Daemon(s3, workdir, warehouse, ["t00"], 1.0, f"lakemirror, S3, {path}",
                              extra_conf={"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events}",
                                          "spark.eventLog.compress": "false"}, settings=BATCH_PATHS[path])
            daemon.start()
            daemon.wait_through({"t00": src.version()}, timeout=900)
            time.sleep(5)
            n1, t1 = mark(), time.time()
            time.sleep(20)
            idle_seconds = time.time() - t1
            idle = since(n1)
            per_cycle: list[Counter[str]] = []
            walls = []
            for _ in range(cycles):
                stamp += 1
                src.change(rng, 0.01, stamp)
                n2, t2 = mark(), time.time()
                daemon.wait_through({"t00": src.version()}, timeout=600)
                walls.append(time.time() - t2)
                per_cycle.append(since(n2))
                time.sleep(3)
            daemon.stop()
            results.append((path, writer, idle, idle_seconds, per_cycle, walls, events))
    finally:
        s3.stop()
    for path, writer, idle, idle_seconds, per_cycle, walls, events in results:
        print(f"== {path} ({BATCH_PATHS[path] or 'the production settings'})")
        print(f"S3 requests of the writer (delta-rs MERGE of 1% into {rows:,} rows), per commit:")
        for k, v in sorted(writer.items()):
            print(f"  {k:40} {v / 3:7.1f}")
        print(f"S3 requests of the idle daemon, per second ({idle_seconds:.0f} s):")
        for k, v in sorted(idle.items()):
            print(f"  {k:40} {v / idle_seconds:7.2f}")
        total: Counter[str] = Counter()
        for c in per_cycle:
            total.update(c)
        wall = statistics.median(walls)
        print(f"S3 requests from a commit to its replica commit, per cycle ({cycles} cycles, median wall {wall:.2f} s, "
              f"walls {', '.join(f'{w:.1f}' for w in walls)}), the idle rate over that time shown apart:")
        for k, v in sorted(total.items()):
            print(f"  {k:40} {v / cycles:7.1f}   (idle: {idle.get(k, 0) / idle_seconds * wall:5.1f})")
        print(f"  {'all':40} {sum(total.values()) / cycles:7.1f}   (idle: {sum(idle.values()) / idle_seconds * wall:5.1f})")
        print_jobs(events, cycles)


def print_jobs(events: Path, cycles: int) -> None:
    """The Spark jobs of the last ``cycles`` micro-batches in the event logs under ``events``."""
    import json
    from collections import defaultdict

    jobs: dict[str, list[tuple[str, float]]] = defaultdict(list)
    starts: dict[int, tuple[str, str, float]] = {}
    for f in sorted(p for p in events.rglob("events_*")):  # Spark 4: eventlog_v2_<app>/events_<n>_<app>[.zstd]
        data = f.read_bytes()
        if f.suffix == ".zstd":
            import io

            import zstandard

            data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
        for line in data.decode().splitlines():
            e = json.loads(line)
            if e["Event"] == "SparkListenerJobStart":
                props = e.get("Properties") or {}
                batch = props.get("streaming.sql.batchId")
                what = (props.get("spark.job.description") or props.get("callSite.short") or "?")[:90]
                starts[e["Job ID"]] = (batch or "-", what, e["Submission Time"])
            elif e["Event"] == "SparkListenerJobEnd" and e["Job ID"] in starts:
                batch, what, t0 = starts[e["Job ID"]]
                jobs[batch].append((what, (e["Completion Time"] - t0) / 1000))
    measured = sorted((b for b in jobs if b != "-"), key=int)[-cycles:]
    print(f"Spark jobs of the last {len(measured)} micro-batches (streaming.sql.batchId), per batch:")
    by_what: dict[str, list[float]] = defaultdict(list)
    for b in measured:
        for what, seconds in jobs[b]:
            by_what[what].append(seconds)
    for what, values in sorted(by_what.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {len(values) / len(measured):4.1f} jobs {sum(values) / len(measured):6.2f} s  {what}")
    print(f"  jobs per batch: {', '.join(str(len(jobs[b])) for b in measured)}; outside batches: {len(jobs.get('-', []))}")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if what == "start":
        measure_start(count)
    elif what == "append":
        measure_append(count)
    elif what == "batch":
        choice = sys.argv[3] if len(sys.argv) > 3 else "spark"
        if choice not in (*BATCH_PATHS, "both"):
            sys.exit(f"batch: the path is spark, driver or both, not {choice!r}")
        measure_batch(count, tuple(BATCH_PATHS) if choice == "both" else (choice,))
    else:
        sys.exit(__doc__)
