"""`make bench ONLY=production`: the path a user on Databricks or Kubernetes gets, side by side with
the delta-rs loop on the same S3 data.

Sources and replicas live in a bucket of a local S3-compatible server (moto's, started by
scripts/s3-server.sh on loopback): Spark reaches them as ``s3a://`` (hadoop-aws), delta-rs (the
writer and the baseline) as ``s3://``. lakemirror runs with the settings such a user gets: the
change feed read by Delta's ``DeltaSource`` (``kernel_change_feed: false``), every batch applied by
Spark's MERGE (``driver_apply: false``, ``rewrite_below_bytes: 0``: no driver-side delta-rs, no
rewrite of small replicas); one more run at 4 tables keeps ``rewrite_below_bytes`` at its default,
where Spark rewrites each small replica whole instead of MERGEing into it. The same daemon also
runs over Spark Connect (a server started by scripts/connect-server.sh with hadoop-aws and the same
s3a settings), where each table's query stays up and waits for its turns at a gate of files, each
batch is MERGEd in SQL on the server and reported to the daemon by a file
(sinks/merge/connect_apply.py). The sources are checkpointed every 10 commits
(:data:`PRODUCTION_SOURCE_PROPERTIES`), as production writers leave them.

The workload is ``bench.__main__.steady_lag``'s, with :class:`S3Site` in place of the local disk:
the same writer, warm-up, lag measure and exactness check. The time a replica's commit appeared is
its commit's own ``commitInfo.timestamp`` (S3 reports an object's time in whole seconds), taken by
Delta just before it writes the commit file: earlier than the file's appearance by that one PUT.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from bench.systems import LakemirrorDaemon, batch_summary
from lakemirror.sinks.merge.apply_choice import DEFAULT_REWRITE_BELOW_BYTES

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "lakemirror-bench"
REGION = "us-east-1"
S3_PORT = 9317
CONNECT_PORT = 15317

#: The settings a production deployment applies with: Spark's MERGE for every batch, Delta's
#: DeltaSource for the change feed (the defaults outside the driver's own disk, stated here so that
#: a change of a default does not change what this workload measures).
PRODUCTION: dict[str, Any] = {"driver_apply": False, "rewrite_below_bytes": 0, "kernel_change_feed": False}
#: The lakemirror systems of the workload, by name: extra settings (top level, runtime) of each.
SYSTEMS: dict[str, dict[str, Any]] = {
    "lakemirror, S3, Spark MERGE": {},
    "lakemirror, S3, Spark MERGE, over Spark Connect": {"connect": True},
    "lakemirror, S3, Spark MERGE, 2 apply workers": {"settings": {"apply_workers": 2}},
    # What a user gets who leaves rewrite_below_bytes at its default: a replica this small is
    # rewritten whole in one pass instead of MERGEd (sinks/merge/apply_choice.py).
    "lakemirror, S3, Spark rewrite (default rewrite_below_bytes)": {
        "settings": {"rewrite_below_bytes": DEFAULT_REWRITE_BELOW_BYTES}},
}
LOCAL_MODE, CONNECT_MODE, TWO_WORKERS, REWRITE_MODE = SYSTEMS


def parameters(quick: bool) -> dict[str, Any]:
    """Sizes and durations: the full run takes about 30 minutes on two cores, ``quick`` about 2."""
    if quick:
        return {"tables": [4], "connect_tables": [], "rows": 20_000, "fraction": 0.01, "trigger": 1.0,
                "warmup": 10.0, "seconds": 30.0, "drain": 60.0}
    return {"tables": [4, 16], "connect_tables": [4], "rows": 100_000, "fraction": 0.01, "trigger": 1.0,
            "warmup": 60.0, "seconds": 90.0, "drain": 120.0}


class S3Server:
    """moto's S3 server on loopback (scripts/s3-server.sh) and one bucket on it; its data lives in
    memory and goes with the server."""

    def __init__(self, port: int = S3_PORT) -> None:
        self.port = port
        self.run_dir = Path(tempfile.mkdtemp(prefix="bench-s3-"))
        self.endpoint = ""

    def start(self) -> None:
        script = str(ROOT / "scripts" / "s3-server.sh")
        started = subprocess.run([script, "start", str(self.port)], capture_output=True, text=True,
                                 env={**os.environ, "LAKEMIRROR_S3_RUN_DIR": str(self.run_dir)})
        if started.returncode != 0:
            raise RuntimeError(f"scripts/s3-server.sh start failed: {started.stderr.strip()}")
        self.endpoint = started.stdout.strip().splitlines()[-1]
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket=BUCKET)

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

    def __init__(self, s3: S3Server, port: int = CONNECT_PORT) -> None:
        self.s3, self.port = s3, port
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
    delta-rs; the daemon's own state and stream checkpoints stay in its local working directory."""

    def __init__(self, s3: S3Server, workdir: Path, warehouse: str, tables: list[str], trigger: float, name: str,
                 connect: ConnectServer | None = None, extra_conf: dict[str, str] | None = None,
                 settings: dict[str, Any] | None = None) -> None:
        runtime: dict[str, Any] = {"spark_conf": {**s3.spark_conf, **(extra_conf or {})}}
        if connect is not None:
            runtime.update(mode="connect", spark_remote=connect.url)
        super().__init__(workdir, warehouse, tables, trigger, variant=name,  # type: ignore[arg-type]
                         settings={**PRODUCTION, **(settings or {})},
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


#: The sources' table properties: a checkpoint every 10 commits, as Spark's and Databricks' writers
#: leave a table (Delta's default ``delta.checkpointInterval``), where delta-rs's own default is 100.
#: A reader of the change feed rebuilds the source's snapshot from its last checkpoint and the
#: commits since, so the interval sets how many commit files each batch reads from the bucket.
PRODUCTION_SOURCE_PROPERTIES = {"delta.checkpointInterval": "10"}


class S3Site:
    """bench.__main__.steady_lag's tables in the S3 server's bucket, one prefix per run."""

    def __init__(self, s3: S3Server, connect: ConnectServer | None = None) -> None:
        self.s3, self.connect = s3, connect
        self.source_properties = dict(PRODUCTION_SOURCE_PROPERTIES)

    @property
    def storage_options(self) -> dict[str, str]:
        return self.s3.storage_options

    def warehouse(self, workdir: Path) -> str:
        return f"s3a://{BUCKET}/{workdir.name}/lakehouse"

    def uri(self, warehouse: str, catalog: str, table: str) -> str:
        return f"s3{warehouse[len('s3a'):]}/{catalog}/bench/{table}"

    def daemon(self, system: str, workdir: Path, warehouse: str, tables: list[str], trigger: float) -> S3Daemon:
        connect = self.connect if SYSTEMS[system].get("connect") else None
        if SYSTEMS[system].get("connect") and connect is None:
            raise RuntimeError(f"{system} needs a Spark Connect server")
        return S3Daemon(self.s3, workdir, warehouse, tables, trigger, system, connect,
                        settings=SYSTEMS[system].get("settings"))


def production(p: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """Every run of the workload: at each table count the daemon and the delta-rs loop; over
    Spark Connect at ``connect_tables``. One S3 server for all; one Connect server for its runs."""
    out: list[dict[str, Any]] = []
    s3 = S3Server()
    s3.start()
    try:
        site = S3Site(s3)
        for n in p["tables"]:
            # two apply workers (tables applied two at a time) and the default rewrite of small replicas
            # at the smallest table count only
            variants = (TWO_WORKERS, REWRITE_MODE) if n == min(p["tables"]) else ()
            for system in (LOCAL_MODE, *variants, "delta-rs"):
                out.append(_run(system, n, p, seed, site))
        if p["connect_tables"]:
            connect = ConnectServer(s3)
            t0 = time.time()
            connect.start()
            started = round(time.time() - t0, 1)
            try:
                for n in p["connect_tables"]:
                    out.append(_run(CONNECT_MODE, n, p, seed, S3Site(s3, connect)))
                    out[-1]["connect_server_start_seconds"] = started
            finally:
                connect.stop()
    finally:
        s3.stop()
    return out


def _run(system: str, n: int, p: dict[str, Any], seed: int, site: S3Site) -> dict[str, Any]:
    from bench.__main__ import steady_lag

    print(f"production, {n} tables: {system} ...", flush=True)
    load, at = list(os.getloadavg()), time.time()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    warmup = p["warmup"] if system.startswith("lakemirror") else 0.0  # the delta-rs loop has no JIT to warm
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


#: The issue's goals for the production path on this 2-core machine: p99 lag by number of tables.
GOALS = {4: 3.0, 16: 10.0}


def render(runs: list[dict[str, Any]], p: dict[str, Any], steady_table: Any) -> list[str]:
    """docs/BENCHMARKS.md's section for the workload (``steady_table``: bench.__main__'s table)."""
    failed = [r for r in runs if "error" in r]
    runs = [r for r in runs if "error" not in r]
    if not runs:
        return ["## The production path: S3, Spark MERGE", "", *(f"- {r['system']}, {r['tables']} tables: "
                                                                  f"failed: {r['error']}" for r in failed)]
    by_tables: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        by_tables.setdefault(r["tables"], []).append(r)
    r0 = runs[0]
    lines = ["## The production path: S3, Spark MERGE, side by side with the delta-rs loop", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(r0['measured_at']))}. Sources and replicas "
             "in a bucket of moto's S3 server on loopback (scripts/s3-server.sh): `s3a://` for Spark, `s3://` for "
             "delta-rs; the sources written by delta-rs with a checkpoint every 10 commits (`delta.checkpointInterval`, "
             "as Spark's and Databricks' writers leave a table; delta-rs's own default is 100). "
             "lakemirror with the settings a Databricks or Kubernetes user gets: `driver_apply: false`, "
             "`rewrite_below_bytes: 0`, `kernel_change_feed: false`: the change feed read by Delta's `DeltaSource`, "
             "every batch applied by Spark's MERGE, the checkpoint table in the bucket; the row \"Spark rewrite\" leaves "
             "`rewrite_below_bytes` at its default (64 MiB), so that each 100,000-row replica is rewritten whole in one "
             "pass instead, as a user who keeps the defaults gets. Over Spark Connect: the same "
             "settings through a server started by scripts/connect-server.sh (hadoop-aws and the same s3a settings), "
             "each table's query up and taking turns at a gate of files (the default over Connect), each batch MERGEd in SQL on the server and reported to the daemon by a file, whose checkpoint rows the daemon appends a round at a time. The delta-rs CDF loop reads and writes the same bucket. "
             f"{r0['rows_per_table']:,} rows a table, the steady workload's writer (a delta-rs MERGE per table a "
             f"second touching {p.get('fraction', 0.01):.0%} of its rows), trigger {p.get('trigger', 1.0)} s, "
             f"lakemirror measured {r0['seconds']:.0f} s after {p.get('warmup', 0):.0f} s of warm-up, the loop "
             f"from its first commit; {p.get('drain', 0):.0f} s allowed to drain. A replica commit's time is its "
             "`commitInfo.timestamp` (S3 gives objects' times in whole seconds). The machine's two cores also run the "
             "writer and the S3 server; each run's `uptime` at its start is listed.", ""]
    for n, group in sorted(by_tables.items()):
        goal = GOALS.get(n)
        lines += [f"### {n} tables" + (f" (goal: lakemirror's p99 <= {goal:.0f} s)" if goal else ""), "",
                  *steady_table(group, LOCAL_MODE), ""]
        for r in group:
            met = ""
            if goal and r["system"].startswith("lakemirror"):
                p99 = r["lag"]["p99"]
                met = (f"; goal {'met' if p99 <= goal else 'missed'} (p99 {p99:.2f} s)" if p99 == p99
                       else "; goal missed (no commit of the measured window applied)")
            server = r.get("peak_resident_mib") or {}
            server_mem = (f"; the Connect server's peak RSS {server.get('server jvm', 0):.0f} MiB JVM + "
                          f"{server.get('server python', 0):.0f} MiB Python workers, its start "
                          f"{r['connect_server_start_seconds']} s" if "connect_server_start_seconds" in r else "")
            lines.append(f"- {r['system']}: `uptime` at start: `{r.get('uptime_at_start', '?')}`{met}{server_mem}.")
        lines.append("")
    for r in failed:
        lines.append(f"- {r['system']}, {r['tables']} tables: the run failed: {r['error']}")
    return lines
