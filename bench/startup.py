"""`make bench ONLY=startup`: from process start to every table's first applied batch, at a first start
and at a restart, and where those seconds go.

For each number of tables, ``N`` small local source tables (``rows`` rows each, delta-rs, change feed
on) and the real daemon (`lakemirror run`, :class:`bench.systems.LakemirrorDaemon`):

- **first start**: a new pipeline; every table is bootstrapped, and is ready when ``/status`` says it
  runs with its replica at the source's version;
- **restart**: the daemon is stopped (SIGTERM, drained), every source gets one commit (a MERGE of 1% of
  its rows), and the daemon is started again; a table is ready when its first batch, carrying that
  commit, is applied (``/status``: running, applied through the new version).

``/status`` is read every 0.1 s from the moment the process is started. The daemon's own log lines
say where each table's time went (:func:`phases`): the HTTP endpoint (imports, settings, the lease),
the Spark session, the checkpoint table, each table's launch step by step (the replica's record,
the wait for a launch slot, the source's description, the bootstrap, the replica's schema, the
change stream's making (Delta's snapshot of the source), the choice of the apply path, the query's
start), and its first
batch (from the stream's start to the apply: Spark's plan and the wait for a turn; then the apply).
Peak resident memory of the daemon's Python process and its JVM (``/proc``'s VmHWM) is read once
every table is ready. The import of the daemon's modules is timed apart, in a fresh interpreter.

Runnable alone for a quick profile: ``python -m bench.startup 1 16`` (table counts; ``--rows``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping

from bench.big import peak_resident_mib
from bench.systems import LakemirrorDaemon
from bench.workload import SourceTable, same_rows, table_path

#: How long one start may take before the run is abandoned (a 64-table start on a loaded machine).
START_TIMEOUT_SECONDS = 1800.0

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_SPARK = re.compile(r"Spark session \((\w+) mode\) ready in ([\d.]+)s")
_CHECKPOINT = re.compile(r"checkpoint table \S+ ready in ([\d.]+)s")
_ADDED = re.compile(r"table (\S+): added to the pipeline")
_STREAM = re.compile(r"table \S+\.(\S+): stream started ([\d.]+)s(?: \((.*)\))? after the launch began")
_FIRST = re.compile(r"table \S+\.(\S+): first batch \d+ applied ([\d.]+)s after the launch began"
                    r"(?:; ([\d.]+)s from the stream's start to the apply)?, the apply ([\d.]+)s")


def _stamp(line: str) -> float | None:
    match = _STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if match else None


def phases(log_text: str, started: float) -> dict[str, Any]:
    """What the daemon's log lines say about one start, in seconds since ``started`` (the process's
    start, wall clock): when the HTTP endpoint served, the Spark session and the checkpoint table were
    ready (and how long each took), and for each table when it was added, its launch's steps, when
    its stream started and its first batch was applied. Pure: the log's text in, figures out."""
    out: dict[str, Any] = {"tables": {}}

    def table(name: str) -> dict[str, Any]:
        return out["tables"].setdefault(name, {})  # type: ignore[no-any-return]

    for line in log_text.splitlines():
        at = _stamp(line)
        if at is None:
            continue
        since = round(at - started, 2)
        if "serving http" in line and "http_at" not in out:
            out["http_at"] = since
        elif (m := _SPARK.search(line)) and "spark_at" not in out:
            out["spark_at"], out["spark_seconds"] = since, float(m.group(2))
        elif (m := _CHECKPOINT.search(line)) and "checkpoint_table_at" not in out:
            out["checkpoint_table_at"], out["checkpoint_table_seconds"] = since, float(m.group(1))
        elif m := _ADDED.search(line):
            table(m.group(1)).setdefault("added_at", since)
        elif m := _STREAM.search(line):
            entry = table(m.group(1))
            entry["stream_at"], entry["launch_seconds"] = since, float(m.group(2))
            entry["steps"] = {name: float(seconds.rstrip("s")) for name, seconds in
                              (part.rsplit(" ", 1) for part in (m.group(3) or "").split(", ") if part)}
        elif m := _FIRST.search(line):
            entry = table(m.group(1))
            entry["first_batch_at"] = since
            if m.group(3) is not None:
                entry["wait_for_batch_seconds"] = float(m.group(3))
            entry["apply_seconds"] = float(m.group(4))
    return out


def _spread(values: Iterable[float]) -> dict[str, float] | None:
    found = sorted(values)
    if not found:
        return None
    return {"min": round(found[0], 2), "median": round(statistics.median(found), 2), "max": round(found[-1], 2)}


def summarize(ready: Mapping[str, float], logged: Mapping[str, Any]) -> dict[str, Any]:
    """Per start: the tables' ready times (min, median, max) and, over the tables, each launch step
    and the first batch's wait and apply (min, median, max), beside the pipeline's own steps. Pure."""
    tables = logged.get("tables", {})
    steps: dict[str, list[float]] = {}
    for entry in tables.values():
        for name, seconds in entry.get("steps", {}).items():
            steps.setdefault(name, []).append(seconds)

    def over_tables(key: str) -> dict[str, float] | None:
        return _spread(entry[key] for entry in tables.values() if key in entry)

    return {
        "every_table_ready_s": round(max(ready.values()), 2) if ready else None,
        "ready_s": _spread(ready.values()),
        "http_at": logged.get("http_at"), "spark_at": logged.get("spark_at"),
        "spark_seconds": logged.get("spark_seconds"), "checkpoint_table_at": logged.get("checkpoint_table_at"),
        "checkpoint_table_seconds": logged.get("checkpoint_table_seconds"),
        "added_at": over_tables("added_at"), "launch_seconds": over_tables("launch_seconds"),
        "launch_steps": {name: _spread(values) for name, values in steps.items()},
        "stream_at": over_tables("stream_at"), "wait_for_batch_seconds": over_tables("wait_for_batch_seconds"),
        "apply_seconds": over_tables("apply_seconds"), "first_batch_at": over_tables("first_batch_at"),
    }


def import_seconds() -> float:
    """The import of the daemon's modules (its composition root) in a fresh interpreter."""
    code = "import time; t = time.perf_counter(); import lakemirror.daemon.context; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return round(float(out.stdout.strip().splitlines()[-1]), 2)


def timed_start(daemon: LakemirrorDaemon, targets: Mapping[str, int], kind: str) -> dict[str, Any]:
    """Start ``daemon``, wait until every table of ``targets`` runs with its replica at (or past) the
    version given, and stop it; the start's figures (see the module docstring)."""
    log_file = daemon.workdir / "daemon.log"
    offset = log_file.stat().st_size if log_file.is_file() else 0
    load = list(os.getloadavg())
    started = time.time()
    daemon.start()
    ready: dict[str, float] = {}
    http_ready: float | None = None
    while len(ready) < len(targets):
        assert daemon.proc is not None and daemon.proc.poll() is None, f"the daemon died: see {log_file}"
        if time.time() - started > START_TIMEOUT_SECONDS:
            raise TimeoutError(f"{kind}: {len(ready)} of {len(targets)} tables ready after {START_TIMEOUT_SECONDS}s")
        status = daemon.status()
        now = time.time()
        if status and http_ready is None:
            http_ready = round(now - started, 2)
        for name, version in targets.items():
            view = status.get(name, {})
            through = view.get("applied_through")
            if name not in ready and view.get("state") == "running" and through is not None and through >= version:
                ready[name] = round(now - started, 2)
        time.sleep(0.1)
    memory = peak_resident_mib(daemon.proc.pid)
    daemon.stop()  # drained: every line about this start is in the log (the last table's may lag /status)
    with log_file.open("rb") as fh:
        fh.seek(offset)
        text = fh.read().decode(errors="replace")
    logged = phases(text, started)
    return {"start": kind, "tables": len(targets), "load_average_at_start": load, "status_answered_at": http_ready,
            "ready_at": ready, **summarize(ready, logged), "peak_resident_mib": memory, "log": logged}


def startup(counts: Iterable[int], rows: int, trigger: float, seed: int) -> list[dict[str, Any]]:
    """A first start and a restart at each number of tables (see the module docstring)."""
    out: list[dict[str, Any]] = []
    imports = import_seconds()
    archive = class_archive_recorded()
    for n in counts:
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-startup-{n}-"))
        warehouse = workdir / "lakehouse"
        names = [f"t{i:02d}" for i in range(n)]
        sources = {t: SourceTable(table_path(warehouse, "src", "bench", t), rows) for t in names}
        for source in sources.values():
            source.create()
        daemon = LakemirrorDaemon(workdir, warehouse, names, trigger)
        try:
            print(f"startup, {n} tables: first start ...", flush=True)
            first = timed_start(daemon, {t: s.version() for t, s in sources.items()}, "first start")
            rng = random.Random(seed)
            for stamp, source in enumerate(sources.values(), start=1):
                source.change(rng, 0.01, stamp)
            print(f"startup, {n} tables: restart ...", flush=True)
            restart = timed_start(daemon, {t: s.version() for t, s in sources.items()}, "restart")
        finally:
            daemon.stop()
        exact = all(same_rows(s.path, daemon.replica_path(t)) for t, s in sources.items())
        for result in (first, restart):
            result.update(rows_per_table=rows, trigger_seconds=trigger, import_seconds=imports,
                          replicas_equal_sources=exact, class_archive=archive)
            print(f"  {result['start']}: every table ready at {result['every_table_ready_s']}s "
                  f"(spark {result['spark_at']}s, streams {result['stream_at']}, first batches "
                  f"{result['first_batch_at']}), peak {result['peak_resident_mib']}", flush=True)
        out += [first, restart]
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def class_archive_recorded() -> bool:
    """Whether the daemons measured map a class archive (``make setup`` records one; see
    ``lakemirror.daemon.class_archive``)."""
    from lakemirror.daemon.class_archive import recorded_archive

    return recorded_archive().is_file()


def _range(spread: Mapping[str, float] | None) -> str:
    if not spread:
        return "-"
    if spread["min"] == spread["max"]:
        return f"{spread['median']}"
    return f"{spread['median']} ({spread['min']}-{spread['max']})"


def render(results: list[dict[str, Any]]) -> list[str]:
    """The section of docs/BENCHMARKS.md."""
    r0 = results[0]
    archive = {True: " The daemon's JVM maps the class archive `make setup` records (`lakemirror build-class-archive`).",
               False: " No class archive was recorded: the daemon's JVM loads every class at its start "
                      "(`lakemirror build-class-archive` records one)."}.get(r0.get("class_archive"), "")
    lines = ["## Start and restart", "",
             f"Tables of {r0['rows_per_table']:,} rows on the local disk, trigger interval {r0['trigger_seconds']} s. "
             "First start: a new pipeline, every table bootstrapped and running. Restart: the daemon drained and "
             "stopped, one commit to every source, started again; a table is ready when its first batch (that "
             "commit) is applied. Seconds since the process started; over the tables: median (min-max). Import "
             f"of the daemon's modules alone: {r0['import_seconds']} s.{archive}", "",
             "| tables | start | every table ready s | tables ready s | /status answers s | Spark session ready s "
             "(start took) | checkpoint table ready s | streams started s | stream start to first apply s | "
             "first batches applied s | peak RSS MiB (Python / JVM) | replicas exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        memory = r.get("peak_resident_mib") or {}
        lines.append(
            f"| {r['tables']} | {r['start']} | {r['every_table_ready_s']} | {_range(r['ready_s'])} | "
            f"{r.get('status_answered_at', '-')} | {r.get('spark_at', '-')} ({r.get('spark_seconds', '-')}) | "
            f"{r.get('checkpoint_table_at', '-')} | {_range(r['stream_at'])} | {_range(r['wait_for_batch_seconds'])} | "
            f"{_range(r['first_batch_at'])} | {memory.get('python', 0):.0f} / {memory.get('jvm', 0):.0f} | "
            f"{'yes' if r['replicas_equal_sources'] else 'NO'} |")
    lines += ["", "Each table's launch, step by step (seconds; over the tables: median (min-max)):", "",
              "| tables | start | whole launch | " + " | ".join(STEP_NAMES) + " |",
              "|---|---|---|" + "---|" * len(STEP_NAMES)]
    for r in results:
        steps = r.get("launch_steps") or {}
        lines.append(f"| {r['tables']} | {r['start']} | {_range(r['launch_seconds'])} | "
                     + " | ".join(_range(steps.get(name)) for name in STEP_NAMES) + " |")
    return lines


#: The launch steps the runner logs (:mod:`lakemirror.supervisor.change_feed.launch_timing`), in order.
STEP_NAMES = ("record", "slot", "describe", "bootstrap", "replica", "source", "choose", "stream")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Profile a first start and a restart of the daemon.")
    parser.add_argument("tables", nargs="*", type=int, default=[1, 16], help="numbers of tables (default 1 16)")
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--trigger", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    results = startup(args.tables, args.rows, args.trigger, args.seed)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k not in ("log", "ready_at")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
