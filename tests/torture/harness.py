"""Crash torture: a sequence-numbered writer, the daemon killed again and again, then the proof.

A seeded writer drives two source tables with inserts, updates, deletes and re-inserts of the
same keys (every row carries the sequence number of the operation that last wrote it, and one
table has a composite key and NULLs). The daemon runs as a subprocess and is killed with SIGKILL,
either by itself at a named crash point (``LAKEMIRROR_TEST_KILL_AT``, see
``supervisor/change_feed/table_runner.py: FAULT_POINTS``) or by the harness at a random moment, then restarted.
After the writer stops, a last daemon catches up and drains, and :func:`verify` checks:

- each replica equals its source row for row (a full comparison, not counts), so no sequence
  number is missing or stale;
- no Delta transaction (pipeline, table, epoch, batch) was committed twice to a replica; with a
  PostgreSQL destination (``Torture(postgres=…)``, killed also inside the batch's transaction at
  ``postgres_after_copy`` and ``postgres_before_commit``), the progress rows committed with the data
  show each source version applied once;
- the checkpoint rows tell a consistent story: one row per batch and epoch, versions that never
  go backwards, and the last one reaching the source's version.

Used by ``tests/e2e/test_torture.py`` (a short run in CI) and ``scripts/torture.py``
(``make torture``: the full run, results to ``docs/RELIABILITY.md``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.merge.delta_merge import is_txn_tag
from lakemirror.sources.catalog import LocalCatalog

LAKEMIRROR = [sys.executable, "-m", "lakemirror.daemon.cli"]
#: The JVM options of the daemons the tortures launch: each lives for a minute or two, most of it
#: starting, and on two cores the JIT's optimizing compiler (C2) spends more of that minute compiling
#: code than the compiled code saves; the quick compiler alone starts the daemon and its first Delta
#: work about a third sooner. (A long-running daemon keeps the JVM's default: there C2's code pays.)
DAEMON_JVM_OPTIONS = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
NAMED_POINTS = ("bootstrap_before_snapshot", "bootstrap_after_snapshot", "before_merge", "after_merge",
                "before_commit_log", "schema_change")
TABLES = ("events", "pairs")
#: Points a restarted daemon passes again and again (bootstrap and the schema change happen once).
REPEATABLE_POINTS = ("before_merge", "after_merge", "before_commit_log")
#: With a Postgres destination: inside the batch's transaction after the COPY into staging and
#: after the upsert before COMMIT, then after the COMMIT (before the checkpoint row, and before
#: Spark's commit log), with the bootstrap's points and an additive schema change.
POSTGRES_POINTS = ("bootstrap_after_snapshot", "postgres_after_copy", "postgres_before_commit", "after_merge",
                   "before_commit_log", "schema_change")
POSTGRES_REPEATABLE = ("postgres_after_copy", "postgres_before_commit", "after_merge", "before_commit_log")
#: With the lakehouse on S3 (``Torture(warehouse="s3a://…")``): the named points, and the driver's delta-rs
#: commit in the bucket before anything records it.
S3_POINTS = (*NAMED_POINTS, "after_driver_commit")
S3_REPEATABLE = (*REPEATABLE_POINTS, "after_driver_commit")
#: The smokes' writer (one kill at one point): a source commit every 4 s, not 0.7 s, still puts changes in
#: the batches at the point, and its Spark jobs leave the daemon's start most of the two cores.
SMOKE_WRITER_INTERVAL = 4.0


def schedule(kills: int, seed: int, points: tuple[str, ...] = NAMED_POINTS,
             repeatable: tuple[str, ...] = REPEATABLE_POINTS) -> list[str]:
    """The order of kills: every named point once, then random moments alternating with repeatable
    points reached at a later arrival (``point:n``), so crashes also land mid-stream, not only on
    a restarted daemon's first batch."""
    rng = random.Random(seed)
    plan = list(points[:kills])
    while len(plan) < kills:
        plan.append("random" if len(plan) % 2 else f"{rng.choice(repeatable)}:{rng.randint(2, 6)}")
    return plan


@dataclass
class KillRecord:
    point: str            # a named crash point, or "random"
    reached: bool         # the daemon died at the point (False: the harness killed it on timeout)
    seconds: float


@dataclass
class TortureReport:
    seed: int
    kills: list[KillRecord] = field(default_factory=list)
    writer_commits: int = 0
    writer_ops: int = 0
    batches_replayed: int = 0
    checks: dict[str, str] = field(default_factory=dict)
    elapsed_seconds: float = 0.0

    @property
    def kill_count(self) -> int:
        return len(self.kills)


class Writer:
    """Seeded inserts, updates, deletes and re-inserts; each row stamped with its sequence number."""

    def __init__(self, spark: Any, catalog: LocalCatalog, schema: TableName, seed: int) -> None:
        self.spark = spark
        self.rng = random.Random(seed)
        self.events = catalog.locate(TableName(schema.catalog, schema.schema, "events"))
        self.pairs = catalog.locate(TableName(schema.catalog, schema.schema, "pairs"))
        self.seq = 0
        self.commits = 0
        self.live: set[int] = set()
        self.dead: set[int] = set()
        self.next_id = 0
        self.extra_column = False
        self._stop = threading.Event()
        self._lock = threading.Lock()   # one source commit at a time: the loop's and add_column's
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def create(self) -> None:
        cdf = "'delta.enableChangeDataFeed' = 'true'"
        self.spark.sql(f"CREATE TABLE {self.events.sql} (id BIGINT NOT NULL, seq BIGINT, payload STRING) "
                       f"USING DELTA TBLPROPERTIES ({cdf})")
        self.spark.sql(f"CREATE TABLE {self.pairs.sql} (a INT NOT NULL, b STRING, seq BIGINT, note STRING) "
                       f"USING DELTA TBLPROPERTIES ({cdf}, 'lakemirror.primaryKey' = 'a,b')")
        for _ in range(3):
            self.step()

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def step(self, op: str | None = None) -> None:
        """One source commit per table: a random mix of operations (``op``: this operation on the
        events table: insert, update, delete or reinsert)."""
        with self._lock:
            self._step(op)

    def _insert_events(self, rows: list[tuple[int, int, str]]) -> None:
        if self.extra_column:  # after the schema change, new rows fill the new column
            values = ", ".join(f"({i}, {s}, '{p}', 'r{i % 3}')" for i, s, p in rows)
            self.spark.sql(f"INSERT INTO {self.events.sql} (id, seq, payload, region) VALUES {values}")
        else:
            values = ", ".join(f"({i}, {s}, '{p}')" for i, s, p in rows)
            self.spark.sql(f"INSERT INTO {self.events.sql} (id, seq, payload) VALUES {values}")

    def _step(self, op: str | None = None) -> None:
        rng = self.rng
        op = op or rng.choice(("insert", "insert", "update", "delete", "reinsert"))
        if op == "insert" or not self.live:
            rows = []
            for _ in range(rng.randint(1, 20)):
                rows.append((self.next_id, self._next(), f"p{self.next_id}"))
                self.live.add(self.next_id)
                self.next_id += 1
            self._insert_events(rows)
        elif op == "update":
            ids = rng.sample(sorted(self.live), min(len(self.live), rng.randint(1, 10)))
            self.spark.sql(f"UPDATE {self.events.sql} SET seq = {self._next()}, payload = concat(payload, '+') "
                           f"WHERE id IN ({', '.join(map(str, ids))})")
        elif op == "delete":
            ids = rng.sample(sorted(self.live), min(len(self.live), rng.randint(1, 5)))
            self.spark.sql(f"DELETE FROM {self.events.sql} WHERE id IN ({', '.join(map(str, ids))})")
            self.live -= set(ids)
            self.dead |= set(ids)
        else:  # re-insert keys deleted before: same key, new sequence
            ids = rng.sample(sorted(self.dead), min(len(self.dead), rng.randint(1, 5))) if self.dead else []
            if ids:
                self._insert_events([(i, self._next(), f"again{i}") for i in ids])
                self.dead -= set(ids)
                self.live |= set(ids)
        # The composite-key table: an upsert of a few keys (NULL notes included) in one MERGE,
        # and sometimes a delete.
        a = rng.randint(0, 30)
        seq = self._next()
        note = "NULL" if rng.random() < 0.3 else f"'n{seq}'"
        self.spark.sql(
            f"MERGE INTO {self.pairs.sql} t USING (SELECT {a} AS a, 'k{a % 3}' AS b, {seq} AS seq, "
            f"CAST({note} AS STRING) AS note) s ON t.a = s.a AND t.b = s.b "
            f"WHEN MATCHED AND {seq} % 7 = 0 THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
        self.commits += 2

    def add_column(self) -> None:
        """An additive schema change the daemon must follow."""
        with self._lock:
            if not self.extra_column:
                self.spark.sql(f"ALTER TABLE {self.events.sql} ADD COLUMNS (region STRING)")
                self.extra_column = True
                self.commits += 1

    def start(self, interval_seconds: float) -> None:
        def loop() -> None:
            try:
                while not self._stop.wait(interval_seconds):
                    self.step()
            except BaseException as exc:  # surfaced by stop()
                self.error = exc
        self._stop.clear()
        self._thread = threading.Thread(target=loop, name="torture-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)
        if self.error is not None:
            raise RuntimeError(f"the writer failed: {self.error}") from self.error


class DaemonProcess:
    """A ``lakemirror run`` process. It runs in an empty working directory of its own (``cwd``): every
    path of the configuration is absolute, so the daemon may write nothing there, whatever it does
    and wherever it is killed (:meth:`assert_nothing_in_the_working_directory`)."""

    def __init__(self, config: Path, pipeline_dir: Path, log: Path) -> None:
        self.config, self.pipeline_dir, self.log = config, pipeline_dir, log
        self.cwd = config.parent / "cwd"
        self.cwd.mkdir(exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, kill_at: str | None = None) -> None:
        (self.pipeline_dir / "daemon.json").unlink(missing_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("LAKEMIRROR_TEST_KILL_AT", None)
        if kill_at:
            env["LAKEMIRROR_TEST_KILL_AT"] = kill_at
        with self.log.open("ab") as out:
            out.write(f"\n===== start (kill_at={kill_at}) at {time.strftime('%H:%M:%S')} =====\n".encode())
        self.proc = subprocess.Popen([*LAKEMIRROR, "run", str(self.config)], stdout=self.log.open("ab"),
                                     stderr=subprocess.STDOUT, env=env, cwd=self.cwd)

    def assert_nothing_in_the_working_directory(self) -> None:
        written = sorted(p.name for p in self.cwd.iterdir())
        assert not written, f"the daemon wrote outside the configured paths, in its working directory: {written}"

    def status(self) -> dict[str, Any] | None:
        endpoint = self.pipeline_dir / "daemon.json"
        try:
            url = json.loads(endpoint.read_text())["url"]
            with urllib.request.urlopen(f"{url}/status", timeout=5) as resp:
                return json.load(resp)  # type: ignore[no-any-return]
        except (OSError, ValueError, KeyError):
            return None

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(60)

    def kill_at(self, point: str, timeout: float) -> KillRecord:
        """Start the daemon armed to SIGKILL itself at the named crash ``point`` and wait for it to die
        there; after ``timeout`` seconds the harness kills it (the record says the point was not
        reached). Any other exit fails the run with the log's tail."""
        t0 = time.time()
        self.start(kill_at=point)
        code = self.wait_exit(timeout)
        if code is None:
            self.kill()
        elif code != -signal.SIGKILL:
            raise AssertionError(f"the daemon exited with {code} instead of dying at {point}:\n{self.tail()}")
        return KillRecord(point, code == -signal.SIGKILL, time.time() - t0)

    def terminate(self, timeout: float = 180) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


class Torture:
    """``postgres``: the ``destination:`` block of a PostgreSQL server (replicas there, not Delta),
    plus ``connect``: a callable returning a psycopg connection to it (for the proof). ``warehouse``:
    the lakehouse elsewhere than under ``workdir`` (an ``s3a://`` prefix, with ``hadoop_conf``: the
    ``fs.s3a.*`` settings the daemon's Spark gets, as the test's own session already has them)."""

    def __init__(self, spark: Any, workdir: Path, seed: int = 7, writer_interval: float = 0.7,
                 replica_properties: dict[str, str] | None = None,
                 postgres: dict[str, Any] | None = None, connect: Any = None,
                 warehouse: str | None = None, hadoop_conf: dict[str, str] | None = None,
                 runtime: dict[str, Any] | None = None) -> None:
        """``runtime``: more ``runtime`` settings of the daemon (e.g. ``mode: connect`` and its
        ``spark_remote``: the batches are then applied on that server, the writer still writes here)."""
        self.spark = spark
        self.workdir = workdir
        self.seed = seed
        self.writer_interval = writer_interval
        self.postgres = postgres
        self.connect = connect
        on_s3 = warehouse is not None and warehouse.startswith("s3a://")
        self.points = POSTGRES_POINTS if postgres else S3_POINTS if on_s3 else NAMED_POINTS
        self.repeatable = POSTGRES_REPEATABLE if postgres else S3_REPEATABLE if on_s3 else REPEATABLE_POINTS
        lakehouse = warehouse or str(workdir / "lakehouse")
        self.catalog = LocalCatalog(lakehouse)
        self.writer = Writer(spark, self.catalog, TableName("src", "torture", "_"), seed)
        self.report = TortureReport(seed)
        config = workdir / "pipeline.yaml"
        config.write_text(yaml.safe_dump({
            "pipeline_id": "torture", "source_catalog": "src", "destination_catalog": "dst",
            "schema_name": "torture", "checkpoint_volume": str(workdir / "ck"),
            "trigger_interval_seconds": 0.5, "lag_interval_seconds": 1, "discover_interval_seconds": 5,
            "runtime": {"warehouse": lakehouse, "shuffle_partitions": 2,
                        "spark_conf": {**DAEMON_JVM_OPTIONS,
                                       **{f"spark.hadoop.{k}": v for k, v in (hadoop_conf or {}).items()}},
                        **(runtime or {})},
            "http": {"port": 0}, "restart": {"base_delay_seconds": 0.5, "max_delay_seconds": 4},
            **({"replica_properties": replica_properties} if replica_properties else {}),
            **({"destination": postgres} if postgres else {})}))
        self.daemon = DaemonProcess(config, workdir / "ck" / "torture", workdir / "daemon.log")

    def source(self, table: str) -> Any:
        return self.catalog.locate(TableName("src", "torture", table))

    def replica(self, table: str) -> Any:
        return self.catalog.locate(TableName("dst", "torture", table))

    def latest(self, table: str) -> int:
        return int(tables.delta_table(self.spark, self.source(table)).history(1).collect()[0]["version"])

    # -- the run -----------------------------------------------------------------------------

    def run(self, kills: int, point_timeout: float = 150.0, rng_kill: tuple[float, float] = (4.0, 20.0),
            progress: Any = None, points: tuple[str, ...] | None = None) -> TortureReport:
        """``kills`` SIGKILLs on the :func:`schedule` of this torture's named points, or exactly at
        ``points`` (a smoke of chosen mechanisms) when given."""
        started = time.time()
        rng = random.Random(self.seed + 1)
        self.writer.create()
        writer_started = False
        plan = list(points) if points is not None else schedule(kills, self.seed, self.points, self.repeatable)
        for point in plan:
            if point == "schema_change":
                self.writer.add_column()
            if not writer_started and not point.startswith("bootstrap"):
                # Every later point needs batches with changes in them: the writer runs from now on.
                self.writer.start(self.writer_interval)
                writer_started = True
            if point == "random":
                t0 = time.time()
                self.daemon.start()
                time.sleep(rng.uniform(*rng_kill))
                self.daemon.kill()
                self.report.kills.append(KillRecord(point, True, time.time() - t0))
            else:
                self.report.kills.append(self.daemon.kill_at(point, point_timeout))
            if progress is not None:
                progress(len(self.report.kills), self.report.kills[-1])
        self.writer.stop()
        # Changes after the last kill, in every table, for the last daemon to apply (the writer's last
        # random steps may have left a table where the bootstrap read it).
        self.writer.step("insert")
        self.report.writer_commits = self.writer.commits
        self.report.writer_ops = self.writer.seq
        self.catch_up_and_drain()
        self.report.batches_replayed = self.daemon.log.read_text(errors="replace").count("was already committed")
        self.verify()
        self.report.elapsed_seconds = time.time() - started
        return self.report

    def catch_up_and_drain(self, timeout: float = 300.0) -> None:
        self.daemon.start()
        latest = {t: self.latest(t) for t in TABLES}
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.daemon.proc is not None and self.daemon.proc.poll() is None, self.daemon.tail()
            st = self.daemon.status()
            views = {r["table"]: r for r in (st or {}).get("tables", [])}
            if all(views.get(t, {}).get("state") == "running" and (views[t].get("applied_through") or -1) >= v
                   for t, v in latest.items()):
                break
            time.sleep(1.0)
        else:
            raise AssertionError(f"the last daemon did not catch up in {timeout}s: {self.daemon.status()}\n"
                                 f"{self.daemon.tail()}")
        code = self.daemon.terminate()
        assert code == 0, f"SIGTERM must drain to exit 0, got {code}:\n{self.daemon.tail()}"

    # -- the proof -----------------------------------------------------------------------------

    def replica_rows(self, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
        if self.postgres is None:
            return [tuple(r) for r in tables.read(self.spark, self.replica(table)).select(*columns).collect()]
        from psycopg import sql

        with self.connect() as conn:
            return [tuple(r) for r in conn.execute(sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in columns),
                sql.Identifier(self.postgres["schema"], table))).fetchall()]

    def verify(self) -> None:
        for table in TABLES:
            src = tables.read(self.spark, self.source(table))
            want = sorted((tuple(r) for r in src.collect()), key=repr)
            got = sorted(self.replica_rows(table, src.columns), key=repr)
            missing = set(want) - set(got)
            extra = set(got) - set(want)
            assert not missing and not extra and len(got) == len(want), (
                f"{table}: replica differs from source: {len(missing)} rows missing (e.g. {sorted(missing, key=repr)[:5]}), "
                f"{len(extra)} extra (e.g. {sorted(extra, key=repr)[:5]})")
            self.report.checks[f"{table}: replica equals source"] = f"{len(want)} rows, row for row"
            if self.postgres is None:
                self._verify_transactions(table)
            else:
                self._verify_postgres_progress(table)
        self._verify_checkpoint_rows()
        self.daemon.assert_nothing_in_the_working_directory()

    def _verify_transactions(self, table: str) -> None:
        history = tables.delta_table(self.spark, self.replica(table)).history().collect()
        # every batch commit (a MERGE, or a rewrite of a small replica) carries its transaction's tag
        tags = [h["userMetadata"] for h in history if is_txn_tag(h["userMetadata"])]
        doubled = sorted({t for t in tags if tags.count(t) > 1})
        assert not doubled, f"{table}: transactions committed twice: {doubled[:5]}"
        operations = sorted({f"{h['operation']} by {str(h['engineInfo']).split(' ')[0]}"
                             for h in history if h["userMetadata"] in tags})
        self.report.checks[f"{table}: each transaction id at most once"] = (
            f"{len(tags)} batch commits ({', '.join(operations)}), 0 doubled")

    def _verify_postgres_progress(self, table: str) -> None:
        """Each batch's progress row commits with its data: one row per (epoch, batch) by the primary
        key, and the source versions of an epoch's batches never overlap (none applied twice)."""
        from psycopg import sql

        with self.connect() as conn:
            rows = conn.execute(sql.SQL(
                "SELECT epoch, batch_id, first_version, last_version FROM {} WHERE pipeline_id = 'torture' "
                "AND table_name = %s AND batch_id >= 0 ORDER BY epoch, first_version").format(
                sql.Identifier(self.postgres["schema"], "lakemirror_progress")), (table,)).fetchall()  # type: ignore[index]
        for (e1, b1, _, last), (e2, b2, first, _) in zip(rows, rows[1:]):
            assert e1 != e2 or first > last, (
                f"{table}: batches {b1} and {b2} of epoch {e1} both applied version {first} (ends at {last})")
        self.report.checks[f"{table}: each source version applied once"] = (
            f"{len(rows)} batch transactions in Postgres, version ranges disjoint per epoch")

    def _verify_checkpoint_rows(self) -> None:
        loc = self.catalog.locate(TableName.parse("dst.continuous_sync.checkpoints"))
        rows = [r.asDict() for r in tables.read(self.spark, loc).collect()]
        batches = [r for r in rows if r["error"] is None and r["batch_id"] >= 0]
        for table in TABLES:
            mine = sorted((r for r in batches if r["source_fqn"].endswith(f".{table}")),
                          key=lambda r: (r["epoch"], r["batch_id"]))
            keys = [(r["epoch"], r["batch_id"]) for r in mine]
            assert len(keys) == len(set(keys)), f"{table}: a batch has two checkpoint rows"
            last = -1
            for r in mine:
                assert r["first_version"] is None or r["first_version"] > last or r["epoch"] > 1, (
                    f"{table}: batch {r['batch_id']} re-applies versions from {r['first_version']} (after {last})")
                assert (r["last_committed_version"] or -1) >= last, f"{table}: checkpoint versions went backwards"
                last = max(last, r["last_committed_version"] or -1)
            assert last == self.latest(table), (
                f"{table}: checkpoint rows end at {last}, source at {self.latest(table)}; rows (epoch, batch, first, "
                f"last, error): {[(r['epoch'], r['batch_id'], r['first_version'], r['last_committed_version'], r['error']) for r in rows if r['source_fqn'].endswith(f'.{table}')][-12:]}")
            self.report.checks[f"{table}: checkpoint rows consistent"] = (
                f"{len(mine)} batch rows, unique per batch, versions monotonic up to {last}")


def render_markdown(report: TortureReport, machine: str, command: str, title: str = "crash torture",
                    skipped_by: str = "Delta skipped them by transaction id") -> str:
    reached = sum(k.reached for k in report.kills)
    lines = [
        f"# Reliability: {title}", "",
        f"Command: `{command}`  ", f"Machine: {machine}  ", f"Seed: {report.seed}", "",
        f"**{report.kill_count} SIGKILLs** ({reached} at the intended moment), "
        f"{report.writer_commits} source commits carrying {report.writer_ops} sequence-numbered operations, "
        f"{report.elapsed_seconds:.0f} s in all. {report.batches_replayed} micro-batches were replayed after a "
        f"crash and found already committed ({skipped_by}).", "",
        "| # | crash point | reached | seconds |", "|---|---|---|---|",
    ]
    for i, k in enumerate(report.kills, 1):
        lines.append(f"| {i} | {k.point} | {'yes' if k.reached else 'no (killed on timeout)'} | {k.seconds:.1f} |")
    lines += ["", "Checks after the writer stopped and the last daemon caught up and drained (exit 0):", ""]
    lines += [f"- {name}: {detail}" for name, detail in report.checks.items()]
    return "\n".join(lines) + "\n"
