"""`make bench` (`python -m bench [--quick]`): lakemirror against its baselines on the same data.

Writes docs/BENCHMARKS.md (figures, ratios, the machine), docs/bench/results.json (raw figures)
and docs/bench/lag.png (lag of every source commit over time, per system).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from bench.apply_cost import apply_cost
from bench.big import WARMUP_COMMITS, bootstrap, peak_resident_mib, steady_cost
from bench.debezium_events import debezium_events, render as render_debezium_events
from bench.kafka_postgres_latency import kafka_postgres_latency, render as render_kafka_postgres
from bench.key_lookup import key_lookup
from bench.measure import percentile, sampled_lag, summarize_runs
from bench.postgres_modes import postgres_modes, render as render_postgres_modes
from bench.postgres_sink import postgres_throughput, render as render_postgres
from bench.production import DEFAULT_ROWS, ROWS as PRODUCTION_ROWS, merge_runs, parameters as production_parameters, plan, production
from bench.spark_writer import WRITERS
from bench.production_report import render as render_production
from bench.report import Section, assemble, kept_blocks
from bench.soak import parameters as soak_parameters, render as render_soak, soak
from bench.systems import VARIANTS, DeltaRsLoop, FullRefresh, LakemirrorDaemon, LocalSite
from bench.workload import SourceTable, same_rows, table_path

ROOT = Path(__file__).resolve().parent.parent


def machine() -> dict[str, Any]:
    import deltalake
    import pyspark

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": os.cpu_count(), "memory_gib": round(memory, 1), "python": platform.python_version(),
            "pyspark": pyspark.__version__, "deltalake": deltalake.__version__, "kernel": platform.release(),
            "load_average_at_start": os.getloadavg()}


# -- steady lag ---------------------------------------------------------------------------------

#: The baselines that run in the benchmark's process, by the names the workloads give them.
BASELINES: dict[str, type[DeltaRsLoop]] = {"delta-rs": DeltaRsLoop, "delta-rs CDF loop": DeltaRsLoop,
                                           "full refresh": FullRefresh}


def baseline_runner(system: str) -> type[DeltaRsLoop]:
    """The in-process baseline named ``system``: the delta-rs CDF loop (whose name differs between the
    local workloads and the production rows) or the full refresh; an unknown name is an error, never
    silently the full refresh."""
    try:
        return BASELINES[system]
    except KeyError:
        raise ValueError(f"no in-process baseline named {system!r}; known: {sorted(BASELINES)}") from None


def steady_lag(system: str, tables: int, rows: int, seconds: float, fraction: float, trigger: float,
               seed: int, warmup: float = 0.0, site: Any = None, drain_seconds: float | None = None,
               monitor: Any = None) -> dict[str, Any]:
    """Lag of every source commit while a writer changes every table once a second.

    The writer runs ``warmup`` seconds before the measured ``seconds``: a long-running daemon's
    JVM has compiled its hot code long since, one just started has not (on two cores its JIT
    compiler takes about half the CPU for the first minutes). Commits of the warm-up are
    reported apart, never mixed into the steady figures.

    ``site`` keeps the tables, writes the sources and builds the systems that run as processes of
    their own (lakemirror's daemon; on S3 also the user's recipe): the driver's local disk
    (``LocalSite``, the default) or an S3 server (bench/production.py). ``drain_seconds``: how
    long the system may take after the writer stops (default ``DRAIN_SECONDS``). ``monitor``
    (bench/soak.py): started once every replica is ready (``start(runner, replicas)``), finished
    before the system stops (``finish(runner)``, whose answer is the result's ``monitor``).
    """
    site = site or LocalSite()
    drain = DRAIN_SECONDS if drain_seconds is None else drain_seconds
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{system.split()[0].strip(',')}-"))
    warehouse = site.warehouse(workdir)
    options = site.storage_options
    names = [f"t{i:02d}" for i in range(tables)]
    sources = {t: site.source(warehouse, t, rows) for t in names}
    for s in sources.values():
        s.create()
    replicas = {t: site.uri(warehouse, "dst", t) for t in names}
    runner: Any
    lakemirror = system.startswith("lakemirror")
    own_process = site.own_process(system)  # lakemirror's daemon, the user's recipe: a process and JVM each
    if own_process:
        runner = site.daemon(system, workdir, warehouse, names, trigger)
        runner.start()
        ready = runner.wait_through({t: s.version() for t, s in sources.items()}, timeout=600)
        if lakemirror:
            runner.scrape_lag()
    else:
        loop = baseline_runner(system)
        runner = loop({t: s.path for t, s in sources.items()}, replicas,
                      trigger if loop is DeltaRsLoop else 0.0, options)
        t0 = time.time()
        runner.bootstrap()
        ready = time.time() - t0
        runner.start()
    if monitor is not None:
        monitor.start(runner, replicas)
    rng = random.Random(seed)
    started = time.time()
    stamp = 0
    change_rows = 0
    measured_from = started + warmup
    while time.time() - started < warmup + seconds:
        tick = time.time()
        stamp += 1
        for s in sources.values():
            change_rows += s.change(rng, fraction, stamp)
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    writer_stopped = time.time()
    finals = {t: s.version() for t, s in sources.items()}
    drained = True
    extra: dict[str, Any] = {}
    if own_process:
        try:
            runner.wait_through(finals, timeout=drain)
        except TimeoutError:
            drained = False  # what was not applied by then is counted as unapplied, never dropped
        runner.peak_memory = peak_resident_mib(runner.proc.pid)
        for name, mib in peak_resident_mib(runner.server_pid).items() if runner.server_pid else ():
            runner.peak_memory[f"server {name}"] = mib  # a Spark Connect server's JVM and Python workers
        if lakemirror:
            extra["apply_paths"] = runner.apply_paths()  # how each table's batches reached its replica
        if monitor is not None:
            extra["monitor"] = monitor.finish(runner)
    else:
        deadline = time.time() + drain
        while time.time() < deadline and any(runner.applied[t] < v for t, v in finals.items()):
            time.sleep(0.2)
        drained = all(runner.applied[t] >= v for t, v in finals.items())
    runner.stop()
    def window(commits: dict[int, float], steady: bool) -> dict[int, float]:
        return {v: t for v, t in commits.items() if (t >= measured_from) == steady}
    summary = summarize_runs((window(sources[t].commits, True), runner.applies(t)) for t in names)
    exact = drained and all(same_rows(sources[t].path, replicas[t], options) for t in names)
    result: dict[str, Any] = {
        "system": runner.name, "tables": tables, "rows_per_table": rows, "seconds": seconds,
        "source_commits": sum(len(s.commits) for s in sources.values()), "change_rows_written": change_rows,
        "ready_seconds": round(ready, 2), "lag": summary.as_dict(), "replicas_equal_sources": exact,
        "warmup_seconds": warmup, "drained_within_seconds": drain if drained else None, "drain_seconds": drain,
        "measured_from": measured_from, "writer_started": started, "writer_stopped": writer_stopped, **extra,
        "warmup_lag": summarize_runs((window(sources[t].commits, False), runner.applies(t)) for t in names).as_dict()
        if warmup else None,
        "series": sorted((t_made - started, lag) for t in names
                         for v, t_made in sources[t].commits.items()
                         for lag in [_lag_of(v, t_made, runner.applies(t))] if lag is not None),
    }
    if own_process:
        result["batches"] = runner.batches(since=measured_from)
        result["peak_resident_mib"] = runner.peak_memory
    if lakemirror:
        scrapes = [(at, v) for at, v in runner.metric_lag if at >= measured_from]
        metric = [v for _, v in scrapes]
        # The same statistic from outside, at the moments of the scrapes: the oldest commit not yet on
        # the replica, of every commit made (the warm-up's too, as the daemon counts them), each source
        # commit at its own commit time as the daemon prices it, as each replica commit is taken at its
        # own (one clock at both ends; the writer's return comes after the put and any checkpoint).
        stamped = {t: _stamped(sources[t]) for t in names}
        outside = sampled_lag(((stamped[t], runner.applies(t)) for t in names), [at for at, _ in scrapes])
        result["daemon_metric_lag"] = {"samples": len(metric), "max": max(metric) if metric else None,
                                       "mean": sum(metric) / len(metric) if metric else None,
                                       "p50": percentile(metric, 50) if metric else None,
                                       "outside_max": max(outside) if outside else None,
                                       "outside_mean": sum(outside) / len(outside) if outside else None,
                                       "outside_p50": percentile(outside, 50) if outside else None,
                                       "outside_clock": "commit time"}
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def _stamped(source: Any) -> dict[int, float]:
    """The source's commits at their own commit times, where its history gives them (else as written)."""
    stamps = source.commit_stamps()
    return {v: stamps.get(v, made) for v, made in source.commits.items()}


def _lag_of(version: int, made: float, applies: list[Any]) -> float | None:
    hits = [a.at - made for a in applies if a.through >= version and a.at >= made]
    return min(hits) if hits else None


# -- catch-up -------------------------------------------------------------------------------------

def catch_up(system: str, rows: int, commits: int, fraction: float, seed: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-catchup-{system.split()[0].strip(',')}-"))
    warehouse = workdir / "lakehouse"
    src = SourceTable(table_path(warehouse, "src", "bench", "big"), rows)
    src.create()
    replica = table_path(warehouse, "dst", "bench", "big")
    rng = random.Random(seed)
    result: dict[str, Any] = {"system": system, "rows": rows, "backlog_commits": commits}
    if system.startswith("lakemirror"):
        variant = system if system in VARIANTS else None
        daemon = LakemirrorDaemon(workdir, warehouse, ["big"], trigger_seconds=1.0, variant=variant)
        daemon.start()
        daemon.wait_through({"big": src.version()}, timeout=600)
        daemon.stop()
        changed = sum(src.change(rng, fraction, i + 1) for i in range(commits))
        daemon2 = LakemirrorDaemon(workdir, warehouse, ["big"], trigger_seconds=1.0, variant=variant)
        daemon2.start()
        wall = daemon2.wait_through({"big": src.version()}, timeout=1800)
        daemon2.stop()
        ck = DeltaTable(str(warehouse / "dst" / "continuous_sync" / "checkpoints")).to_pyarrow_table().to_pylist()
        batches = [r for r in ck if r["error"] is None and r["batch_id"] >= 0 and r["rows_read"]]
        drain = max(r["ended_at"] for r in batches).timestamp() - min(r["started_at"] for r in batches).timestamp()
        result.update(change_rows=changed, seconds_including_process_start=round(wall, 2),
                      drain_seconds=round(drain, 2), batches=len(batches),
                      rows_per_second=round(changed / drain, 0))
    else:
        loop = DeltaRsLoop({"big": src.path}, {"big": replica}, 1.0)
        loop.bootstrap()
        changed = sum(src.change(rng, fraction, i + 1) for i in range(commits))
        t0 = time.time()
        loop.sweep("big")
        drain = time.time() - t0
        result.update(change_rows=changed, drain_seconds=round(drain, 2), batches=1,
                      rows_per_second=round(changed / drain, 0))
    result["replicas_equal_sources"] = same_rows(src.path, replica)
    shutil.rmtree(workdir, ignore_errors=True)
    return result


# -- report ---------------------------------------------------------------------------------------

WORKLOADS = ("steady", "scale", "catch_up", "steady_cost", "bootstrap", "apply_cost", "key_lookup", "postgres",
             "production", "kafka_postgres_latency", "bootstrap_chunked", "postgres_modes", "debezium_events",
             "debezium_events_s3", "startup", "soak")


def _mem(r: dict[str, Any]) -> str:
    m = r.get("peak_resident_mib") or {}
    return f"{m.get('python', 0):.0f} / {m.get('jvm', 0):.0f}" if m else "-"


def _exact(r: dict[str, Any]) -> str:
    if r.get("drained_within_seconds", 1) is None:
        return "not compared (not drained)"
    return "yes" if r["replicas_equal_sources"] else "NO"


def _steady_table(runs: list[dict[str, Any]], base_system: str = "lakemirror") -> list[str]:
    lines = ["| system | source commits | p50 s | p95 s | p99 s | max s | unapplied | replicas exact | "
             f"p99 vs {base_system} | peak RSS MiB (daemon Python / JVM) |", "|---|---|---|---|---|---|---|---|---|---|"]
    base = next((r["lag"]["p99"] for r in runs if r["system"] == base_system), None)
    for r in runs:
        lag = r["lag"]
        ratio = f"{lag['p99'] / base:.2f}x" if base else "-"
        lines.append(f"| {r['system']} | {lag['commits']} | {lag['p50']:.2f} | {lag['p95']:.2f} | {lag['p99']:.2f} | "
                     f"{lag['max']:.2f} | {lag['unapplied']} | {_exact(r)} | "
                     f"{ratio} | {_mem(r)} |")
    for r in runs:
        if r.get("drained_within_seconds", 1) is None:
            lines += ["", f"**{r['system']} had not applied every commit {r.get('drain_seconds', DRAIN_SECONDS):.0f} s after the writer "
                          f"stopped.** Commits it applied later (while draining on SIGTERM) count above with "
                          f"their real lag, commits never applied as unapplied; the replicas were not compared."]
    warm = [r for r in runs if r.get("warmup_lag")]
    if warm:
        lines += ["", f"The first {warm[0]['warmup_seconds']:.0f} s of the writer (the warm-up, after every replica "
                      "was bootstrapped; not in the figures above):", "",
                  "| system | source commits | p50 s | p99 s | max s | unapplied |", "|---|---|---|---|---|---|"]
        for r in warm:
            w = r["warmup_lag"]
            lines.append(f"| {r['system']} | {w['commits']} | {w['p50']:.2f} | {w['p99']:.2f} | {w['max']:.2f} | "
                         f"{w['unapplied']} |")
    for r in runs:
        b = r.get("batches") or {}
        if b.get("batches"):
            if b.get("measured_as"):  # the user's recipe: told from its query's checkpoint
                lines += ["", f"{r['system']}'s batches in the measured window (from its query's checkpoint): "
                              f"{b['batches']}, each {b['seconds_p50']:.1f} s at the median ({b['seconds_p90']:.1f} s "
                              f"p90) from its {b['measured_as']}, carrying {b['versions_p50']} source versions at "
                              f"the median."]
                continue
            lines += ["", f"{r['system']}'s batches in the measured window (from its checkpoint rows): {b['batches']}, "
                          f"each {b['seconds_p50']:.1f} s at the median ({b['seconds_p90']:.1f} s p90) from the apply's start (whichever path) to "
                          f"checkpoint row, carrying {b['versions_p50']} source versions and {b['change_rows_p50']:,} change "
                          f"rows at the median."]
    for r in runs:
        if "daemon_metric_lag" in r:
            d = r["daemon_metric_lag"]
            same = (f"; the same statistic from outside at the moments of the scrapes (the oldest source commit "
                    f"not yet on the replica, max over tables): p50 {d['outside_p50']:.2f} s, mean "
                    f"{d['outside_mean']:.2f} s, max {d['outside_max']:.2f} s" if d.get("outside_p50") is not None
                    else "")
            lines += ["", f"lakemirror's own `lakemirror_lag_seconds` (scraped every second, max over tables): "
                          f"p50 {d['p50'] if d.get('p50') is not None else float('nan'):.2f} s, mean {d['mean']:.2f} s, max {d['max']:.2f} s "
                          f"over {d['samples']} scrapes{same}; each commit's own lag (the tables above): "
                          f"mean {r['lag']['mean']:.2f} s, max {r['lag']['max']:.2f} s. "
                          f"Time from daemon start to every replica bootstrapped and running: {r['ready_seconds']} s."]
    return lines


def _steady_intro(n: int, r0: dict[str, Any], p: dict[str, Any]) -> str:
    return (f"{n} tables of {r0['rows_per_table']:,} rows; a writer (delta-rs, in the benchmark process) "
            f"commits one MERGE per table every second (or as fast as it can when that takes longer) touching "
            f"{p['fraction']:.0%} of its rows (updates, deletes, inserts) for {r0['seconds']:.0f} s measured "
            + (f"(lakemirror: after {r0['warmup_seconds']:.0f} s of warm-up with the same writer, reported "
               f"below; the baselines from their first commit). " if r0.get("warmup_seconds") else
               "(no warm-up: this run predates it). ") + "Lag of a "
            f"source commit = from the moment its commit returned to the moment the replica's commit covering "
            f"it appeared (lakemirror: the replica's Delta log file time joined with the checkpoint rows; the "
            f"baselines record it as they commit). Trigger interval {p['trigger']} s for lakemirror and the "
            f"delta-rs loop; the full refresh loops without pause.")


def _memory(results: dict[str, Any]) -> list[str]:
    mem = sorted(((r["tables"], r["system"], r["peak_resident_mib"])
                  for r in [*results.get("steady", []), *results.get("scale", [])] if r.get("peak_resident_mib")),
                 key=lambda x: (x[0], x[1]))
    if not mem:
        return []
    return ["", "Driver memory by number of tables (peak resident MiB of the daemon's Python process and its "
                "JVM, from `/proc/<pid>/status` VmHWM): " +
            "; ".join(f"{n} tables{'' if system == 'lakemirror' else f' ({system})'}: "
                      f"{m.get('python', 0):.0f} + {m.get('jvm', 0):.0f}" for n, system, m in mem) + "."]


def _no_date(section: dict[str, Any]) -> str:
    return ""  # each section's provenance line says when, where and by what it was measured


def sections(results: dict[str, Any]) -> list[Section]:
    """The report's section of every workload ``results`` holds, in the report's order."""
    p = results["parameters"]
    out: list[Section] = []
    by_tables: dict[int, list[dict[str, Any]]] = {}
    for r in results.get("steady", []):
        by_tables.setdefault(r["tables"], []).append(r)
    for n, runs in sorted(by_tables.items()):
        out.append(Section(f"steady_{n}", "steady", runs, [f"## Steady lag, {n} tables", "",
                                                           _steady_intro(n, runs[0], p), "", *_steady_table(runs)]))
    if results.get("scale"):
        r = results["scale"][0]
        out.append(Section("scale", "scale", results["scale"], [
            f"## Scale: {r['tables']} tables on one driver", "",
            f"lakemirror alone, {r['tables']} tables of {r['rows_per_table']:,} rows, the same writer for "
            f"{r['seconds']:.0f} s.", "", *_steady_table(results["scale"]), *_memory(results)]))
    if results.get("startup"):
        from bench.startup import render as render_startup

        out.append(Section("startup", "startup", results["startup"], render_startup(results["startup"])))
    if results.get("catch_up"):
        r0 = results["catch_up"][0]
        lines = ["## Catch-up", "",
                 f"A {r0['rows']:,}-row table, a backlog of {r0['backlog_commits']} MERGE commits written while "
                 f"the replicator was stopped; time to drain it.", "",
                 "| system | change rows | drain s | change rows / s | batches | wall incl. process start s | replica exact |",
                 "|---|---|---|---|---|---|---|"]
        for r in results["catch_up"]:
            lines.append(f"| {r['system']} | {r['change_rows']:,} | {r['drain_seconds']} | {r['rows_per_second']:,.0f} | "
                         f"{r['batches']} | {r.get('seconds_including_process_start', '-')} | "
                         f"{'yes' if r['replicas_equal_sources'] else 'NO'} |")
        out.append(Section("catch_up", "catch_up", results["catch_up"], lines))
    if results.get("steady_cost"):
        out.append(Section("steady_cost", "steady_cost", results["steady_cost"], _steady_cost_lines(results["steady_cost"])))
    if results.get("bootstrap"):
        r0 = results["bootstrap"][0]
        floor = r0["seconds_to_replica"]
        lines = ["## Bootstrap", "",
                 f"A {r0['rows']:,}-row table. Both sides start their own process and JVM (`local[2]`); the copy "
                 f"alone is the copy floor's write, and lakemirror's bootstrap step from its log (key settled to "
                 f"bootstrap done). {r0.get('repeats', 1)} runs of each, alternating; medians, with the range of "
                 f"the start-to-replica times.", "",
                 "| system | start to replica s (median, min-max) | vs copy floor | copy alone s | replica exact |",
                 "|---|---|---|---|---|"]
        for r in results["bootstrap"]:
            spread = "-".join(str(x) for x in r.get("seconds_to_replica_range", []))
            lines.append(f"| {r['system']} | {r['seconds_to_replica']}{f' ({spread})' if spread else ''} | "
                         f"{r['seconds_to_replica'] / floor:.2f}x | "
                         f"{r.get('copy_seconds', '-')} | {'yes' if r['replica_equal_source'] else 'NO'} |")
        out.append(Section("bootstrap", "bootstrap", results["bootstrap"], lines))
    if results.get("bootstrap_chunked"):
        from bench.chunked import render as render_chunked

        out.append(Section("bootstrap_chunked", "bootstrap_chunked", results["bootstrap_chunked"],
                           render_chunked(results["bootstrap_chunked"], _no_date)))
    if results.get("production"):
        out.append(Section("production", "production", results["production"],
                           render_production(results["production"], p.get("production") or {}, _steady_table)))
    for name in ("debezium_events", "debezium_events_s3"):
        if results.get(name):
            out.append(Section(name, name, results[name], render_debezium_events(results[name])))
    if results.get("postgres"):
        out.append(Section("postgres", "postgres", results["postgres"], render_postgres(results["postgres"])))
    if results.get("postgres_modes"):
        out.append(Section("postgres_modes", "postgres_modes", results["postgres_modes"],
                           render_postgres_modes(results["postgres_modes"])))
    if results.get("kafka_postgres_latency"):
        out.append(Section("kafka_postgres_latency", "kafka_postgres_latency", results["kafka_postgres_latency"],
                           render_kafka_postgres(results["kafka_postgres_latency"])))
    if results.get("apply_cost"):
        lines = ["## Where lakemirror's time goes: one micro-batch apply", "",
                 "lakemirror's own sink on a warm local Spark (`local[2]`, 2 shuffle partitions), one source commit "
                 "per apply; medians after two warm-up applies.", "",
                 "| apply path | replica deletion vectors | rows | change rows / apply | source table id s | batch stats alone s | "
                 "sink.apply (stats, the apply path's write, replay check) s | checkpoint row s | checkpoint row with writer txn id "
                 "(before) s | per batch (id check + apply + row) s | exact |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["apply_cost"]:
            lines.append(f"| {r.get('apply_path', 'materialized')} | {'on' if r['deletion_vectors'] else 'off'} | {r['rows']:,} | {r['change_rows_per_apply']:,} | "
                         f"{r['median_source_table_id_s']} | {r['median_batch_stats_s']} | "
                         f"{r['median_sink_apply_s']} | {r['median_checkpoint_row_s']} | "
                         f"{r['median_checkpoint_row_txn_s']} | {r['median_whole_apply_s']} | "
                         f"{'yes' if r['exact'] else 'NO'} |")
        out.append(Section("apply_cost", "apply_cost", results["apply_cost"], lines))
    if results.get("key_lookup"):
        r0 = results["key_lookup"][0]
        lines = ["## Finding a batch's keys in one replica file", "",
                 f"The deletion-vector apply's lookup (`bench/key_lookup.py`, no Spark): a file of {r0['rows']:,} rows, "
                 f"a batch of {r0['batch_keys']:,} distinct keys, half of them in the file; the file's keys kept as "
                 "the apply keeps them, against the row-by-row lookup they replaced (a hash-set probe per row of the "
                 "file, every batch). CPU, medians; each lookup starts from the batch's raw keys.", "",
                 "| key | kept as | built once, CPU s | kept MB (row by row) | lookup CPU ms | row by row CPU ms | "
                 "faster | rows found | same rows |", "|---|---|---|---|---|---|---|---|---|"]
        for r in results["key_lookup"]:
            lines.append(f"| {r['kind']} | {r['layout']} | {r['build_cpu_s']} | {r['kept_mb']} ({r['row_by_row_kept_mb']}) | "
                         f"{r['lookup_cpu_ms']} | {r['row_by_row_cpu_ms']} | {r['speedup']}x | {r['rows_found']:,} | "
                         f"{'yes' if r['same_rows_as_row_by_row'] else 'NO'} |")
        out.append(Section("key_lookup", "key_lookup", results["key_lookup"], lines))
    if results.get("soak"):
        out.append(Section("soak", "soak", results["soak"], render_soak(results["soak"])))
    return out


def _steady_cost_lines(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    refresh = next((r for r in runs if r["system"].startswith("full refresh (Spark")), None)
    warm = r0.get("warmup_commits")
    spark_warm = refresh.get("warmup_refreshes", 0) if refresh else 0
    lines = ["## Steady cost of one cycle", "",
             f"A {r0['rows']:,}-row table; one cycle = one source MERGE changing about "
             f"{r0['change_rows_per_cycle']:,} rows, then the replica brought up to date. lakemirror: wall "
             f"from the moment the source commit returned to the replica reflecting it, CPU of the daemon's "
             f"processes (Python and JVM) from before the source commit began until then (its idle polling "
             f"during the writer's commit included). Full refresh: overwrite the replica from the whole source, "
             f"with Spark (a warm session in its own process, its process and JVM's CPU) and with delta-rs. "
             f"{r0['cycles']} cycles each, measured twice: just after the start (after one uncounted cycle) "
             f"and warm: lakemirror after {warm} more batches (small appends: the JVM's JIT compiler is still "
             f"compiling Spark's planning code for about a hundred batches after a start), the Spark refresh "
             f"after {spark_warm} more refreshes.", "",
             "| system | warm: wall s (median, min-max) | warm: CPU s (median, min-max) | warm: CPU / Spark "
             "full refresh's (goal <= 0.10) | just started: CPU s (median, min-max) | just started: CPU / "
             "Spark's | replica exact |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        def ratio(key: str, r: dict[str, Any] = r) -> str:
            if not refresh or r is refresh or key not in r or key not in refresh:
                return "-"
            return f"{r[key]['median'] / refresh[key]['median']:.2f}"
        started = r.get("started_cpu_s")
        started_text = f"{started['median']} ({started['min']}-{started['max']})" if started else "-"
        lines.append(f"| {r['system']} | {r['wall_s']['median']} ({r['wall_s']['min']}-{r['wall_s']['max']}) | "
                     f"{r['cpu_s']['median']} ({r['cpu_s']['min']}-{r['cpu_s']['max']}) | {ratio('cpu_s')} | "
                     f"{started_text} | {ratio('started_cpu_s')} | "
                     f"{'yes' if r['replica_equal_source'] else 'NO'} |")
    return lines


def render(results: dict[str, Any], kept: dict[str, str] | None = None) -> str:
    """docs/BENCHMARKS.md from ``results`` (docs/bench/results.json) and the hand-written ``kept``
    blocks of the report it replaces (:func:`bench.report.kept_blocks`)."""
    p = results["parameters"]
    opt_ins = {name: sections({**section_results, "parameters": p})
               for name, section_results in (results.get("opt_in") or {}).items()}
    return assemble(results, sections(results), opt_ins, kept or {}, INTRO, NOTES)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [*results.get("steady", []), *results.get("scale", [])]
    sizes = sorted({r["tables"] for r in runs})
    if not sizes:
        return
    fig, axes = plt.subplots(len(sizes), 1, figsize=(9, 3.5 * len(sizes)), squeeze=False)
    for ax, n in zip(axes[:, 0], sizes):
        for r in (r for r in runs if r["tables"] == n):
            ax.plot([x for x, _ in r["series"]], [y for _, y in r["series"]], ".", markersize=3, label=r["system"])
        ax.set_xlabel("seconds into the run (source commit time)")
        ax.set_ylabel("lag of the commit, s")
        ax.set_yscale("log")
        warmup = max((r.get("warmup_seconds") or 0 for r in runs if r["tables"] == n), default=0)
        if warmup:
            ax.axvline(warmup, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"Lag of every source commit, {n} tables (dashed: end of the warm-up)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


#: Under the report's title: what it holds and how to read it.
INTRO = [
    "lakemirror against its baselines on the same data, one section per workload. Every figure comes from "
    "`make bench` (`python -m bench`: `ONLY=<workload>` runs some workloads and keeps the other sections, "
    "`QUICK=1` is a smoke run never mixed with these), so each section opens with the command that measured it, "
    "when, at which commit and on which machine.",
    "",
    "Each section measures the daemon with its default settings, beside the settings it names; opt-ins, off by "
    "default, come after the default's sections. Raw figures: [bench/results.json](bench/results.json); the lag "
    "of every source commit in the steady and scale runs: [bench/lag.png](bench/lag.png). Earlier figures, and "
    "what was tried between runs, are in the history of these files (`git log -p docs/BENCHMARKS.md`).",
]

NOTES = [
    "- The writer and both delta-rs baselines run in the benchmark's Python process; lakemirror runs as its "
    "own daemon process with its own JVM (`local[2]`), as a user would run it. All of them share the machine's "
    "two cores, so a run's figures include the writer's own load.",
    "- Figures compare within one run: the writer's commits per run vary with its share of the cores, and "
    "Spark's own figures move between days with the same code and packages.",
    "- The full refresh rewrites each replica whenever its source has a new version, without pause: its "
    "most favourable schedule. At 100k rows a rewrite costs tens of milliseconds with delta-rs.",
    "- The 64-table scale run uses smaller tables than the steady runs, to keep `make bench` within an hour "
    "on two cores.",
]


#: How long a system may take to apply the last commits once the writer stops; the rest counts as unapplied.
DRAIN_SECONDS = 300.0

#: How long the writer runs before the steady figures are measured (see ``steady_lag``).
WARMUP_SECONDS = 120.0


def parameters(quick: bool) -> dict[str, Any]:
    return {"steady_tables": [4] if quick else [4, 16], "steady_rows": 20_000 if quick else 100_000,
            "fraction": 0.01, "steady_seconds": 30.0 if quick else 120.0, "trigger": 1.0,
            "steady_warmup": 10.0 if quick else WARMUP_SECONDS,
            "scale_tables": 8 if quick else 64, "scale_rows": 5_000 if quick else 10_000,
            "catchup_rows": 100_000 if quick else 1_000_000, "catchup_commits": 5 if quick else 10,
            "cost_rows": 500_000 if quick else 10_000_000, "cost_cycles": 2 if quick else 4,
            "cost_warmup_commits": 10 if quick else WARMUP_COMMITS,
            "bootstrap_rows": 500_000 if quick else 5_000_000, "lookup_rows": 500_000 if quick else 5_000_000,
            "chunked_rows": 500_000 if quick else 20_000_000, "chunked_files": 20,
            # the retention run's VACUUM retention: shorter than its bootstrap, longer than a chunk and a catch-up
            "chunked_retain_hours": 0.01 if quick else 0.02,
            "modes_rows": 20_000 if quick else 200_000,
            # Debezium events over 8 partitions into 4 tables (the issue's benchmark), offsets per batch
            "debezium_events": 20_000 if quick else 1_000_000, "debezium_events_s3": 20_000 if quick else 200_000, "debezium_steady_seconds": 15.0 if quick else 60.0, "debezium_max_offsets": 5_000 if quick else 50_000,
            "production": production_parameters(quick), "soak": soak_parameters(quick),
            # start and restart: small tables, from process start to every table's first applied batch
            "startup_tables": [1, 4] if quick else [1, 16, 64], "startup_rows": 1_000}


def run_workload(name: str, p: dict[str, Any], seed: int, only: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One workload's runs. ``only``: the production workload's part to run (``systems``,
    ``writers``, ``tables``; bench/production.py's :func:`~bench.production.plan`)."""
    out: list[dict[str, Any]] = []
    if name == "steady":
        for n in p["steady_tables"]:
            # lakemirror's variants (bench.systems.VARIANTS) at 4 tables
            variants = tuple(VARIANTS) if n == min(p["steady_tables"]) else ()
            for system in ("lakemirror", *variants, "delta-rs", "full refresh"):
                print(f"steady lag, {n} tables: {system} ...", flush=True)
                # only lakemirror's JVM needs the warm-up; the baselines are measured from their first commit
                warmup = p["steady_warmup"] if system.startswith("lakemirror") else 0.0
                out.append(steady_lag(system, n, p["steady_rows"], p["steady_seconds"], p["fraction"], p["trigger"], seed,
                                      warmup))
                print(f"  {out[-1]['lag']}", flush=True)
    elif name == "scale":
        print(f"scale, {p['scale_tables']} tables: lakemirror ...", flush=True)
        out.append(steady_lag("lakemirror", p["scale_tables"], p["scale_rows"], p["steady_seconds"], p["fraction"],
                              p["trigger"], seed, p["steady_warmup"]))
        print(f"  {out[-1]['lag']} {out[-1].get('peak_resident_mib')}", flush=True)
    elif name == "startup":
        from bench.startup import startup

        out = startup(p["startup_tables"], p["startup_rows"], p["trigger"], seed)
    elif name == "catch_up":
        for system in ("lakemirror", "lakemirror, Spark rewrite", "delta-rs"):
            print(f"catch-up: {system} ...", flush=True)
            # the backlog: `catchup_commits` MERGEs of 10% of the rows each, i.e. >= 1M change rows at full size
            out.append(catch_up(system, p["catchup_rows"], p["catchup_commits"], 0.1, seed))
            print(f"  {out[-1]}", flush=True)
    elif name == "steady_cost":
        print("steady cost ...", flush=True)
        out = steady_cost(p["cost_rows"], p["cost_cycles"], p["fraction"], seed,
                          p["cost_warmup_commits"])
        print(f"  {out}", flush=True)
    elif name == "bootstrap":
        print("bootstrap ...", flush=True)
        out = bootstrap(p["bootstrap_rows"])
        print(f"  {out}", flush=True)
    elif name == "bootstrap_chunked":
        from bench.chunked import bootstrap_chunked

        print("chunked bootstrap ...", flush=True)
        out = bootstrap_chunked(p["chunked_rows"], p["chunked_files"], p["chunked_retain_hours"], seed)
        print(f"  {out}", flush=True)
    elif name == "postgres":
        print("throughput into PostgreSQL ...", flush=True)
        rows = 20_000 if p["steady_rows"] < 100_000 else 100_000
        out = postgres_throughput(rows, rows, seed)
        print(f"  {out}", flush=True)
    elif name == "postgres_modes":
        print("snapshot or incremental into PostgreSQL, by change fraction ...", flush=True)
        out = postgres_modes(p["modes_rows"], repeats=1 if p["modes_rows"] < 200_000 else 3, seed=seed)
    elif name == "debezium_events":
        print(f"Debezium events into Delta, {p['debezium_events']:,} events: lakemirror and the Streaming CDC "
              "recipe ...", flush=True)
        out = debezium_events(p["debezium_events"], p["debezium_max_offsets"], seed, p["debezium_steady_seconds"])
    elif name == "debezium_events_s3":
        print(f"Debezium events into Delta on S3, {p['debezium_events_s3']:,} events: lakemirror (both executors) "
              "and the Streaming CDC recipe ...", flush=True)
        out = debezium_events(p["debezium_events_s3"], p["debezium_max_offsets"], seed, 0.0, store="s3")
    elif name == "kafka_postgres_latency":
        print("latency Kafka -> PostgreSQL, Real-Time Mode and micro-batch ...", flush=True)
        out = kafka_postgres_latency(20.0, 10.0 if p["steady_rows"] < 100_000 else 30.0)
    elif name == "key_lookup":
        print("key lookup ...", flush=True)
        out = key_lookup(p["lookup_rows"], 5, seed)
        print(f"  {out}", flush=True)
    elif name == "production":
        out = production(p["production"], seed, **(only or {}))
    elif name == "soak":
        out = soak(p["soak"], seed)
    elif name == "apply_cost":
        print("apply cost ...", flush=True)
        out = apply_cost(p["steady_rows"], p["fraction"], 6 if p["steady_rows"] < 100_000 else 10, seed)
        print(f"  {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: smaller tables, shorter runs")
    parser.add_argument("--only", default="", help=f"comma-separated workloads to run ({', '.join(WORKLOADS)}); "
                        "the other sections are kept from the last docs/bench/results.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--seed", type=int, default=42)
    part = parser.add_argument_group("a part of the production workload (with --only production; the other rows "
                                     "are kept from the last docs/bench/results.json)")
    part.add_argument("--rows", default="", help=f"comma-separated rows ({', '.join(PRODUCTION_ROWS)}; the default "
                      f"run has {', '.join(DEFAULT_ROWS)})")
    part.add_argument("--writers", default="", help=f"comma-separated writers of the sources ({', '.join(WRITERS)})")
    part.add_argument("--tables", default="", help="comma-separated table counts (of the workload's: "
                      "4 and 16; 2 with --quick)")
    soak_args = parser.add_argument_group("the soak (--only soak)")
    soak_args.add_argument("--soak-minutes", type=float, help="minutes measured (default 60; 3 with --quick)")
    soak_args.add_argument("--soak-row", choices=[k for k, r in PRODUCTION_ROWS.items() if r.kind == "lakemirror"],
                           help="the lakemirror row soaked (default spark: the Spark-only path)")
    soak_args.add_argument("--soak-writer", choices=WRITERS, help="who writes the sources (default delta-rs)")
    args = parser.parse_args(argv)
    named = [w for w in args.only.split(",") if w]
    # The soak (70 minutes) runs only when asked for by name.
    only = named or [w for w in WORKLOADS if w != "soak"]
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    p = parameters(args.quick)
    part_of: dict[str, Any] = {}
    for flag, value, cast in (("systems", args.rows, str), ("writers", args.writers, str), ("tables", args.tables, int)):
        if value:
            try:
                part_of[flag] = [cast(v.strip()) for v in value.split(",") if v.strip()]
            except ValueError:
                parser.error(f"--{'rows' if flag == 'systems' else flag}: not a list of {cast.__name__}: {value!r}")
    if part_of:
        if "production" not in named:
            parser.error("--rows, --writers and --tables choose a part of the production workload: add --only production")
        try:
            plan(p["production"], **part_of)
        except ValueError as exc:
            parser.error(str(exc))
    for key, value in (("minutes", args.soak_minutes), ("row", args.soak_row), ("writer", args.soak_writer)):
        if value is not None:
            p["soak"][key] = value
    if p["soak"]["minutes"] < 2 * p["soak"]["window_minutes"]:
        parser.error(f"--soak-minutes: at least {2 * p['soak']['window_minutes']:g}, the first and the last "
                     f"window of {p['soak']['window_minutes']:g} minute(s) each")
    raw = args.out / "bench" / "results.json"
    previous: dict[str, Any] = json.loads(raw.read_text()) if raw.is_file() else {}
    if previous.get("quick", "--quick" in previous.get("command", "")) != args.quick:
        previous = {}  # never mix a smoke run's figures with a full run's
    # a full run measures every workload again; the opt-ins it does not measure are kept either way
    kept = previous if args.only else {"opt_in": previous.get("opt_in", {})}
    given = list(argv if argv is not None else sys.argv[1:])
    extra = " ".join(given)
    command = ("make bench" + (" QUICK=1" if args.quick else "") + (f" ONLY={args.only}" if args.only else "")
               + make_args(given) + "  # python -m bench" + (f" {extra}" if extra else ""))
    results = fresh_results(kept, command, args.quick, machine(), p)
    run = run_provenance(results["command"], results["machine"])
    for name in only:
        load = list(os.getloadavg())
        started = time.time()
        section = run_workload(name, p, args.seed, part_of if name == "production" else None)
        for r in section:
            r.setdefault("measured_at", started)
            r.setdefault("load_average_at_start", load)
            for key, value in run.items():
                r.setdefault(key, value)
        # a part of the production workload replaces its own rows and keeps the others
        results[name] = merge_runs(results.get(name) or [], section) if name == "production" and part_of else section
        write_report(results, args.out)  # after every workload: a run stopped half-way keeps what it measured
    return 0


def make_args(given: list[str]) -> str:
    """The ``ARGS=...`` of the ``make bench`` command that passes ``given`` (``--quick`` and
    ``--only`` are its ``QUICK`` and ``ONLY``), so that a section's command reproduces its run."""
    rest: list[str] = []
    skip = False
    for arg in given:
        if skip:
            skip = False
        elif arg == "--only":
            skip = True
        elif arg != "--quick" and not arg.startswith("--only="):
            rest.append(arg)
    return f' ARGS="{" ".join(rest)}"' if rest else ""


def fresh_results(kept: dict[str, Any], command: str, quick: bool, machine_now: dict[str, Any],
                  p: dict[str, Any]) -> dict[str, Any]:
    """A run's results before it measures anything: the sections of ``kept`` (of the last results.json:
    every one for an ``--only`` run, the opt-ins' for a full run), each replaced as this run measures it."""
    return {"command": command, "quick": quick, "machine": machine_now, "parameters": p, "notes": NOTES,
            **{w: kept.get(w, []) for w in WORKLOADS}, "opt_in": kept.get("opt_in", {})}


def head_commit() -> str | None:
    """The checked-out commit, with ``+changes`` when tracked files outside docs/ differ from it (the
    run itself rewrites docs/); None outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if changed else "")


def run_provenance(command: str, machine_now: dict[str, Any]) -> dict[str, Any]:
    """What every record of a run carries into the report: the command (its `make` form), the commit it
    measured and the machine (without the load, which each record has at its own start)."""
    return {"command": command.split("  #")[0], "commit": head_commit(),
            "machine": {k: v for k, v in machine_now.items() if k != "load_average_at_start"}}


def write_report(results: dict[str, Any], out: Path) -> None:
    results["finished"] = time.time()
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / "results.json").write_text(json.dumps(results, indent=2, default=str))
    plot(results, out / "bench" / "lag.png")
    target = out / "BENCHMARKS.md"
    kept = kept_blocks(target.read_text()) if target.is_file() else {}
    target.write_text(render(results, kept))
    print(f"written: {target}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
