"""The large-table workloads: the cost of one steady cycle on a big table, and the bootstrap.

- ``steady_cost``: a ``rows``-row table where ``fraction`` of the rows change per cycle (one source
  MERGE), measured just after each system's start and again warm (:data:`WARMUP_COMMITS`). For
  lakemirror, one cycle is the commit made and the daemon applying it; its cost is the wall time
  until the replica reflects it and the CPU seconds the daemon's processes (Python and JVM) used
  meanwhile. For the full refresh, one cycle is overwriting the replica with the whole
  source, twice: as a scheduled Spark job does it (``python -m bench.spark_refresh``, a warm
  session in a process of its own) and with delta-rs in this process (its CPU seconds are this
  process's). lakemirror runs twice:
  with deletion vectors off on the replica (each MERGE rewrites every file a changed row is in)
  and on (``replica_properties``: a MERGE writes only the changed rows).
- ``bootstrap``: the time from starting the daemon to a live replica of a ``rows``-row table,
  against the copy floor: a plain Spark read of the source at the same version written as a new
  Delta table, in a process of its own with the same Spark settings (``python -m bench.copy_floor``).
  Both include starting the process and its JVM; the copy alone is reported too.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable, write_deltalake

from bench.systems import LakemirrorDaemon
from bench.workload import SourceTable, same_rows, table_path


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live descendants."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        child = int(entry.name)
        children.setdefault(int(fields[1]), []).append(child)
        stats[child] = (int(fields[11]) + int(fields[12])) / ticks
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0.0)
        todo.extend(children.get(p, []))
    return total


def process_tree_mib(pid: int, field: str = "VmRSS") -> dict[str, float]:
    """``field`` of ``/proc/<pid>/status`` for ``pid`` and its descendants, summed by kind (``jvm``
    for java processes, ``python`` for the rest), in MiB."""
    out: dict[str, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        kind = "jvm" if fields.get("Name", "").strip() == "java" else "python"
        out[kind] = out.get(kind, 0.0) + int(fields.get(field, "0 kB").split()[0]) / 1024
        todo.extend(int(k) for k in kids)
    return out


def peak_resident_mib(pid: int) -> dict[str, float]:
    """Peak resident memory (VmHWM) of ``pid`` and its descendants, by kind (``jvm``, ``python``), in MiB."""
    return process_tree_mib(pid, "VmHWM")


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}


#: Small append commits the daemon applies, one batch each, between the cycles measured just after
#: its start and those measured warm. The JVM's JIT compiler goes on compiling Spark's planning code
#: for about a hundred micro-batches after a start, and the JVM's CPU per batch falls with no change
#: to the work. A long-running daemon is past that; a writer's MERGE into 10M rows
#: takes about four seconds, so the warm-up uses appends (one small file each; they also let the
#: replica's compaction run as it would over time).
WARMUP_COMMITS = 100
#: Refreshes the Spark session runs, uncounted, between its two measurements (each a full
#: overwrite of the unchanged source): its JVM compiles too. With them its CPU a refresh was 7.11 s,
#: against 7.54 and 7.93 after only the first measurement's six (``make bench ONLY=steady_cost`` on 4d30b29
#: and twice on a2a8c20).
SPARK_WARMUP_REFRESHES = 10


def _cycles(src: SourceTable, daemon: LakemirrorDaemon, rng: random.Random, cycles: int, fraction: float,
            stamp: int) -> tuple[list[float], list[float], int]:
    """``cycles`` + 1 source MERGEs, each applied before the next; the first (warm-up) not counted."""
    assert daemon.proc is not None
    walls, cpus, changed = [], [], 0
    for i in range(cycles + 1):
        # The daemon's CPU is read before the writer's commit, and the wall counted from the moment
        # that commit returned: the writer's bookkeeping after it (a set of 10M ids) takes longer
        # than a driver-path apply, which starts meanwhile.
        cpu0 = process_tree_cpu(daemon.proc.pid)
        changed = src.change(rng, fraction, stamp + i)
        version = src.version()
        daemon.wait_through({"big": version}, timeout=1800)
        if i:
            walls.append(time.time() - src.commits[version])
            cpus.append(process_tree_cpu(daemon.proc.pid) - cpu0)
    return walls, cpus, changed


def _refresh(refresher: subprocess.Popen[str]) -> dict[str, float]:
    """One full Spark refresh (``bench.spark_refresh``): its wall and CPU seconds."""
    assert refresher.stdin is not None and refresher.stdout is not None
    refresher.stdin.write("refresh\n")
    refresher.stdin.flush()
    return dict(json.loads(refresher.stdout.readline()))


def _refreshes(src: SourceTable, refresher: subprocess.Popen[str], rng: random.Random, cycles: int, fraction: float,
               stamp: int) -> tuple[list[float], list[float], int]:
    """``cycles`` + 1 source MERGEs, each followed by a full Spark refresh; the first not counted."""
    walls, cpus, changed = [], [], 0
    for i in range(cycles + 1):
        changed = src.change(rng, fraction, stamp + i)
        answer = _refresh(refresher)
        if i:
            walls.append(answer["wall"])
            cpus.append(answer["cpu"])
    return walls, cpus, changed


def steady_cost(rows: int, cycles: int, fraction: float, seed: int,
                warmup_commits: int = WARMUP_COMMITS) -> list[dict[str, Any]]:
    """Each system's cost per cycle twice: just after its start (``started_*``) and warm (``wall_s``,
    ``cpu_s``: lakemirror after ``warmup_commits`` more batches, the Spark refresh after
    :data:`SPARK_WARMUP_REFRESHES` more refreshes)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-cost-"))
    warehouse = workdir / "lakehouse"
    src = SourceTable(table_path(warehouse, "src", "bench", "big"), rows)
    src.create()
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    try:
        for dv in (False, True):
            props = {"delta.enableDeletionVectors": "true"} if dv else {}
            daemon = LakemirrorDaemon(workdir / f"dv_{dv}", warehouse, ["big"], trigger_seconds=1.0,
                                      replica_properties=props, destination_catalog=f"dst_dv_{dv}".lower())
            daemon.start()
            daemon.wait_through({"big": src.version()}, timeout=1800)
            assert daemon.proc is not None
            started = _cycles(src, daemon, rng, cycles, fraction, 1000 * (dv + 1))
            for j in range(warmup_commits):
                src.append(1000, 100_000 * (dv + 1) + j)
                daemon.wait_through({"big": src.version()}, timeout=600)
            walls, cpus, changed = _cycles(src, daemon, rng, cycles, fraction, 1000 * (dv + 1) + 500)
            memory = peak_resident_mib(daemon.proc.pid)
            daemon.stop()
            replica = daemon.replica_path("big")
            out.append({"system": f"lakemirror (deletion vectors {'on' if dv else 'off'})", "rows": rows,
                        "change_rows_per_cycle": changed, "cycles": cycles, "warmup_commits": warmup_commits,
                        "wall_s": _summary(walls), "cpu_s": _summary(cpus),
                        "started_wall_s": _summary(started[0]), "started_cpu_s": _summary(started[1]),
                        "peak_resident_mib": memory, "replica_equal_source": same_rows(src.path, replica)})
        replica = table_path(warehouse, "dst_spark_refresh", "bench", "big")
        refresher = subprocess.Popen([sys.executable, "-m", "bench.spark_refresh", str(src.path), str(replica)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert refresher.stdin is not None and refresher.stdout is not None
        json.loads(refresher.stdout.readline())  # the session is up
        started = _refreshes(src, refresher, rng, cycles, fraction, 8000)
        spark_warmup = SPARK_WARMUP_REFRESHES if warmup_commits else 0
        for _ in range(spark_warmup):
            _refresh(refresher)
        walls, cpus, changed = _refreshes(src, refresher, rng, cycles, fraction, 8500)
        refresher.stdin.close()
        refresher.wait(300)
        out.append({"system": "full refresh (Spark overwrite, warm session)", "rows": rows,
                    "change_rows_per_cycle": changed, "cycles": cycles,
                    "warmup_refreshes": spark_warmup, "wall_s": _summary(walls),
                    "cpu_s": _summary(cpus), "started_wall_s": _summary(started[0]),
                    "started_cpu_s": _summary(started[1]), "replica_equal_source": same_rows(src.path, replica)})
        replica = table_path(warehouse, "dst_refresh", "bench", "big")
        walls, cpus = [], []
        for i in range(cycles):
            changed = src.change(rng, fraction, 9000 + i)
            cpu0, t0 = time.process_time(), time.time()
            write_deltalake(str(replica), DeltaTable(str(src.path)).to_pyarrow_table(), mode="overwrite")
            walls.append(time.time() - t0)
            cpus.append(time.process_time() - cpu0)
        out.append({"system": "full refresh (delta-rs overwrite)", "rows": rows, "change_rows_per_cycle": changed,
                    "cycles": cycles, "wall_s": _summary(walls), "cpu_s": _summary(cpus),
                    "replica_equal_source": same_rows(src.path, replica)})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def bootstrap(rows: int, repeats: int = 3) -> list[dict[str, Any]]:
    """Each side ``repeats`` times, alternating (floor, lakemirror, floor, ...), on one source table;
    the figures are medians with their range: one cold start varies by several seconds here."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-bootstrap-"))
    warehouse = workdir / "lakehouse"
    src = SourceTable(table_path(warehouse, "src", "bench", "big"), rows)
    src.create()
    version = src.version()
    floor_name, lakemirror_name = "copy floor (Spark read at V, written as a new Delta table)", "lakemirror (start to live replica)"
    runs: dict[str, list[dict[str, Any]]] = {floor_name: [], lakemirror_name: []}
    try:
        for attempt in range(repeats):
            floor_dst = workdir / f"floor{attempt}"
            t0 = time.time()
            done = subprocess.run([sys.executable, "-m", "bench.copy_floor", str(src.path), str(floor_dst), str(version)],
                                  check=True, capture_output=True, text=True)
            total = time.time() - t0
            inner = json.loads(done.stdout.strip().splitlines()[-1])
            runs[floor_name].append({"total": total, "copy": inner["copy_seconds"], "exact": same_rows(src.path, floor_dst)})
            shutil.rmtree(floor_dst, ignore_errors=True)
            daemon = LakemirrorDaemon(workdir / f"lm{attempt}", warehouse, ["big"], trigger_seconds=1.0,
                                      destination_catalog=f"dst{attempt}")
            t0 = time.time()
            daemon.start()
            daemon.wait_through({"big": version}, timeout=1800)
            total = time.time() - t0
            daemon.stop()
            runs[lakemirror_name].append({"total": total, "copy": daemon.bootstrap_seconds("big"),
                                          "exact": same_rows(src.path, daemon.replica_path("big"))})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return [{"system": name, "rows": rows, "repeats": repeats,
             "seconds_to_replica": round(statistics.median(r["total"] for r in got), 2),
             "seconds_to_replica_range": [round(min(r["total"] for r in got), 2), round(max(r["total"] for r in got), 2)],
             "copy_seconds": round(statistics.median(r["copy"] for r in got if r["copy"] is not None), 2),
             "replica_equal_source": all(r["exact"] for r in got)}
            for name, got in runs.items()]
