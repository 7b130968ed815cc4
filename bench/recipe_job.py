"""The user's recipe (bench/recipe.py) as a system under test: started as its own process, its
progress and its replica commits read from outside, as lakemirror's are.

Nothing is asked of the job while it runs. How far a table is applied comes from the query's own
checkpoint: a batch ``n`` is done once ``commits/n`` exists, and the source versions it holds whole
from its end offset in ``offsets/n`` (Delta's streaming-source offset: every version below
``reservoirVersion``, and that version too when the offset stands at its last file index; an
offset inside the initial snapshot counts once it stands at the snapshot's last file). When a
replica commit appeared, and which batch it carried, comes from the replica's commit files: the
``txn`` action the recipe's ``txnAppId``/``txnVersion`` confs make Delta write, and the commit's
``commitInfo.timestamp``.

The files are read through a :class:`Store`: the S3 server's bucket in the benchmark, a local
folder in the tests.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from bench.measure import Apply
from lakemirror.delta_log.layout import LOG_DIR, commit_file_name
from lakemirror.delta_log.stream_offsets import SourceOffset, applied_through_from_offset, version_shape

COMMIT_FILE = re.compile(r"(\d{20})\.json$")


class Store(Protocol):
    """Read-only access to the objects of a bucket (or the files of a folder), by key."""

    def keys(self, prefix: str) -> list[str]: ...

    def read(self, key: str) -> bytes | None: ...


@dataclass
class LocalStore:
    """Files under ``root``: keys are their paths relative to it."""

    root: Path

    def keys(self, prefix: str) -> list[str]:
        folder = self.root / prefix
        if not folder.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in folder.iterdir() if p.is_file())

    def read(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except OSError:
            return None


@dataclass
class S3Store:
    """The objects of one bucket, through a boto3 client."""

    client: Any
    bucket: str

    def keys(self, prefix: str) -> list[str]:
        out: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.extend(o["Key"] for o in page.get("Contents", ()))
        return sorted(out)

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except self.client.exceptions.NoSuchKey:
            return None


def bucket_key(uri: str) -> tuple[str, str]:
    """``s3a://bucket/a/b`` (or ``s3://``) -> (``bucket``, ``a/b``)."""
    match = re.match(r"^s3a?://([^/]+)/?(.*)$", uri)
    if match is None:
        raise ValueError(f"not an S3 location: {uri}")
    return match.group(1), match.group(2).rstrip("/")


def reached_after(offset_json: str, version_files: Callable[[int], int | None],
                  snapshot_files: Callable[[int], int | None]) -> int | None:
    """The highest source version a batch ending at ``offset_json`` holds whole (with every version
    before it); None when it holds no whole version yet (inside the initial snapshot).

    ``version_files(v)``: how many file indexes Delta's source gives version ``v``'s commit;
    ``snapshot_files(v)``: how many files the table's snapshot at ``v`` has (the initial snapshot's
    indexes); either None when it cannot be told."""
    offset = SourceOffset.parse(offset_json)
    if offset.starting:
        files = snapshot_files(offset.version) if offset.index >= 0 else None
        return offset.version if files is not None and offset.index == files - 1 else None
    files = version_files(offset.version) if offset.index >= 0 else None
    return applied_through_from_offset(offset_json, files)


def batch_end_offset(offsets_file_text: str) -> str | None:
    """The source's end offset in a query's ``offsets/<n>`` file (``v1``, the batch's metadata, then
    one line per source: the recipe's queries have one)."""
    lines = [line for line in offsets_file_text.splitlines() if line.strip()]
    return lines[2] if len(lines) >= 3 and lines[0].startswith("v") else None


def txn_commits(commits: Iterable[tuple[int, str]], app_id: str) -> list[tuple[float, int]]:
    """(the commit's time in seconds, the batch id) of each commit that carries a ``txn`` action of
    ``app_id``, from (version, commit file text) pairs, in version order."""
    out: list[tuple[int, float, int]] = []
    for version, text in commits:
        batch = at = None
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            txn = action.get("txn")
            if txn and txn.get("appId") == app_id:
                batch = int(txn["version"])
            info = action.get("commitInfo")
            if info and "timestamp" in info:
                at = info["timestamp"] / 1000.0
        if batch is not None and at is not None:
            out.append((version, at, batch))
    return [(at, batch) for _, at, batch in sorted(out)]


@dataclass
class TableProgress:
    """One table's query, read from its checkpoint folder and the tables' commit files."""

    checkpoint: Path
    source_key: str          # the source's key in the store (``<prefix>/<table>``)
    replica_key: str
    app_id: str
    store: Store
    snapshot_files: Callable[[int], int | None]
    _reached: dict[int, int | None] = field(default_factory=dict)
    _version_files: dict[int, int | None] = field(default_factory=dict)
    _replica_commits: dict[int, str] = field(default_factory=dict)

    def version_files(self, version: int) -> int | None:
        if version not in self._version_files:
            raw = self.store.read(f"{self.source_key}/{LOG_DIR}/{commit_file_name(version)}")
            self._version_files[version] = None if raw is None else version_shape(
                json.loads(line) for line in raw.decode().splitlines() if line.strip()).files
        return self._version_files[version]

    def reached(self, batch: int) -> int | None:
        """The source version batch ``batch`` holds whole; None when unknown or none."""
        if batch not in self._reached:
            try:
                text = (self.checkpoint / "offsets" / str(batch)).read_text()
            except OSError:
                return None  # not planned yet: asked again later
            end = batch_end_offset(text)
            self._reached[batch] = None if end is None else reached_after(end, self.version_files, self.snapshot_files)
        return self._reached[batch]

    def applied_through(self) -> int:
        """The highest source version every committed batch together holds whole (-1: none)."""
        done = [int(p.name) for p in (self.checkpoint / "commits").glob("*") if p.name.isdigit()]
        best = -1
        for batch in done:
            reached = self.reached(batch)
            if reached is not None:
                best = max(best, reached)
        return best

    def batch_times(self) -> list[tuple[float, float, int | None]]:
        """Each committed batch after the first (the initial snapshot): (its start, its seconds, the
        source versions it held whole), from the times Spark wrote its ``offsets`` entry (before the
        batch is read) and its ``commits`` entry (after its ``foreachBatch`` returned)."""
        out = []
        for entry in (self.checkpoint / "commits").glob("*"):
            if not entry.name.isdigit() or entry.name == "0":
                continue
            batch = int(entry.name)
            try:
                start = (self.checkpoint / "offsets" / entry.name).stat().st_mtime
                end = entry.stat().st_mtime
            except OSError:
                continue
            now, before = self.reached(batch), self.reached(batch - 1)
            versions = now - before if now is not None and before is not None else None
            out.append((start, end - start, versions))
        return sorted(out)

    def applies(self) -> list[Apply]:
        """Each replica commit of a batch, at its commit time, with the source version it reached."""
        for key in self.store.keys(f"{self.replica_key}/{LOG_DIR}/"):
            match = COMMIT_FILE.search(key)
            if match and int(match.group(1)) not in self._replica_commits:
                raw = self.store.read(key)
                if raw is not None:
                    self._replica_commits[int(match.group(1))] = raw.decode()
        out = []
        for at, batch in txn_commits(sorted(self._replica_commits.items()), self.app_id):
            reached = self.reached(batch)
            if reached is not None:
                out.append(Apply(at, reached))
        return out


class RecipeJob:
    """bench/recipe.py run as a user would: ``python -m bench.recipe CONFIG`` in its own process."""

    def __init__(self, name: str, workdir: Path, tables: list[str], trigger: float, *, sources: dict[str, str],
                 targets: dict[str, str], store: Store, spark_conf: dict[str, str],
                 snapshot_files: Callable[[str, int], int | None], master: str = "local[2]",
                 driver_memory: str = "2g") -> None:
        self.name, self.workdir, self.tables = name, workdir, tables
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "recipe.json"
        self.config.write_text(json.dumps({
            "master": master, "driver_memory": driver_memory, "trigger_seconds": trigger, "keys": ["id"],
            "spark_conf": spark_conf,
            "tables": {t: {"source": sources[t], "target": targets[t], "checkpoint": str(workdir / "ck" / t),
                           "app_id": f"cdc-recipe-{t}"} for t in tables}}, indent=2))
        self.progress = {t: TableProgress(workdir / "ck" / t, bucket_key(sources[t])[1], bucket_key(targets[t])[1],
                                          f"cdc-recipe-{t}", store,
                                          lambda v, t=t: snapshot_files(t, v)) for t in tables}
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_memory: dict[str, float] = {}
        self.server_pid: int | None = None
        self._final: dict[str, list[Apply]] | None = None

    def start(self) -> None:
        log = (self.workdir / "recipe.log").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.recipe", str(self.config)], stdout=log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_through(self, versions: dict[str, int], timeout: float) -> float:
        """Seconds until every table has applied through its version (raises on timeout)."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the recipe's job exited: see {self.workdir / 'recipe.log'}: {self._log_tail()}")
            if all(self.progress[t].applied_through() >= v for t, v in versions.items()):
                return time.time() - t0
            time.sleep(0.5)
        raise TimeoutError(f"the recipe did not reach {versions} in {timeout}s: "
                           f"{ {t: p.applied_through() for t, p in self.progress.items()} }")

    def _log_tail(self) -> str:
        try:
            return (self.workdir / "recipe.log").read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(180)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._final = {}

    def batches(self, since: float) -> dict[str, Any]:
        """The batches started at or after ``since`` that carried changes, over every table: how many,
        their seconds (p50, p90) and source versions (p50); change rows are not known outside the job."""
        found = [(seconds, versions) for p in self.progress.values() for start, seconds, versions in p.batch_times()
                 if start >= since and versions]
        if not found:
            return {"batches": 0}
        seconds = sorted(s for s, _ in found)
        versions = sorted(v for _, v in found if v is not None)
        return {"batches": len(found), "seconds_p50": seconds[len(seconds) // 2],
                "seconds_p90": seconds[int(len(seconds) * 0.9)], "versions_p50": versions[len(versions) // 2],
                "change_rows_p50": None, "measured_as": "offsets entry to commits entry"}

    def applies(self, table: str) -> list[Apply]:
        if self._final is None:
            return self.progress[table].applies()
        if table not in self._final:
            self._final[table] = self.progress[table].applies()
        return self._final[table]
