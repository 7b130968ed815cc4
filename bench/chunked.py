"""The chunked bootstrap workload (``make bench ONLY=bootstrap_chunked``).

A ``rows``-row source written in ``files`` appends (one data file each, by delta-rs). Measured, each
in a process of its own (`local[2]`):

- the copy floor: a plain Spark read of the source at its version written as a new Delta table
  (``python -m bench.copy_floor``);
- lakemirror, one chunk per source file (``bootstrap.chunk_bytes`` = the largest file), from
  starting the daemon to a live replica, once with the default key-range reads (public API) and
  once with ``bootstrap.internal_file_reads`` (Delta's internal file reads);
- lakemirror, default reads, SIGKILLed once after half of the chunks are committed and started again
  over the same folders: the chunks committed before the kill, after it, and the chunk commits in
  the replica's log (each chunk exactly once when nothing is written twice).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from deltalake import DeltaTable, write_deltalake

from bench.systems import LakemirrorDaemon
from bench.workload import CDF, same_rows, table_path

_COMMITTED = re.compile(r"bootstrap chunk (\d+) committed")


def _source(path: Path, rows: int, files: int) -> int:
    per = rows // files
    for i in range(files):
        ids = pa.array(range(i * per, (i + 1) * per), pa.int64())
        write_deltalake(str(path), pa.table({"id": ids, "v": ids, "payload": pa.array([f"p{j}" for j in range(i * per, (i + 1) * per)])}),
                        mode="append", configuration=CDF if i == 0 else None)
    return max(int(s) for s in DeltaTable(str(path)).get_add_actions(flatten=True).column("size_bytes").to_pylist())


def _daemon(workdir: Path, warehouse: Path, name: str, chunk_bytes: int, internal: bool = False) -> LakemirrorDaemon:
    daemon = LakemirrorDaemon(workdir, warehouse, ["big"], trigger_seconds=1.0, destination_catalog=name)
    config = yaml.safe_load(daemon.config.read_text())
    config["bootstrap"] = {"chunk_bytes": chunk_bytes, "internal_file_reads": internal}
    daemon.config.write_text(yaml.safe_dump(config))
    return daemon


def _committed(daemon: LakemirrorDaemon) -> list[int]:
    text = (daemon.workdir / "daemon.log").read_text(errors="replace")
    return [int(m.group(1)) for m in _COMMITTED.finditer(text)]


def _chunk_commits(replica: Path) -> int:
    history = DeltaTable(str(replica)).history()
    return sum(1 for h in history if "/bootstrap/chunk/" in str(h.get("userMetadata") or ""))


def bootstrap_chunked(rows: int, files: int) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-chunked-"))
    warehouse = workdir / "lakehouse"
    src = table_path(warehouse, "src", "bench", "big")
    out: list[dict[str, Any]] = []
    try:
        largest = _source(src, rows, files)
        version = int(DeltaTable(str(src)).version())
        floor_dst = workdir / "floor"
        t0 = time.time()
        done = subprocess.run([sys.executable, "-m", "bench.copy_floor", str(src), str(floor_dst), str(version)],
                              check=True, capture_output=True, text=True)
        floor = time.time() - t0
        out.append({"system": "copy floor (Spark read at V, written as a new Delta table)", "rows": rows,
                    "files": files, "seconds_to_replica": round(floor, 2),
                    "copy_seconds": json.loads(done.stdout.strip().splitlines()[-1])["copy_seconds"],
                    "replica_equal_source": same_rows(src, floor_dst), "load_average_1min": round(os.getloadavg()[0], 1)})

        for internal, label in ((False, "key-range reads, public API (default)"),
                                (True, "file reads through Delta's internal API (bootstrap.internal_file_reads)")):
            name = "dsti" if internal else "dst"
            daemon = _daemon(workdir / f"lm-{name}", warehouse, name, largest, internal)
            t0 = time.time()
            daemon.start()
            daemon.wait_through({"big": version}, timeout=3600)
            total = time.time() - t0
            daemon.stop()
            out.append({"system": f"lakemirror, chunked, {label} (start to live replica)", "rows": rows,
                        "files": files, "seconds_to_replica": round(total, 2), "vs_floor": round(total / floor, 2),
                        "copy_seconds": daemon.bootstrap_seconds("big"),
                        "chunk_commits": _chunk_commits(daemon.replica_path("big")),
                        "replica_equal_source": same_rows(src, daemon.replica_path("big")),
                        "load_average_1min": round(os.getloadavg()[0], 1)})

        killed = _daemon(workdir / "lmk", warehouse, "dstk", largest)
        t0 = time.time()
        killed.start()
        while len(_committed(killed)) < files // 2:
            assert killed.proc is not None and killed.proc.poll() is None, "the daemon died: see daemon.log"
            time.sleep(0.05)
        assert killed.proc is not None
        killed.proc.kill()  # SIGKILL
        killed.proc.wait()
        before = _committed(killed)
        killed.start()
        killed.wait_through({"big": version}, timeout=3600)
        total = time.time() - t0
        killed.stop()
        after = _committed(killed)[len(before):]
        out.append({"system": "lakemirror, chunked, SIGKILLed once half-way (start to live replica)", "rows": rows,
                    "files": files, "seconds_to_replica": round(total, 2), "vs_floor": round(total / floor, 2),
                    "chunks_committed_before_kill": len(before), "chunks_committed_after_restart": len(after),
                    "chunks_committed_twice": len(set(before) & set(after)),
                    "chunk_commits": _chunk_commits(killed.replica_path("big")),
                    "replica_equal_source": same_rows(src, killed.replica_path("big")),
                    "load_average_1min": round(os.getloadavg()[0], 1)})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out
