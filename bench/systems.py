"""The systems under test, each replicating the same source tables, with its apply events recorded.

- ``LakemirrorDaemon``: the real daemon (`lakemirror run`) as a subprocess; its apply events are
  read afterwards from the replicas' Delta logs (the time each MERGE commit file appeared) joined
  with the checkpoint rows (which source version each batch reached), not from its own metrics.
- ``DeltaRsLoop``: the single-machine alternative: per table, ``load_cdf`` from the last applied
  version, keep the latest change per key, one ``merge`` into the replica, every trigger interval.
- ``FullRefresh``: overwrite each replica with the whole source, cycle after cycle, as fast as it
  can go (a scheduled CTAS at its most favourable schedule), done with delta-rs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml
from deltalake import DeltaTable, write_deltalake

from bench.measure import Apply
from bench.workload import SourceTable
from lakemirror.delta_log.layout import LOG_DIR

RANK = {"delete": 1, "insert": 2, "update_postimage": 2}


# -- lakemirror ---------------------------------------------------------------------------------

#: lakemirror variants run side by side with the default in the steady workload, by the settings
#: each changes: ``driver_apply`` false writes every batch with Spark (small replicas rewritten: the
#: design before the driver path); ``rewrite_below_bytes`` 0 applies every batch by Spark's MERGE
#: (the design before small replicas were rewritten); ``apply_workers`` 2 runs two turns at once.
#: ``apply_workers`` 0 (one always-on query per table, the design before turns) is still a setting,
#: no longer run: it measured behind turns (the history of docs/BENCHMARKS.md has the runs).
VARIANTS: dict[str, dict[str, Any]] = {"lakemirror, Spark rewrite": {"driver_apply": False},
                                       "lakemirror, MERGE only": {"rewrite_below_bytes": 0},
                                       "lakemirror, 2 apply workers": {"apply_workers": 2}}


class LakemirrorDaemon:
    name = "lakemirror"

    def __init__(self, workdir: Path, warehouse: Path, tables: list[str], trigger_seconds: float,
                 shuffle_partitions: int = 2, replica_properties: dict[str, str] | None = None,
                 destination_catalog: str = "dst", variant: str | None = None,
                 settings: dict[str, Any] | None = None, runtime: dict[str, Any] | None = None) -> None:
        """``settings`` and ``runtime``: more settings over the benchmark's own (e.g. the production
        path's, bench/production.py), at the top level and in ``runtime``."""
        self.workdir, self.warehouse, self.tables = workdir, warehouse, tables
        self.name = variant or "lakemirror"
        self.destination_catalog = destination_catalog
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "lakemirror.yaml"
        self.config.write_text(yaml.safe_dump({
            "pipeline_id": "bench", "source_catalog": "src", "destination_catalog": destination_catalog,
            "schema_name": "bench", "tables": tables, "checkpoint_volume": str(workdir / "ck"),
            "trigger_interval_seconds": trigger_seconds, "lag_interval_seconds": 1,
            "replica_properties": replica_properties or {},
            **(VARIANTS[variant] if variant in VARIANTS else {}), **(settings or {}),
            "runtime": {"warehouse": str(warehouse), "shuffle_partitions": shuffle_partitions, **(runtime or {})},
            "http": {"port": 0}}))
        self.proc: subprocess.Popen[bytes] | None = None
        self.metric_lag: list[tuple[float, float]] = []  # (time, max lakemirror_lag_seconds over tables)
        self._scrape_stop = threading.Event()
        self.started_at = 0.0
        self.peak_memory: dict[str, float] = {}  # peak resident MiB of the daemon's processes, by kind
        self._stopped_applies: dict[str, list[Apply]] | None = None
        self.server_pid: int | None = None  # a Spark Connect server the daemon talks to (its memory is reported too)

    def start(self) -> None:
        self.started_at = time.time()
        self._stopped_applies = None
        log = (self.workdir / "daemon.log").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "lakemirror.daemon.cli", "run", str(self.config)],
                                     stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def url(self) -> str | None:
        try:
            return json.loads((self.workdir / "ck" / "bench" / "daemon.json").read_text())["url"]  # type: ignore[no-any-return]
        except (OSError, ValueError, KeyError):
            return None

    def status(self) -> dict[str, Any]:
        url = self.url()
        if url is None:
            return {}
        try:
            with urllib.request.urlopen(f"{url}/status", timeout=5) as resp:
                return {t["table"]: t for t in json.load(resp)["tables"]}
        except OSError:
            return {}

    def wait_through(self, versions: dict[str, int], timeout: float) -> float:
        """Seconds until every table has applied through its version (raises on timeout)."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            assert self.proc is not None and self.proc.poll() is None, "the daemon died: see daemon.log"
            st = self.status()
            if all(st.get(t, {}).get("state") == "running" and _through(st[t]) >= v for t, v in versions.items()):
                return time.time() - t0
            time.sleep(0.2)
        raise TimeoutError(f"lakemirror did not reach {versions} in {timeout}s: {self.status()}")

    def scrape_lag(self) -> None:
        def loop() -> None:
            while not self._scrape_stop.wait(1.0):
                url = self.url()
                if not url:
                    continue
                try:
                    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
                        text = resp.read().decode()
                except OSError:
                    continue
                values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                          if line.startswith("lakemirror_lag_seconds{")]
                if values:
                    self.metric_lag.append((time.time(), max(values)))
        threading.Thread(target=loop, daemon=True).start()

    def stop(self) -> None:
        self._scrape_stop.set()
        self._stopped_applies = {}  # the daemon writes no more: each table's applies are read once
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(180)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def apply_paths(self) -> dict[str, dict[str, Any]]:
        """How each table's batches reach its replica, while the daemon runs: ``detail.apply`` of its
        ``/status`` where the daemon reports it, else the last apply path its log names for the table
        ("table src.bench.<t>: applies …", the chooser's reason)."""
        status = self.status()
        logged = logged_apply_reasons(self.workdir / "daemon.log")
        out: dict[str, dict[str, Any]] = {}
        for table in self.tables:
            detail = (status.get(table) or {}).get("detail") or {}
            apply = detail.get("apply") if isinstance(detail, dict) else None
            if isinstance(apply, dict) and apply.get("reason"):
                out[table] = {"path": apply_path_of(str(apply["reason"])), "reason": apply["reason"],
                              "from": "status", **{k: v for k, v in apply.items() if k not in ("path", "reason")}}
            elif table in logged:
                out[table] = {"path": apply_path_of(logged[table]), "reason": logged[table], "from": "log"}
        return out

    def replica_path(self, table: str) -> Path:
        return self.warehouse / self.destination_catalog / "bench" / table

    def bootstrap_seconds(self, table: str) -> float | None:
        """From the daemon's log: the snapshot copy's start to its end (the replica written and stamped)."""
        marks = self.bootstrap_marks(table)
        return round(marks["done"] - marks["start"], 2) if len(marks) == 2 else None

    def bootstrap_marks(self, table: str) -> dict[str, float]:
        """From the daemon's log: the times (seconds since the epoch) of the table's first
        "bootstrapping" line (``start``) and first "bootstrapped" line (``done``), those present."""
        from datetime import datetime

        marks: dict[str, float] = {}
        log = self.workdir / "daemon.log"
        for line in (log.read_text(errors="replace") if log.is_file() else "").splitlines():
            for mark, text in (("start", f"table src.bench.{table}: bootstrapping "),
                               ("done", f"table src.bench.{table}: bootstrapped ")):
                if text in line and mark not in marks:
                    marks[mark] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        return marks

    @property
    def checkpoint_table(self) -> Path:
        return self.warehouse / self.destination_catalog / "continuous_sync" / "checkpoints"

    def batches(self, since: float) -> dict[str, Any]:
        return batch_summary(self.checkpoint_table, since)

    def checkpoint_rows(self, columns: list[str]) -> pa.Table:
        return DeltaTable(str(self.checkpoint_table)).to_pyarrow_table(columns=columns)

    def commit_files(self, table: str) -> list[tuple[float, str]]:
        """The replica's commit files, oldest first: (the time the file appeared, its text)."""
        return [(commit.stat().st_mtime, commit.read_text())
                for commit in sorted((self.replica_path(table) / LOG_DIR).glob("*.json"))]

    def applies(self, table: str) -> list[Apply]:
        """The replica's MERGE commits (file time) mapped to the source version each batch reached."""
        if self._stopped_applies is not None:
            if table not in self._stopped_applies:
                self._stopped_applies[table] = self._read_applies(table)
            return self._stopped_applies[table]
        return self._read_applies(table)

    def _read_applies(self, table: str) -> list[Apply]:
        reached: dict[int, int] = {}
        ck = self.checkpoint_rows(["source_fqn", "batch_id", "epoch", "last_committed_version", "error"])
        for row in ck.to_pylist():
            if row["source_fqn"].endswith(f".{table}") and row["error"] is None and row["batch_id"] >= 0:
                reached[row["batch_id"]] = row["last_committed_version"]
        out = []
        for appeared, text in self.commit_files(table):
            for line in text.splitlines():
                info = json.loads(line).get("commitInfo")
                if info and info.get("userMetadata"):
                    batch = json.loads(info["userMetadata"]).get("batch")
                    if batch in reached:
                        out.append(Apply(appeared, reached[batch]))
        return out


#: The apply paths a replica's batches take, as the chooser's reason names them
#: (lakemirror.sinks.merge.apply_choice): the driver's delta-rs MERGE, Spark's rewrite, Spark's MERGE.
DRIVER_PATH, SPARK_REWRITE, SPARK_MERGE = "driver (delta-rs MERGE)", "Spark rewrite", "Spark MERGE"


def apply_path_of(reason: str) -> str:
    """The apply path a chooser's reason names (e.g. "applies on the driver by a delta-rs MERGE …")."""
    if "on the driver by a delta-rs MERGE" in reason:
        return DRIVER_PATH
    if "rewriting the replica with Spark" in reason:
        return SPARK_REWRITE
    if "MERGE" in reason:
        return SPARK_MERGE
    return "unknown"


def logged_apply_reasons(log: Path) -> dict[str, str]:
    """Each table's last apply-path line in a daemon log: ``table src.bench.<t>: applies …``."""
    out: dict[str, str] = {}
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        marker = line.find("table src.bench.")
        if marker < 0:
            continue
        table, _, reason = line[marker + len("table src.bench."):].partition(": ")
        if reason.startswith("applies "):
            out[table] = reason.strip()
    return out


def batch_summary(checkpoint_table: Path | str, since: float,
                  storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    """What lakemirror's batches started at or after ``since`` cost, from its checkpoint rows:
    how many, how long each took (the apply's start, whichever path, to checkpoint row), how many source versions and
    change rows each carried."""
    rows = [r for r in DeltaTable(str(checkpoint_table), storage_options=storage_options).to_pyarrow_table(
        columns=["started_at", "ended_at", "first_version", "last_version", "rows_read", "error"]).to_pylist()
        if r["error"] is None and r["rows_read"] and r["started_at"].timestamp() >= since]
    if not rows:
        return {"batches": 0}
    seconds = sorted((r["ended_at"] - r["started_at"]).total_seconds() for r in rows)
    versions = sorted(r["last_version"] - r["first_version"] + 1 for r in rows)
    change_rows = sorted(r["rows_read"] for r in rows)
    return {"batches": len(rows), "seconds_p50": seconds[len(seconds) // 2],
            "seconds_p90": seconds[int(len(seconds) * 0.9)], "versions_p50": versions[len(versions) // 2],
            "change_rows_p50": change_rows[len(change_rows) // 2]}


class LocalSite:
    """Where the steady workload keeps its tables: the driver's local disk (a lakehouse folder of the
    run's working directory). bench/production.py's ``S3Site`` keeps them on an S3 server instead."""

    storage_options: dict[str, str] = {}
    #: The sources' table properties besides the change feed (delta-rs's defaults here).
    source_properties: dict[str, str] = {}

    def warehouse(self, workdir: Path) -> Path:
        return workdir / "lakehouse"

    def uri(self, warehouse: Any, catalog: str, table: str) -> Path:
        """Where delta-rs finds ``catalog.bench.table``."""
        return Path(warehouse) / catalog / "bench" / table

    def source(self, warehouse: Any, table: str, rows: int) -> SourceTable:
        """The source ``src.bench.<table>``, written by delta-rs."""
        return SourceTable(self.uri(warehouse, "src", table), rows, storage_options=self.storage_options,
                           properties=self.source_properties)

    def own_process(self, system: str) -> bool:
        """Whether ``system`` runs as a process of its own (built by :meth:`daemon`)."""
        return system.startswith("lakemirror")

    def daemon(self, system: str, workdir: Path, warehouse: Any, tables: list[str],
               trigger: float) -> LakemirrorDaemon:
        return LakemirrorDaemon(workdir, warehouse, tables, trigger, variant=system if system in VARIANTS else None)


def _through(view: dict[str, Any]) -> int:
    value = view.get("applied_through")
    return -1 if value is None else int(value)


# -- delta-rs -----------------------------------------------------------------------------------

def plain_strings(table: pa.Table) -> pa.Table:
    """delta-rs reads strings as ``string_view``, which some Arrow kernels do not take yet."""
    schema = pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f for f in table.schema])
    return table.cast(schema)


def latest_per_key(changes: pa.Table) -> pa.Table:
    """One row per id: the last change by (_commit_version, rank of the change type)."""
    changes = plain_strings(changes)
    changes = changes.filter(pc.field("_change_type") != "update_preimage")
    rank = pa.array([RANK[c] for c in changes.column("_change_type").to_pylist()], pa.int8())
    changes = changes.append_column("_rank", rank).sort_by([("id", "ascending"), ("_commit_version", "ascending"),
                                                             ("_rank", "ascending")])
    cols = ["v", "payload", "_change_type"]
    latest = changes.group_by("id", use_threads=False).aggregate([(c, "last") for c in cols])
    return latest.rename_columns(["id", *cols])


def merge_changes(replica: Path | str, latest: pa.Table, storage_options: dict[str, str] | None = None) -> None:
    (DeltaTable(str(replica), storage_options=storage_options).merge(latest, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_delete(predicate="s._change_type = 'delete'")
     .when_matched_update(updates={"v": "s.v", "payload": "s.payload"}, predicate="s._change_type != 'delete'")
     .when_not_matched_insert(updates={"id": "s.id", "v": "s.v", "payload": "s.payload"},
                              predicate="s._change_type != 'delete'")
     .execute())


class DeltaRsLoop:
    name = "delta-rs CDF loop"

    def __init__(self, sources: dict[str, Path], replicas: dict[str, Path], trigger_seconds: float,
                 storage_options: dict[str, str] | None = None) -> None:
        self.sources, self.replicas, self.trigger = sources, replicas, trigger_seconds
        self.options = storage_options or {}  # delta-rs's, for tables on object storage (s3://)
        self.applied: dict[str, int] = {}
        self.events: dict[str, list[Apply]] = {t: [] for t in sources}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def bootstrap(self) -> None:
        for t, src in self.sources.items():
            dt = DeltaTable(str(src), storage_options=self.options)
            self.applied[t] = int(dt.version())
            write_deltalake(str(self.replicas[t]), dt.to_pyarrow_table(), mode="overwrite",
                            storage_options=self.options)

    def sweep(self, table: str) -> int:
        dt = DeltaTable(str(self.sources[table]), storage_options=self.options)
        head = int(dt.version())
        if head <= self.applied[table]:
            return 0
        changes = pa.table(dt.load_cdf(starting_version=self.applied[table] + 1, ending_version=head))
        latest = latest_per_key(changes)
        merge_changes(self.replicas[table], latest, self.options)
        self.applied[table] = head
        self.events[table].append(Apply(time.time(), head))
        return changes.num_rows

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                t0 = time.time()
                for t in self.sources:
                    self.sweep(t)
                self._stop.wait(max(0.0, self.trigger - (time.time() - t0)))
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)

    def applies(self, table: str) -> list[Apply]:
        return self.events[table]


class FullRefresh(DeltaRsLoop):
    name = "full refresh"

    def sweep(self, table: str) -> int:
        dt = DeltaTable(str(self.sources[table]), storage_options=self.options)
        head = int(dt.version())
        if head <= self.applied[table]:
            return 0
        data = dt.to_pyarrow_table()
        write_deltalake(str(self.replicas[table]), data, mode="overwrite", storage_options=self.options)
        self.applied[table] = head
        self.events[table].append(Apply(time.time(), head))
        return data.num_rows
