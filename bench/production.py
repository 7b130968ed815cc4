"""`make bench ONLY=production`: the shapes production users run, on S3, beside what they would run
instead, all rows in one run.

Sources and replicas live in a bucket of a local S3-compatible server (moto's, started by
scripts/s3-server.sh on loopback): Spark reaches them as ``s3a://`` (hadoop-aws), delta-rs (the
delta-rs writer, the driver path and the delta-rs loop) as ``s3://``. The rows (:data:`ROWS`),
each selected by its settings so that every row exists whatever lakemirror's defaults are:

- ``recipe``: the job a user writes instead (bench/recipe.py): one always-on ``readChangeFeed``
  stream per table, ``foreachBatch`` keeping the last change per key and MERGEing it under Delta's
  ``txnAppId``/``txnVersion`` confs, Spark's and Delta's defaults otherwise; its own process and JVM;
- ``driver``: lakemirror with ``driver_apply: true``: replicas in S3 that the driver reaches with
  the session's s3a settings take each batch by one delta-rs MERGE on the driver (where the daemon
  has that path; each run records the path every table's batches actually took);
- ``spark``: lakemirror with ``driver_apply: false``: the Spark-only path (what Unity Catalog
  replicas get), the other settings at their defaults;
- ``connect``: the same settings over Spark Connect (a server started by scripts/connect-server.sh
  with hadoop-aws and the same s3a settings, started for the row and stopped after it), where each
  table's query stays up and waits for its turns at a gate of files, each batch is MERGEd in SQL on
  the server and reported to the daemon by a file (sinks/merge/connect_apply.py);
- ``loop``: the delta-rs CDF loop on the same bucket.

Each row runs with the sources written by delta-rs (checkpointed every 10 commits, as Spark's
writers leave a table: :data:`PRODUCTION_SOURCE_PROPERTIES`) and by Spark (bench/spark_writer.py:
Delta's own writer, with the ``.crc`` files it leaves), at each table count. The workload is
``bench.__main__.steady_lag``'s, with :class:`S3Site` in place of the local disk: the same writer,
warm-up (for every system with a JVM of its own), lag measure and exactness check. The time a
replica's commit appeared is its commit's own ``commitInfo.timestamp`` (S3 reports an object's time
in whole seconds), taken by the committer just before it writes the commit file.

The section of docs/BENCHMARKS.md, with the issue's goals judged, is bench/production_report.py's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import pyarrow as pa
from deltalake import DeltaTable

from bench.spark_writer import WRITERS, SparkSourceTable, spark_writer_session
from bench.systems import LakemirrorDaemon, batch_summary
from bench.workload import SourceTable

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "lakemirror-bench"
REGION = "us-east-1"

#: The settings of Spark's MERGE for every batch, the change feed read by Delta's DeltaSource: what
#: an :class:`S3Daemon` runs with unless told otherwise (scripts/measure-s3-costs.py's Spark path).
PRODUCTION: dict[str, Any] = {"driver_apply": False, "rewrite_below_bytes": 0, "kernel_change_feed": False}
#: What every lakemirror row of the workload sets besides its own settings: the change feed read by
#: Delta's streaming source (the Kernel-based one is a testing-only opt-in), stated so that a change
#: of that default does not change what the workload measures.
ROW_BASE: dict[str, Any] = {"kernel_change_feed": False}


@dataclass(frozen=True)
class Row:
    """One system of the workload: its name in the results, what runs, and lakemirror's settings."""

    key: str
    name: str
    kind: str                                   # "lakemirror", "recipe" or "loop"
    settings: dict[str, Any] = field(default_factory=dict)
    connect: bool = False
    #: the apply path every table of a lakemirror row should take (None: any Spark path)
    expected_path: str | None = None


ROWS: dict[str, Row] = {r.key: r for r in (
    Row("recipe", "user recipe (readChangeFeed, foreachBatch MERGE)", "recipe"),
    Row("driver", "lakemirror, S3 driver path", "lakemirror", {"driver_apply": True}, expected_path="driver"),
    Row("spark", "lakemirror, Spark-only path", "lakemirror", {"driver_apply": False}),
    Row("connect", "lakemirror, Spark-only path, over Spark Connect", "lakemirror", {"driver_apply": False},
        connect=True),
    Row("loop", "delta-rs CDF loop", "loop"),
    # Not in the default run: the recipe with the two settings lakemirror's own session changes for a
    # small machine (its settings are Spark confs of the job).
    Row("recipe_tuned", "user recipe, 2 shuffle partitions, Delta snapshots in 2", "recipe",
        {"spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"}),
)}
SYSTEMS: dict[str, Row] = {r.name: r for r in ROWS.values()}
#: The rows of the default run (``--rows`` picks others too).
DEFAULT_ROWS = ("recipe", "driver", "spark", "connect", "loop")


def parameters(quick: bool) -> dict[str, Any]:
    """Sizes and durations. The full run (every row, both writers, 4 and 16 tables) takes about 90
    minutes on two cores; ``quick`` (2 tables of 10,000 rows, 20 s measured) about 20."""
    if quick:
        return {"tables": [2], "connect_tables": [2], "writers": list(WRITERS), "systems": list(DEFAULT_ROWS),
                "rows": 10_000, "fraction": 0.01, "trigger": 1.0, "warmup": 10.0, "seconds": 20.0, "drain": 180.0}
    return {"tables": [4, 16], "connect_tables": [4], "writers": list(WRITERS), "systems": list(DEFAULT_ROWS),
            "rows": 100_000, "fraction": 0.01, "trigger": 1.0, "warmup": 60.0, "seconds": 90.0, "drain": 120.0}


def plan(p: dict[str, Any], systems: Sequence[str] | None = None, writers: Sequence[str] | None = None,
         tables: Sequence[int] | None = None) -> list[tuple[str, int, str]]:
    """The runs, in order: (writer, table count, row key). By writer, then table count, the rows of
    ``p["systems"]`` in :data:`ROWS` order; Spark Connect at ``connect_tables`` only. ``writers``,
    ``tables``: only those; ``systems``: those rows instead (any of :data:`ROWS`, for a row measured
    again, alone, or one not in the default run). Unknown names raise."""
    for given, known, what in ((systems, ROWS, "row"), (writers, WRITERS, "writer")):
        unknown = sorted(set(given or ()) - set(known))
        if unknown:
            raise ValueError(f"unknown {what}(s) {unknown}; choose from {', '.join(known)}")
    chosen = list(p["systems"]) if systems is None else [k for k in ROWS if k in systems]
    out = []
    for writer in (w for w in p["writers"] if writers is None or w in writers):
        for n in sorted({*p["tables"], *p["connect_tables"]}):
            if tables is not None and n not in tables:
                continue
            out.extend((writer, n, key) for key in chosen
                       if n in (p["connect_tables"] if ROWS[key].connect else p["tables"]))
    return out


def run_key(r: dict[str, Any]) -> tuple[str, int, str]:
    return (r.get("writer", "delta-rs"), int(r["tables"]), r["system"])


def merge_runs(kept: Iterable[dict[str, Any]], fresh: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The section after a partial run: each fresh run replaces the kept run of its (writer, table
    count, system); the other kept runs stay (each keeps its own ``run_id`` and time), but for runs of
    a system that is no longer one of :data:`ROWS`, which nobody could measure again."""
    fresh = list(fresh)
    replaced = {run_key(r) for r in fresh}
    return [*(r for r in kept if run_key(r) not in replaced and r["system"] in SYSTEMS), *fresh]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's S3 server on loopback (scripts/s3-server.sh) and one bucket on it; its data lives in
    memory and goes with the server. The port is a free one unless given (the machine is shared)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.run_dir = Path(tempfile.mkdtemp(prefix="bench-s3-"))
        self.endpoint = ""

    def start(self) -> None:
        script = str(ROOT / "scripts" / "s3-server.sh")
        started = subprocess.run([script, "start", str(self.port)], capture_output=True, text=True,
                                 env={**os.environ, "LAKEMIRROR_S3_RUN_DIR": str(self.run_dir)})
        if started.returncode != 0:
            raise RuntimeError(f"scripts/s3-server.sh start failed: {started.stderr.strip()}")
        self.endpoint = started.stdout.strip().splitlines()[-1]
        self.client().create_bucket(Bucket=BUCKET)

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id="bench",
                            aws_secret_access_key="bench")

    def stop(self) -> None:
        subprocess.run([str(ROOT / "scripts" / "s3-server.sh"), "stop", str(self.port)], capture_output=True,
                       env={**os.environ, "LAKEMIRROR_S3_RUN_DIR": str(self.run_dir)})

    @property
    def hadoop_conf(self) -> dict[str, str]:
        """The ``fs.s3a.*`` settings Spark needs for the server (as docs/deployment.md describes)."""
        return {"fs.s3a.endpoint": self.endpoint, "fs.s3a.endpoint.region": REGION,
                "fs.s3a.path.style.access": "true", "fs.s3a.connection.ssl.enabled": "false",
                "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                "fs.s3a.access.key": "bench", "fs.s3a.secret.key": "bench"}

    @property
    def spark_conf(self) -> dict[str, str]:
        return {f"spark.hadoop.{k}": v for k, v in self.hadoop_conf.items()}

    @property
    def storage_options(self) -> dict[str, str]:
        from lakemirror.object_store import delta_rs_storage_options

        return delta_rs_storage_options(self.hadoop_conf)


class ConnectServer:
    """A Spark Connect server (scripts/connect-server.sh) that reaches the S3 server's bucket."""

    def __init__(self, s3: S3Server, port: int | None = None) -> None:
        self.s3, self.port = s3, port if port is not None else free_port()
        self.log_dir = Path(tempfile.mkdtemp(prefix="bench-connect-"))

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def _run(self, command: str) -> subprocess.CompletedProcess[str]:
        confs = "\n".join(f"{k}={v}" for k, v in self.s3.spark_conf.items())
        return subprocess.run([str(ROOT / "scripts" / "connect-server.sh"), command, str(self.port), str(self.log_dir)],
                              capture_output=True, text=True, env={**os.environ, "LAKEMIRROR_CONNECT_CONF": confs})

    def start(self) -> None:
        started = self._run("start")
        if started.returncode != 0:
            raise RuntimeError(f"scripts/connect-server.sh start failed: {started.stderr.strip()[-2000:]}")

    @property
    def pid(self) -> int | None:
        try:
            return int((self.log_dir / f"connect-server-{self.port}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        self._run("stop")


class S3Daemon(LakemirrorDaemon):
    """The daemon with its lakehouse in the bucket: replicas and the checkpoint table read back by
    delta-rs; the daemon's own state and stream checkpoints stay in its local working directory.
    ``base``: the settings under ``settings`` (default :data:`PRODUCTION`)."""

    def __init__(self, s3: S3Server, workdir: Path, warehouse: str, tables: list[str], trigger: float, name: str,
                 connect: ConnectServer | None = None, extra_conf: dict[str, str] | None = None,
                 settings: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> None:
        runtime: dict[str, Any] = {"spark_conf": {**s3.spark_conf, **(extra_conf or {})}}
        if connect is not None:
            runtime.update(mode="connect", spark_remote=connect.url)
        super().__init__(workdir, warehouse, tables, trigger, variant=name,  # type: ignore[arg-type]
                         settings={**(PRODUCTION if base is None else base), **(settings or {})},
                         runtime=runtime)
        self.s3, self.lakehouse = s3, warehouse  # s3a://bucket/<run>/lakehouse
        self.server_pid = connect.pid if connect is not None else None

    def _uri(self, *parts: str) -> str:
        return "/".join(("s3" + self.lakehouse[len("s3a"):], *parts))

    @property
    def checkpoint_table(self) -> str:  # type: ignore[override]
        return self._uri(self.destination_catalog, "continuous_sync", "checkpoints")

    def batches(self, since: float) -> dict[str, Any]:
        return batch_summary(self.checkpoint_table, since, self.s3.storage_options)

    def checkpoint_rows(self, columns: list[str]) -> pa.Table:
        return DeltaTable(self.checkpoint_table, storage_options=self.s3.storage_options).to_pyarrow_table(
            columns=columns)

    def commit_files(self, table: str) -> list[tuple[float, str]]:
        """Each replica commit's ``commitInfo`` with its own timestamp (S3's object times are whole seconds)."""
        history = DeltaTable(self._uri(self.destination_catalog, "bench", table),
                             storage_options=self.s3.storage_options).history()
        return sorted((info["timestamp"] / 1000.0, json.dumps({"commitInfo": info})) for info in history
                      if "timestamp" in info)


#: The sources' table properties when delta-rs writes them: a checkpoint every 10 commits, as
#: Spark's and Databricks' writers leave a table (Delta's default ``delta.checkpointInterval``),
#: where delta-rs's own default is 100. A reader of the change feed rebuilds the source's snapshot
#: from its last checkpoint and the commits since, so the interval sets how many commit files each
#: batch reads from the bucket. Spark's writer needs no property for it.
PRODUCTION_SOURCE_PROPERTIES = {"delta.checkpointInterval": "10"}


class S3Site:
    """bench.__main__.steady_lag's tables in the S3 server's bucket, one prefix per run; the sources
    written by ``writer`` (``delta-rs`` or ``spark``)."""

    def __init__(self, s3: S3Server, connect: ConnectServer | None = None, writer: str = "delta-rs") -> None:
        self.s3, self.connect, self.writer = s3, connect, writer
        self._writer_session: Any = None

    @property
    def storage_options(self) -> dict[str, str]:
        return self.s3.storage_options

    @property
    def source_properties(self) -> dict[str, str]:
        return dict(PRODUCTION_SOURCE_PROPERTIES) if self.writer == "delta-rs" else {}

    def warehouse(self, workdir: Path) -> str:
        return f"s3a://{BUCKET}/{workdir.name}/lakehouse"

    def uri(self, warehouse: str, catalog: str, table: str) -> str:
        return f"s3{warehouse[len('s3a'):]}/{catalog}/bench/{table}"

    def spark_uri(self, warehouse: str, catalog: str, table: str) -> str:
        return f"{warehouse}/{catalog}/bench/{table}"

    def source(self, warehouse: str, table: str, rows: int) -> SourceTable:
        """The source ``src.bench.<table>``, written by the site's writer."""
        uri = self.uri(warehouse, "src", table)
        if self.writer == "delta-rs":
            return SourceTable(uri, rows, storage_options=self.storage_options, properties=self.source_properties)
        if self._writer_session is None:
            self._writer_session = spark_writer_session(self.s3.spark_conf)
        return SparkSourceTable(uri, rows, storage_options=self.storage_options, properties=self.source_properties,
                                spark=self._writer_session, spark_path=self.spark_uri(warehouse, "src", table))

    def own_process(self, system: str) -> bool:
        """lakemirror's daemon and the user's recipe run as processes of their own."""
        row = SYSTEMS.get(system)
        return system.startswith("lakemirror") or (row is not None and row.kind == "recipe")

    def daemon(self, system: str, workdir: Path, warehouse: str, tables: list[str], trigger: float) -> Any:
        row = SYSTEMS[system]
        if row.kind == "recipe":
            return self.recipe(system, workdir, warehouse, tables, trigger)
        if row.connect and self.connect is None:
            raise RuntimeError(f"{system} needs a Spark Connect server")
        return S3Daemon(self.s3, workdir, warehouse, tables, trigger, system, self.connect if row.connect else None,
                        settings=row.settings, base=ROW_BASE)

    def recipe(self, system: str, workdir: Path, warehouse: str, tables: list[str], trigger: float) -> Any:
        from bench.recipe_job import RecipeJob, S3Store
        from lakemirror.daemon.settings import RuntimeSettings

        defaults = RuntimeSettings()  # the daemon's master and driver memory: the same resources

        def snapshot_files(table: str, version: int) -> int | None:
            dt = DeltaTable(self.uri(warehouse, "src", table), version=version, storage_options=self.storage_options)
            return len(dt.file_uris())

        return RecipeJob(system, workdir, tables, trigger,
                         sources={t: self.spark_uri(warehouse, "src", t) for t in tables},
                         targets={t: self.spark_uri(warehouse, "dst", t) for t in tables},
                         store=S3Store(self.s3.client(), BUCKET),
                         spark_conf={**self.s3.spark_conf, **SYSTEMS[system].settings},
                         snapshot_files=snapshot_files, master=defaults.master, driver_memory=defaults.driver_memory)

    def close(self) -> None:
        """Stops the Spark writer's session, if one was started."""
        if self._writer_session is not None:
            self._writer_session.stop()
            self._writer_session = None


def production(p: dict[str, Any], seed: int, systems: Sequence[str] | None = None,
               writers: Sequence[str] | None = None, tables: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Every run of :func:`plan` on one S3 server; a Spark Connect server started for each Connect
    run and stopped after it. Each result carries its writer, its row key and the run's id (its
    start time), so rows measured in one run can be told from rows kept from another."""
    runs = plan(p, systems, writers, tables)
    run_id = time.time()
    out: list[dict[str, Any]] = []
    s3 = S3Server()
    s3.start()
    site = S3Site(s3)
    try:
        for writer, n, key in runs:
            row = ROWS[key]
            site.writer = writer
            started: float | None = None
            connect = ConnectServer(s3) if row.connect else None
            try:
                if connect is not None:
                    t0 = time.time()
                    connect.start()
                    started = round(time.time() - t0, 1)
                    site.connect = connect
                result = _run(row.name, n, p, seed, site, writer)
            except Exception as exc:  # noqa: BLE001 (the Connect server did not start: the row is reported)
                result = {"system": row.name, "tables": n, "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                          "measured_at": time.time()}
            finally:
                if connect is not None:
                    connect.stop()
                    site.connect = None
            result.update(writer=writer, row=key, run_id=run_id)
            if started is not None:
                result["connect_server_start_seconds"] = started
            out.append(result)
    finally:
        site.close()
        s3.stop()
    return out


def _run(system: str, n: int, p: dict[str, Any], seed: int, site: S3Site, writer: str) -> dict[str, Any]:
    from bench.__main__ import steady_lag

    print(f"production, sources written by {writer}, {n} tables: {system} ...", flush=True)
    load, at = list(os.getloadavg()), time.time()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    warmup = p["warmup"] if site.own_process(system) else 0.0  # the delta-rs loop has no JIT to warm
    try:
        result = steady_lag(system, n, p["rows"], p["seconds"], p["fraction"], p["trigger"], seed, warmup,
                            site=site, drain_seconds=p["drain"])
    except Exception as exc:  # noqa: BLE001 (one failed run is reported; the others still run)
        print(f"  failed: {exc!r}", flush=True)
        return {"system": system, "tables": n, "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                "measured_at": at, "load_average_at_start": load, "uptime_at_start": uptime}
    result.update(measured_at=at, load_average_at_start=load, uptime_at_start=uptime,
                  load_average_at_end=list(os.getloadavg()))
    print(f"  {result['lag']}", flush=True)
    return result
