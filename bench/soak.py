"""`make bench ONLY=soak`: one lakemirror path on S3 for an hour, watched for growth.

The production workload's writer and site (bench/production.py) at 4 tables for 60 minutes after the
warm-up, with one lakemirror row (default: the Spark-only path, ``--soak-row driver`` for the S3
driver path) and the sources written by delta-rs (``--soak-writer spark`` for Spark's writer).
While it runs, every ``sample_seconds``: the resident memory (``VmRSS``) of the daemon's Python
process and of its JVM (and a Spark Connect server's, if any); for each replica and for the
daemon's checkpoint table, the files of its current snapshot, the data objects under it (every
version's files until a VACUUM removes them) and the objects and bytes of its ``_delta_log``.
Afterwards: each batch's cost from the checkpoint rows (the apply's start to its checkpoint row)
and each source commit's lag.

Judged (:func:`summarize`): the median batch of the last ``window_minutes`` against the first's (goal
<= 1.2x), the median RSS of each process kind over the same windows (goal: flat within 15%), and
how the file counts and log size grew per hour.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Iterable, Sequence

from bench.big import process_tree_mib
from bench.production import BUCKET, ROWS, S3Server, S3Site
from lakemirror.delta_log.layout import LOG_DIR

#: The soak's goals: the last window's median batch at most this times the first's, and each
#: process kind's median RSS within this fraction of the first window's.
BATCH_GROWTH_LIMIT = 1.2
RSS_FLAT_WITHIN = 0.15


def parameters(quick: bool) -> dict[str, Any]:
    """The full soak is 60 minutes measured at 4 tables of 100,000 rows (about 70 minutes with the
    start, warm-up and drain); ``quick``: 3 minutes at 2 tables of 10,000 (about 5)."""
    if quick:
        return {"tables": 2, "rows": 10_000, "minutes": 3.0, "window_minutes": 1.0, "sample_seconds": 10.0,
                "warmup": 10.0, "drain": 90.0, "fraction": 0.01, "trigger": 1.0, "row": "spark",
                "writer": "delta-rs"}
    return {"tables": 4, "rows": 100_000, "minutes": 60.0, "window_minutes": 10.0, "sample_seconds": 60.0,
            "warmup": 60.0, "drain": 300.0, "fraction": 0.01, "trigger": 1.0, "row": "spark", "writer": "delta-rs"}


def table_storage(store: Any, key: str, active_files: int | None) -> dict[str, Any]:
    """One table's objects under ``key`` in ``store``: data objects and bytes (outside ``_delta_log``),
    log objects and bytes, checkpoints in the log, and the files of its current snapshot."""
    data = data_bytes = log = log_bytes = checkpoints = 0
    for obj in store.objects(f"{key}/"):
        name, size = obj
        if f"{key}/{LOG_DIR}/" in name:
            log += 1
            log_bytes += size
            checkpoints += ".checkpoint" in name
        else:
            data += 1
            data_bytes += size
    return {"active_files": active_files, "data_objects": data, "data_bytes": data_bytes, "log_objects": log,
            "log_bytes": log_bytes, "checkpoints": checkpoints}


class SizedS3Store:
    """The keys and sizes of a bucket's objects under a prefix."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client, self.bucket = client, bucket

    def objects(self, prefix: str) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.extend((o["Key"], int(o["Size"])) for o in page.get("Contents", ()))
        return out


class SoakMonitor:
    """Samples memory and storage while the soak runs (``start`` / ``finish``, for ``steady_lag``)."""

    def __init__(self, site: S3Site, every: float) -> None:
        self.site, self.every = site, every
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._tables: dict[str, str] = {}

    def start(self, runner: Any, replicas: dict[str, str]) -> None:
        self._runner = runner
        self._tables = dict(replicas)
        checkpoint_table = getattr(runner, "checkpoint_table", None)
        if isinstance(checkpoint_table, str):
            self._tables["checkpoint table"] = checkpoint_table
        store = SizedS3Store(self.site.s3.client(), BUCKET)

        def loop() -> None:
            while True:
                self.samples.append(self.sample(store))
                if self._stop.wait(self.every):
                    return
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def sample(self, store: SizedS3Store) -> dict[str, Any]:
        from deltalake import DeltaTable

        at = time.time()
        runner = self._runner
        rss = process_tree_mib(runner.proc.pid) if runner.proc is not None else {}
        if getattr(runner, "server_pid", None):
            rss.update({f"server {k}": v for k, v in process_tree_mib(runner.server_pid).items()})
        tables: dict[str, Any] = {}
        for name, uri in self._tables.items():
            key = uri.split(f"{BUCKET}/", 1)[1]
            try:
                active: int | None = len(DeltaTable(uri, storage_options=self.site.storage_options).file_uris())
            except Exception:  # noqa: BLE001 (a table read mid-commit or not created yet: counted next time)
                active = None
            tables[name] = table_storage(store, key, active)
        return {"at": at, "rss_mib": rss, "tables": tables}

    def finish(self, runner: Any) -> dict[str, Any]:
        """Stops sampling; the samples and every batch's (start, seconds) from the checkpoint rows."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)
        batches: list[tuple[float, float]] = []
        if hasattr(runner, "checkpoint_rows"):
            rows = runner.checkpoint_rows(["started_at", "ended_at", "rows_read", "error", "batch_id"]).to_pylist()
            batches = sorted((r["started_at"].timestamp(), (r["ended_at"] - r["started_at"]).total_seconds())
                             for r in rows if r["error"] is None and r["rows_read"] and r["batch_id"] >= 0)
        return {"samples": self.samples, "batches": batches}


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(last: float | None, first: float | None) -> float | None:
    return last / first if last is not None and first else None


def summarize(*, batches: Iterable[Sequence[float]], samples: Sequence[dict[str, Any]],
              series: Iterable[Sequence[float]], measured_from: float, writer_started: float,
              writer_stopped: float, window: float) -> dict[str, Any]:
    """The soak's figures (pure): batch cost, lag and RSS in the first and the last ``window``
    seconds of the measured time (``measured_from`` to ``writer_stopped``), with the goals judged;
    storage at the first and the last sample and its growth per hour.

    ``batches``: (start time, seconds); ``samples``: :meth:`SoakMonitor.sample`'s; ``series``: (source
    commit time relative to ``writer_started``, its lag)."""
    first = (measured_from, measured_from + window)
    last = (writer_stopped - window, writer_stopped + 1e-9)  # the last window includes its end

    def inside(t: float, span: tuple[float, float]) -> bool:
        return span[0] <= t < span[1]

    batches = [(float(s), float(d)) for s, d in batches]
    lags = [(writer_started + float(t), float(lag)) for t, lag in series]
    out: dict[str, Any] = {"window_seconds": window, "measured_seconds": writer_stopped - measured_from}
    b_first = _median([d for s, d in batches if inside(s, first)])
    b_last = _median([d for s, d in batches if inside(s, last)])
    ratio = _ratio(b_last, b_first)
    out["batch_seconds"] = {"first_p50": b_first, "last_p50": b_last, "ratio": ratio,
                            "first_count": sum(inside(s, first) for s, _ in batches),
                            "last_count": sum(inside(s, last) for s, _ in batches),
                            "goal": BATCH_GROWTH_LIMIT, "met": None if ratio is None else ratio <= BATCH_GROWTH_LIMIT}
    out["lag_seconds"] = {
        name: {"p50": _median([lag for t, lag in lags if inside(t, span)]),
               "max": max((lag for t, lag in lags if inside(t, span)), default=None)}
        for name, span in (("first", first), ("last", last))}
    kinds = sorted({k for s in samples for k in s.get("rss_mib", {})})
    rss: dict[str, Any] = {}
    for kind in kinds:
        a = _median([s["rss_mib"][kind] for s in samples if kind in s["rss_mib"] and inside(s["at"], first)])
        z = _median([s["rss_mib"][kind] for s in samples if kind in s["rss_mib"] and inside(s["at"], last)])
        r = _ratio(z, a)
        rss[kind] = {"first_median": a, "last_median": z, "ratio": r,
                     "met": None if r is None else abs(r - 1) <= RSS_FLAT_WITHIN}
    out["rss_mib"] = rss
    out["rss_met"] = None if not rss or any(v["met"] is None for v in rss.values()) else all(
        v["met"] for v in rss.values())
    if samples:
        a, z = samples[0], samples[-1]
        hours = max((z["at"] - a["at"]) / 3600, 1e-9)
        storage: dict[str, Any] = {}
        for name in sorted(z["tables"]):
            before, after = a["tables"].get(name, {}), z["tables"][name]
            storage[name] = {"first": before, "last": after, "per_hour": {
                k: (after[k] - before[k]) / hours for k in ("data_objects", "log_objects", "log_bytes", "active_files")
                if isinstance(after.get(k), (int, float)) and isinstance(before.get(k), (int, float))}}
        out["storage"] = storage
    return out


def timeline(samples: Sequence[dict[str, Any]], batches: Iterable[Sequence[float]], every: float,
             start: float) -> list[dict[str, Any]]:
    """One point per ``every`` seconds from ``start``: the last sample in it (replicas summed apart
    from the checkpoint table) and the median batch started in it (pure)."""
    batches = [(float(s), float(d)) for s, d in batches]
    if not samples:
        return []
    end = samples[-1]["at"]
    out = []
    t = start
    while t < end + every:
        inside = [s for s in samples if t - every < s["at"] <= t] if t > start else [
            s for s in samples if s["at"] <= t]
        if inside:
            s = inside[-1]
            replicas = [v for k, v in s["tables"].items() if k != "checkpoint table"]

            def total(key: str, rows: list[dict[str, Any]] = replicas) -> int | None:
                values = [r.get(key) for r in rows]
                return None if any(v is None for v in values) else sum(int(v) for v in values)  # type: ignore[arg-type]
            ck = s["tables"].get("checkpoint table", {})
            out.append({"minute": round((t - start) / 60, 1),
                        "batch_p50": _median([d for b, d in batches if t - every < b <= t]),
                        "active_files": total("active_files"), "data_objects": total("data_objects"),
                        "log_objects": total("log_objects"), "log_mib": (total("log_bytes") or 0) / 2**20,
                        "checkpoint_table_log_objects": ck.get("log_objects"),
                        "rss_mib": dict(s.get("rss_mib", {}))})
        t += every
    return out


def soak(p: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The soak run (one result, the steady workload's with the soak's figures under ``soak``)."""
    import os
    import subprocess

    from bench.__main__ import steady_lag

    row = ROWS[p["row"]]
    if row.kind != "lakemirror":
        raise ValueError(f"the soak runs a lakemirror row, not {p['row']!r}")
    s3 = S3Server()
    s3.start()
    site = S3Site(s3, writer=p["writer"])
    connect = None
    load, at = list(os.getloadavg()), time.time()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"soak, {p['minutes']:.0f} minutes, {p['tables']} tables, sources written by {p['writer']}: {row.name} ...",
          flush=True)
    try:
        if row.connect:
            from bench.production import ConnectServer

            connect = ConnectServer(s3)
            connect.start()
            site.connect = connect
        monitor = SoakMonitor(site, p["sample_seconds"])
        result = steady_lag(row.name, p["tables"], p["rows"], p["minutes"] * 60, p["fraction"], p["trigger"], seed,
                            p["warmup"], site=site, drain_seconds=p["drain"], monitor=monitor)
    finally:
        if connect is not None:
            connect.stop()
        site.close()
        s3.stop()
    watched = result.pop("monitor", {"samples": [], "batches": []})
    result["soak"] = summarize(batches=watched["batches"], samples=watched["samples"], series=result["series"],
                               measured_from=result["measured_from"], writer_started=result["writer_started"],
                               writer_stopped=result["writer_stopped"], window=p["window_minutes"] * 60)
    result["soak"]["timeline"] = timeline(watched["samples"], watched["batches"],
                                          max(p["sample_seconds"], p["minutes"] * 60 / 12), result["measured_from"])
    result.update(writer=p["writer"], row=p["row"], measured_at=at, load_average_at_start=load, uptime_at_start=uptime,
                  load_average_at_end=list(os.getloadavg()), soak_parameters=p)
    print(f"  {result['soak']['batch_seconds']} {result['soak']['rss_met']}", flush=True)
    return [result]


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _verdict(met: bool | None) -> str:
    return "not judged" if met is None else ("met" if met else "**missed**")


def render(runs: list[dict[str, Any]]) -> list[str]:
    """docs/BENCHMARKS.md's section for the soak (pure)."""
    lines = ["## Soak: one hour on S3"]
    for r in runs:
        if "error" in r or "soak" not in r:
            lines += ["", f"- {r.get('system', '?')}: the soak failed: {r.get('error', 'no figures')}"]
            continue
        s, q = r["soak"], r.get("soak_parameters", {})
        window = s["window_seconds"] / 60
        b = s["batch_seconds"]
        lines += ["", f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(r['measured_at']))}, `uptime` at "
                  f"start: `{r.get('uptime_at_start', '?')}`. {r['system']}, {r['tables']} tables of "
                  f"{r['rows_per_table']:,} rows on moto's S3 server, sources written by {r.get('writer', 'delta-rs')}, "
                  f"the production workload's writer (one MERGE per table a second touching "
                  f"{q.get('fraction', 0.01):.0%} of its rows) for {s['measured_seconds'] / 60:.0f} minutes after "
                  f"{r.get('warmup_seconds', 0):.0f} s of warm-up; memory and storage sampled every "
                  f"{q.get('sample_seconds', 0):.0f} s; batches from the checkpoint rows (the apply's start to its "
                  f"checkpoint row). First and last windows: {window:.0f} minutes each.", "",
                  "| measure | first window | last window | last / first | goal | verdict |",
                  "|---|---|---|---|---|---|",
                  f"| batch seconds, p50 ({b['first_count']} and {b['last_count']} batches) | {_f(b['first_p50'])} | "
                  f"{_f(b['last_p50'])} | {_f(b['ratio'])} | <= {BATCH_GROWTH_LIMIT:.1f} | {_verdict(b['met'])} |"]
        for kind, m in s["rss_mib"].items():
            lines.append(f"| RSS MiB, {kind} (median) | {_f(m['first_median'], 0)} | {_f(m['last_median'], 0)} | "
                         f"{_f(m['ratio'])} | within {RSS_FLAT_WITHIN:.0%} | {_verdict(m['met'])} |")
        lag_first, lag_last = s["lag_seconds"]["first"], s["lag_seconds"]["last"]
        lines.append(f"| lag of a source commit, p50 (max) s | {_f(lag_first['p50'])} ({_f(lag_first['max'])}) | "
                     f"{_f(lag_last['p50'])} ({_f(lag_last['max'])}) | "
                     f"{_f(_ratio(lag_last['p50'], lag_first['p50']))} | - | - |")
        lines += ["", f"Replicas exact after the drain: {'yes' if r.get('replicas_equal_sources') else 'NO'}; "
                      f"source commits {r.get('source_commits')}, unapplied {r['lag']['unapplied']}.", ""]
        storage = s.get("storage") or {}
        if storage:
            lines += ["Storage at the first and the last sample, and its growth per hour:", "",
                      "| table | files in snapshot | data objects | log objects | log MiB | checkpoints |",
                      "|---|---|---|---|---|---|"]
            for name, st in storage.items():
                a, z, h = st["first"], st["last"], st["per_hour"]

                def cell(key: str, scale: float = 1.0, a: dict[str, Any] = a, z: dict[str, Any] = z,
                         h: dict[str, Any] = h) -> str:
                    if a.get(key) is None or z.get(key) is None:
                        return "-"
                    growth = f" ({h[key] / scale:+.1f}/h)" if key in h else ""
                    return f"{a[key] / scale:.1f} -> {z[key] / scale:.1f}{growth}" if scale != 1 else \
                        f"{a[key]} -> {z[key]}{growth}"
                lines.append(f"| {name} | {cell('active_files')} | {cell('data_objects')} | {cell('log_objects')} | "
                             f"{cell('log_bytes', 2**20)} | {a.get('checkpoints', '-')} -> {z.get('checkpoints', '-')} |")
            lines.append("")
        points = s.get("timeline") or []
        if points:
            kinds = sorted({k for pt in points for k in pt["rss_mib"]})
            lines += ["Over time (replicas summed; the checkpoint table apart):", "",
                      "| minute | batch s p50 | files in snapshot | data objects | log objects | log MiB | "
                      "checkpoint table log objects | " + " | ".join(f"RSS {k} MiB" for k in kinds) + " |",
                      "|" + "---|" * (7 + len(kinds))]
            for pt in points:
                lines.append(f"| {pt['minute']} | {_f(pt['batch_p50'])} | {pt['active_files'] if pt['active_files'] is not None else '-'} | "
                             f"{pt['data_objects']} | {pt['log_objects']} | {pt['log_mib']:.1f} | "
                             f"{pt['checkpoint_table_log_objects'] if pt['checkpoint_table_log_objects'] is not None else '-'} | "
                             + " | ".join(_f(pt["rss_mib"].get(k), 0) for k in kinds) + " |")
    return lines
