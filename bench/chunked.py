"""The chunked bootstrap workload (``make bench ONLY=bootstrap_chunked``).

A ``rows``-row source written in ``files`` appends (one data file each, by delta-rs, from Arrow
arrays: 20M rows are written in seconds). Measured, each in a process of its own (`local[2]`):

- the copy floor: a plain Spark read of the source at its version written as a new Delta table
  (``python -m bench.copy_floor``);
- lakemirror, one chunk per source file (``bootstrap.chunk_bytes`` = the largest file), from
  starting the daemon to a live replica, once with the default key-range reads (public API) and
  once with ``bootstrap.internal_file_reads`` (Delta's internal file reads);
- lakemirror, default reads, SIGKILLed once after half of the chunks are committed and started again
  over the same folders: the chunks committed before the kill, after it, and the chunk commits in
  the replica's log (each chunk exactly once when nothing is written twice);
- the retention run: a second source of the same size with deletion vectors, bootstrapped one chunk
  at a time with a catch-up round of the change feed after each chunk, while a writer in its own
  process (bench/retention_writer.py, Spark) changes it and VACUUMs it with a retention shorter
  than the bootstrap. At the end a fresh change-feed read from the snapshot's next version must
  fail (that proves the retention was shorter than the bootstrap) and the replica must equal the
  source row for row (no change lost). Its pure part: bench/retention.py.
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
from typing import Any, Callable, TypeVar
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml
from deltalake import DeltaTable, write_deltalake

from bench.retention import WriterLog, catch_ups, summarize
from bench.systems import LakemirrorDaemon
from bench.workload import CDF, same_rows, table_path
from lakemirror.delta_log.layout import LOG_DIR, commit_file_name
from lakemirror.sources.chunks import DEFAULT_CHUNK_BYTES
from lakemirror.sources.retention import DELETED_FILE_RETENTION

_COMMITTED = re.compile(r"bootstrap chunk (\d+) committed")
_PINNED = "table src.bench.{table}: bootstrapping from source version "
#: The retention run's source keeps deletion vectors from its creation: an UPDATE or DELETE then
#: marks rows instead of rewriting the snapshot's files, which stay readable after a VACUUM.
DELETION_VECTORS = {**CDF, "delta.enableDeletionVectors": "true"}
#: The retention run's writer (bench/retention_writer.py): seconds between commits, seconds between
#: VACUUMs, how many of the first and of the last ids it changes.
WRITER: dict[str, Any] = {"interval": 1.5, "vacuum_seconds": 10.0, "hot": 2000}
#: The retention run's bootstrap: one chunk at a time, and a copying budget shorter than any chunk,
#: so that a catch-up round of the change feed follows every chunk the source moved past.
RETENTION_BOOTSTRAP: dict[str, Any] = {"parallel_chunks": 1, "chunk_budget_seconds": 1.0}
T = TypeVar("T")


def _source(path: Path, rows: int, files: int, configuration: dict[str, str] | None = None) -> int:
    """Ids ``0 .. rows-1`` (v = id, payload = "p<id>") in ``files`` appends of one file each; returns the
    largest file's size in bytes. Built from Arrow arrays (no Python object per row)."""
    bounds = [rows * i // files for i in range(files + 1)]
    for i in range(files):
        ids = pa.array(np.arange(bounds[i], bounds[i + 1], dtype=np.int64))
        payload = pc.binary_join_element_wise(pa.scalar("p"), pc.cast(ids, pa.string()), "")
        write_deltalake(str(path), pa.table({"id": ids, "v": ids, "payload": payload}),
                        mode="append", configuration=(configuration or CDF) if i == 0 else None)
    return max(int(s) for s in DeltaTable(str(path)).get_add_actions(flatten=True).column("size_bytes").to_pylist())


def _daemon(workdir: Path, warehouse: Path, name: str, chunk_bytes: int | None, internal: bool = False,
            table: str = "big", **bootstrap: Any) -> LakemirrorDaemon:
    """A daemon replicating ``table``; ``chunk_bytes`` None keeps lakemirror's default chunk size."""
    daemon = LakemirrorDaemon(workdir, warehouse, [table], trigger_seconds=1.0, destination_catalog=name)
    config = yaml.safe_load(daemon.config.read_text())
    sizes = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    config["bootstrap"] = {**sizes, "internal_file_reads": internal, **bootstrap}
    daemon.config.write_text(yaml.safe_dump(config))
    return daemon


def _committed(daemon: LakemirrorDaemon) -> list[int]:
    text = (daemon.workdir / "daemon.log").read_text(errors="replace")
    return [int(m.group(1)) for m in _COMMITTED.finditer(text)]


def _chunk_commits(replica: Path) -> int:
    history = DeltaTable(str(replica)).history()
    return sum(1 for h in history if "/bootstrap/chunk/" in str(h.get("userMetadata") or ""))


def bootstrap_chunked(rows: int, files: int, retain_hours: float, seed: int = 42) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-chunked-"))
    warehouse = workdir / "lakehouse"
    src = table_path(warehouse, "src", "bench", "big")
    out: list[dict[str, Any]] = []
    try:
        t0 = time.time()
        largest = _source(src, rows, files)
        written = time.time() - t0
        version = int(DeltaTable(str(src)).version())
        floor_dst = workdir / "floor"
        t0 = time.time()
        done = subprocess.run([sys.executable, "-m", "bench.copy_floor", str(src), str(floor_dst), str(version)],
                              check=True, capture_output=True, text=True)
        floor = time.time() - t0
        out.append({"system": "copy floor (Spark read at V, written as a new Delta table)", "kind": "floor",
                    "rows": rows, "files": files, "source_write_seconds": round(written, 2),
                    "seconds_to_replica": round(floor, 2),
                    "copy_seconds": json.loads(done.stdout.strip().splitlines()[-1])["copy_seconds"],
                    "replica_equal_source": same_rows(src, floor_dst), "load_average_1min": _load()})

        for name, chunk_bytes, internal, label in (
                ("dstd", None, False, f"default settings ({DEFAULT_CHUNK_BYTES // 2**20} MiB chunks, key-range reads)"),
                ("dst", largest, False, "one chunk per file, key-range reads, public API (default)"),
                ("dsti", largest, True, "one chunk per file, file reads through Delta's internal API "
                                        "(bootstrap.internal_file_reads)")):
            daemon = _daemon(workdir / f"lm-{name}", warehouse, name, chunk_bytes, internal)
            t0 = time.time()
            daemon.start()
            daemon.wait_through({"big": version}, timeout=3600)
            total = time.time() - t0
            daemon.stop()
            out.append({"system": f"lakemirror, chunked, {label} (start to live replica)", "kind": "uninterrupted",
                        "rows": rows, "files": files, "seconds_to_replica": round(total, 2),
                        "vs_floor": round(total / floor, 2), "copy_seconds": daemon.bootstrap_seconds("big"),
                        "chunk_bytes": chunk_bytes or DEFAULT_CHUNK_BYTES,
                        "chunk_commits": _chunk_commits(daemon.replica_path("big")),
                        "replica_equal_source": same_rows(src, daemon.replica_path("big")),
                        "load_average_1min": _load()})

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
        out.append({"system": "lakemirror, chunked, one chunk per file, SIGKILLed once half-way (start to live replica)", "kind": "killed",
                    "rows": rows, "files": files, "seconds_to_replica": round(total, 2),
                    "vs_floor": round(total / floor, 2),
                    "chunks_committed_before_kill": len(before), "chunks_committed_after_restart": len(after),
                    "chunks_committed_twice": len(set(before) & set(after)),
                    "chunk_commits": _chunk_commits(killed.replica_path("big")),
                    "replica_equal_source": same_rows(src, killed.replica_path("big")),
                    "load_average_1min": _load()})

        out.append(retention_run(workdir, warehouse, rows, files, retain_hours, seed))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def _load() -> float:
    return round(os.getloadavg()[0], 1)


# -- the retention run ----------------------------------------------------------------------------

RETENTION_SYSTEM = "lakemirror, chunked, source changed and VACUUMed during the bootstrap"


def retention_interval(retain_hours: float) -> str:
    """The source's ``delta.deletedFileRetentionDuration`` for a retention of ``retain_hours``, in
    whole seconds (what the writer's plain VACUUM keeps, and what lakemirror reads as the source's
    change window)."""
    return f"interval {max(1, round(retain_hours * 3600))} seconds"


def retention_run(workdir: Path, warehouse: Path, rows: int, files: int, retain_hours: float, seed: int,
                  timeout: float = 3600.0) -> dict[str, Any]:
    """Bootstrap a source with deletion vectors while a writer changes it and VACUUMs it with a
    retention of ``retain_hours``; see the module docstring. A run that fails is reported as such
    (``error``), never dropped."""
    src = table_path(warehouse, "src", "bench", "hot")
    row: dict[str, Any] = {"system": RETENTION_SYSTEM, "kind": "retention", "rows": rows, "files": files,
                           "retain_hours": retain_hours, "vacuum": "table retention", "writer": WRITER,
                           "bootstrap": RETENTION_BOOTSTRAP}
    control = workdir / "writer"
    control.mkdir()
    largest = _source(src, rows, files, {**DELETION_VECTORS, DELETED_FILE_RETENTION: retention_interval(retain_hours)})
    writer = subprocess.Popen(
        [sys.executable, "-m", "bench.retention_writer", str(src), str(control), "--rows", str(rows),
         "--seed", str(seed), "--hot", str(WRITER["hot"]),
         "--interval", str(WRITER["interval"]), "--vacuum-seconds", str(WRITER["vacuum_seconds"])],
        stdout=(workdir / "writer.log").open("ab"), stderr=subprocess.STDOUT)
    daemon = _daemon(workdir / "lm-retention", warehouse, "dstr", largest, table="hot", **RETENTION_BOOTSTRAP)
    try:
        watch = _Watch(writer, daemon, "hot", workdir / "writer.log")
        watch.until(lambda: (control / "ready").exists(), 600, "the writer's Spark session to start")
        daemon.start()
        pinned = watch.until(lambda: _pinned(daemon, "hot"), 600, "the daemon to pin its snapshot version")
        (control / "go").touch()  # the writer's first commit is the first pin + 1: that snapshot holds no deletion vector
        marks = watch.until(lambda: _bootstrapped(daemon, "hot"), timeout, "the bootstrap to end")
        # The source sat idle longer than its retention before the writer's first commit, so Delta
        # refuses the first pin once that commit lands and the daemon pins again (a new epoch).
        pins = _pins(daemon, "hot")
        pinned = pins[-1]
        (control / "stop").write_text(json.dumps({"cdf_from": pinned + 1}))
        writer.wait(600)
        result = json.loads((control / "result.json").read_text())
        if "error" in result:
            raise RuntimeError(f"the writer failed: {result['error']}")
        writer_log = WriterLog.parse((control / "events.jsonl").read_text().splitlines())
        # the writer's last MERGE (a VACUUM may commit versions of its own, which change no row)
        final = max((c["version"] for c in writer_log.commits), default=pinned)
        watch.until(lambda: watch.applied_through() >= final, 600, f"the daemon to apply source version {final}")
        rounds = catch_ups((daemon.workdir / "daemon.log").read_text(errors="replace"))
        row.update(summarize(writer_log, pinned=pinned, started=marks["start"], ended=marks["done"],
                             retain_hours=retain_hours))
        row.update({"pinned_version": pinned, "pins": pins, "last_source_version": final, "catch_up_rounds": len(rounds),
                    "catch_up_change_rows": sum(r["change_rows"] for r in rounds),
                    "cdf_from": result.get("cdf_from"), "cdf_read_works": result.get("cdf_read_works"),
                    "cdf_error": result.get("cdf_error"),
                    "first_change_files": _change_files(src, pinned + 1),
                    "chunk_commits": _chunk_commits(daemon.replica_path("hot")),
                    "replica_equal_source": same_rows(src, daemon.replica_path("hot"))})
    except Exception as exc:  # noqa: BLE001 (the section says the run failed, and why)
        row.update({"error": f"{type(exc).__name__}: {str(exc)[:400]}", "replica_equal_source": False})
    finally:
        if writer.poll() is None:
            (control / "stop").touch()  # a writer still waiting for "go" exits too
            try:
                writer.wait(120)
            except subprocess.TimeoutExpired:
                writer.kill()
        daemon.stop()
    row["load_average_1min"] = _load()
    return row


def _change_files(table: Path, version: int) -> dict[str, int]:
    """The change data files (``cdc`` actions) version ``version`` of ``table`` wrote, and how many of
    them are still on disk: none left means a VACUUM removed that version's change data."""
    commit = table / LOG_DIR / commit_file_name(version)
    if not commit.is_file():
        return {"written": 0, "left": 0}
    actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
    paths = [a["cdc"]["path"] for a in actions if "cdc" in a]
    return {"written": len(paths), "left": sum(1 for p in paths if (table / unquote(p)).exists())}


def _pinned(daemon: LakemirrorDaemon, table: str) -> int | None:
    """The snapshot version the daemon's log says the table's bootstrap pinned first (None before that line)."""
    pins = _pins(daemon, table)
    return pins[0] if pins else None


def _pins(daemon: LakemirrorDaemon, table: str) -> list[int]:
    """Every snapshot version the daemon's log says the table's bootstrap pinned, in order."""
    log = daemon.workdir / "daemon.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [int(v) for v in re.findall(re.escape(_PINNED.format(table=table)) + r"(\d+)", text)]


def _bootstrapped(daemon: LakemirrorDaemon, table: str) -> dict[str, float] | None:
    """The bootstrap's start and end times from the daemon's log, once it has ended (else None)."""
    marks = daemon.bootstrap_marks(table)
    return marks if "done" in marks else None


class _Watch:
    """Waits for a condition while the writer and the daemon live and the table has not failed."""

    def __init__(self, writer: "subprocess.Popen[bytes]", daemon: LakemirrorDaemon, table: str, writer_log: Path):
        self.writer, self.daemon, self.table, self.writer_log = writer, daemon, table, writer_log

    def applied_through(self) -> int:
        value = self.daemon.status().get(self.table, {}).get("applied_through")
        return -1 if value is None else int(value)

    def until(self, condition: Callable[[], T | None | bool], timeout: float, what: str) -> T:
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = condition()
            if value is not None and value is not False:
                return value  # type: ignore[return-value]
            if self.writer.poll() is not None and self.writer.returncode != 0:
                tail = self.writer_log.read_text(errors="replace")[-600:]
                raise RuntimeError(f"the writer exited ({self.writer.returncode}) waiting for {what}: {tail}")
            if self.daemon.proc is not None:
                if self.daemon.proc.poll() is not None:
                    raise RuntimeError(f"the daemon died waiting for {what}: see its daemon.log")
                view = self.daemon.status().get(self.table, {})
                if view.get("state") == "failed":
                    raise RuntimeError(f"the table failed waiting for {what}: {view.get('last_error')}")
            time.sleep(0.3)
        raise TimeoutError(f"waited {timeout:.0f} s for {what}")


# -- the report ------------------------------------------------------------------------------------

def _lead(when: str) -> str:
    return when + " " if when else ""


def render(rows: list[dict[str, Any]], when: Callable[[dict[str, Any]], str]) -> list[str]:
    """docs/BENCHMARKS.md's "Chunked bootstrap" section; ``when`` says when a row was measured."""
    copies = [r for r in rows if r.get("kind") != "retention"]
    lines = ["## Chunked bootstrap"]
    if copies:
        r0 = copies[0]
        written = (f" (written in {r0['source_write_seconds']} s)" if r0.get("source_write_seconds") is not None
                   else "")
        lines += ["", _lead(when(r0)) +
                  f"A {r0['rows']:,}-row table written in {r0['files']} appends (one file each, by delta-rs){written}, "
                  f"copied by lakemirror: once with the default settings (what a user gets: "
                  f"`bootstrap.chunk_bytes` {DEFAULT_CHUNK_BYTES // 2**20} MiB), then in one chunk per file "
                  f"(`bootstrap.chunk_bytes` = the largest file, the most chunks this table can be cut into) "
                  f"uninterrupted with each of the two chunk reads, and once SIGKILLed after half of the chunks were "
                  f"committed and started again. One run of each.", "",
                  "| system | start to replica s | vs copy floor | chunks committed before / after the kill | "
                  "chunk commits in the replica | replica exact | 1-min load at the row's end |",
                  "|---|---|---|---|---|---|---|"]
        for r in copies:
            kill = (f"{r['chunks_committed_before_kill']} / {r['chunks_committed_after_restart']}"
                    if "chunks_committed_before_kill" in r else "-")
            lines.append(f"| {r['system']} | {r['seconds_to_replica']} | {r.get('vs_floor', 1.0)}x | {kill} | "
                         f"{r.get('chunk_commits', '-')} | {'yes' if r['replica_equal_source'] else 'NO'} | "
                         f"{r.get('load_average_1min', '-')} |")
    for r in (r for r in rows if r.get("kind") == "retention"):
        lines += ["", *render_retention(r, when)]
    return lines


def render_retention(r: dict[str, Any], when: Callable[[dict[str, Any]], str]) -> list[str]:
    """The retention run's paragraph and table (bench/retention.py's figures)."""
    w, b = r.get("writer") or WRITER, r.get("bootstrap") or RETENTION_BOOTSTRAP
    hours = r["retain_hours"]
    lines = ["### Retention shorter than the bootstrap", "", _lead(when(r)) +
             f"A second {r['rows']:,}-row source of {r['files']} files, with deletion vectors on from its creation "
             f"(so the snapshot's own files stay readable after a VACUUM), bootstrapped by lakemirror one chunk per "
             f"file, {b['parallel_chunks']} at a time, with `bootstrap.chunk_budget_seconds: {b['chunk_budget_seconds']}` "
             f"(a catch-up round of the change feed after every chunk the source moved past). From the moment the "
             f"daemon pins the snapshot version V, a writer in its own process (Spark `local[1]`, "
             f"`bench/retention_writer.py`) commits one MERGE every {w['interval']} s or as fast as it can (updates, "
             f"deletes, re-inserts of deleted keys, a few new keys, among the first and the last {w['hot']:,} ids) "
             + (f"and, beside the commits, runs a plain `VACUUM` {w['vacuum_seconds']:.0f} s after the previous one "
                f"ended, which keeps what the source's `delta.deletedFileRetentionDuration` ({hours * 3600:.0f} s, set at "
                f"its creation) protects. " if r.get("vacuum") == "table retention" else
                f"and, beside the commits, runs `VACUUM … RETAIN {hours} HOURS` {w['vacuum_seconds']:.0f} s after the "
                f"previous one ended; Delta rounds RETAIN to whole hours, so these VACUUMs kept nothing removed "
                f"(no retention at all, not {hours * 3600:.0f} s), and the retention figures below are not what "
                f"the VACUUMs used. ") +
             f"When the bootstrap ends the writer stops and reads the change feed from V+1 afresh: that read must "
             f"fail, and a VACUUM during the bootstrap must have been able to remove V+1's change data, for the run "
             f"to prove that only the interleaving kept the changes. The replica is then compared with "
             f"the source row for row, once the daemon has applied the writer's last version.", ""]
    if r.get("error"):
        return lines + [f"**The run failed:** {r['error']}"]
    if r.get("cdf_read_works") is not False:
        cdf = "WORKS: the retention was not shorter than this bootstrap, the run proves nothing"
    elif r.get("vacuum_removed_first_change_by") is not None:
        cdf = "fails (a VACUUM during the bootstrap could remove V+1's change data)"
    else:
        cdf = ("fails, but no VACUUM during the bootstrap could remove V+1's change data: exact, but not proof "
               "that only the interleaving kept the changes")
    changes = r.get("changes_during_bootstrap") or {}
    lines += ["| rows | bootstrap s | retention s | bootstrap / retention | source versions written during the "
              "bootstrap | VACUUMs during it | catch-up rounds | fresh change-feed read from V+1 at the end | "
              "replica == source (changes lost) | 1-min load at the row's end |",
              "|---|---|---|---|---|---|---|---|---|---|",
              f"| {r['rows']:,} | {r['bootstrap_seconds']} | {r['retain_seconds']:.0f} | "
              f"{r['bootstrap_over_retention']}x | {r['versions_during_bootstrap']} | {r['vacuums_during_bootstrap']} | "
              f"{r['catch_up_rounds']} | {cdf} | "
              f"{'yes (0 lost)' if r['replica_equal_source'] else 'NO (changes lost)'} | "
              f"{r.get('load_average_1min', '-')} |", "",
              f"During the bootstrap the writer updated {changes.get('updates', 0):,} rows, deleted "
              f"{changes.get('deletes', 0):,}, inserted {changes.get('reinserts', 0):,} deleted keys again and "
              f"{changes.get('inserts', 0):,} new ones (V = {r['pinned_version']}; " + (
                  f"its commits during the bootstrap were versions V+1 to {r['last_version_during_bootstrap']}"
                  if r["versions_during_bootstrap"] else "it committed nothing during the bootstrap") +
              f", its last commit, before it stopped, version {r['last_source_version']}). " + (
                  f"The first VACUUM that could remove version V+1's change data ran {r['vacuum_removed_first_change_by']} s "
                  f"into the bootstrap." if r.get("vacuum_removed_first_change_by") is not None else
                  "No VACUUM during the bootstrap ran more than the retention after version V+1.") +
              (f" The fresh read's error: `{r['cdf_error']}`." if r.get("cdf_error") else "") +
              (f" Version V+1 wrote {r['first_change_files']['written']} change data file(s); "
               f"{r['first_change_files']['left']} of them were still on disk at the end."
               if (r.get("first_change_files") or {}).get("written") else "") + (
                  f" The daemon pinned versions {', '.join(map(str, r['pins']))} in turn: the source had been idle "
                  f"longer than its retention when first pinned, and once the writer's first commit landed Delta "
                  f"refused to read the older pin, so the table pinned the latest version again."
                  if len(r.get("pins") or []) > 1 else "")]
    return lines
