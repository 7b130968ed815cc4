"""Chunked, resumable bootstraps beside a capture of the change feed (sinks/batch/chunked_bootstrap.py).

Sources are written in many small appends (one file each) and bootstrapped with a chunk target of
one byte, so every file is a chunk. Crashes are exceptions raised at the runner's fault points;
source changes are made between chunks from the same hook. A source older than its retention is
made so by ageing its commits (``age_commits``), not by waiting. The change window's own cases:
tests/integration/test_bootstrap_capture.py.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Callable

import pytest

from lakemirror import tables
from tests.integration.conftest import age_commits

pytestmark = pytest.mark.integration

CHUNKS = {"chunk_bytes": 1, "parallel_chunks": 1}

#: A source keeping an hour of change feed, with deletion vectors; its commits are aged past it.
RETENTION = "'delta.enableDeletionVectors' = 'true', 'delta.deletedFileRetentionDuration' = 'interval 1 hours'"

#: Every chunked test runs on both chunk reads: the public key ranges (the default) and Delta's
#: internal file reads (``bootstrap.internal_file_reads``).
#: The default key-range reads in the default tier; the opt-in internal file reads in the slow tier.
READS = pytest.mark.parametrize("reads", [
    pytest.param({}, id="key_ranges"),
    pytest.param({"internal_file_reads": True}, id="internal_files", marks=pytest.mark.slow)])


class Crash(RuntimeError):
    pass


class Faults:
    """The runner's fault hook: counts each point and runs the test's action at chosen calls."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.actions: dict[tuple[str, int], Callable[[], None]] = {}
        self.every: dict[str, Callable[[int], None]] = {}
        self._lock = threading.Lock()

    def at(self, point: str, n: int, action: Callable[[], None]) -> None:
        self.actions[(point, n)] = action

    def __call__(self, point: str) -> None:
        with self._lock:
            self.calls[point] = n = self.calls.get(point, 0) + 1
        if point in self.every:
            self.every[point](n)
        action = self.actions.pop((point, n), None)
        if action is not None:
            action()


def crash(point: str) -> Callable[[], None]:
    def raise_() -> None:
        raise Crash(f"injected crash at {point}")
    return raise_


def make_source(p: Any, table: str, appends: int, rows: int = 10, props: str = "") -> None:
    p.create(table, "id BIGINT NOT NULL, v STRING")
    if props:
        p.sql(table, f"ALTER TABLE {{t}} SET TBLPROPERTIES ({props})")
    for i in range(appends):
        (p.spark.range(i * rows, (i + 1) * rows).selectExpr("id", f"'v{i}' AS v").coalesce(1)
         .write.format("delta").mode("append").save(p.source(table).path))


def with_faults(p: Any) -> Faults:
    faults = Faults()
    p.app.runner_context.fault = faults
    return faults


def wait_caught_up(p: Any, *names: str) -> None:
    """Until every table is running and caught up; raises at once when one has failed (an expired
    change window under ``change_window_policy: fail``) instead of waiting out the timeout."""
    def done() -> bool:
        failed = {n: v.last_error for n, v in p.views().items() if n in names and v.state == "failed"}
        assert not failed, f"tables failed: {failed}"
        return bool(p.caught_up(*names))
    p.tick_until(done, 900, f"{names} to catch up")


def captures(caplog: Any) -> list[str]:
    """The change-feed capture rounds the bootstrap logged."""
    return re.findall(r"bootstrap capture (\d+) copied source versions", caplog.text)


def chunk_commits(p: Any, table: str) -> list[str]:
    rows = (tables.delta_table(p.spark, p.replica(table)).history()
            .where("userMetadata LIKE '%/bootstrap/chunk/%'").select("userMetadata").collect())
    return [r["userMetadata"] for r in rows]


@READS
def test_a_crashed_bootstrap_resumes_at_the_first_uncommitted_chunk(make_pipeline, reads, caplog):
    caplog.set_level(logging.INFO, logger="lakemirror")
    p = make_pipeline(bootstrap={**CHUNKS, **reads})
    make_source(p, "big", appends=12)
    faults = with_faults(p)
    faults.at("bootstrap_between_chunks", 4, crash("between chunks"))  # chunk 3 committed, crash
    faults.at("bootstrap_inside_chunk", 8, crash("inside a chunk"))    # chunk 7 read, never committed
    p.start()
    wait_caught_up(p, "big")
    p.assert_replica_equals_source("big")
    commits = chunk_commits(p, "big")
    assert len(commits) == 12 and len(set(commits)) == 12, "every chunk committed exactly once"
    # 12 chunks, one of them (the one crashed inside) begun twice: nothing else redone.
    assert faults.calls["bootstrap_inside_chunk"] == 13, faults.calls
    views = p.views()["big"]
    assert views.bootstrap is None and views.state == "running"
    metrics = {s.name: s.value for m in p.app.metrics.registry.collect() for s in m.samples
               if s.labels.get("table") == "big" and s.name.startswith("lakemirror_bootstrap")}
    assert metrics["lakemirror_bootstrap_chunks_done"] == metrics["lakemirror_bootstrap_chunks_total"] == 12
    assert metrics["lakemirror_bootstrap_rows_copied_total"] >= 120
    # A resumed run's figures start from what earlier runs committed, rows as well as chunks.
    assert "4 of 12 chunks already committed" in caplog.text
    assert re.search(r"bootstrap chunk 4 committed \(10 rows read at source version \d+, [\d.]+s\): chunk 5/12, "
                     r"50 rows copied of 120", caplog.text), caplog.text
    # the stream carries on from the bootstrap's version
    p.sql("big", "UPDATE {t} SET v = 'after' WHERE id % 4 = 0")
    p.wait_caught_up("big")
    p.assert_replica_equals_source("big")


def test_a_small_table_is_one_commit_as_before(make_pipeline, caplog):
    caplog.set_level(logging.INFO, logger="lakemirror")
    p = make_pipeline()
    make_source(p, "small", appends=3)
    p.start()
    p.wait_caught_up("small")
    p.assert_replica_equals_source("small")
    ops = [r["operation"] for r in tables.delta_table(p.spark, p.replica("small")).history().collect()]
    assert sorted(ops) == ["SET TBLPROPERTIES", "WRITE"], ops  # the copy, then the replica's properties
    assert not chunk_commits(p, "small") or len(chunk_commits(p, "small")) == 1
    # The true figures of a one-chunk copy, whose files' statistics were never asked for.
    assert re.search(r"bootstrap chunk 0 committed \(30 rows read at source version 3, [\d.]+s\): chunk 1/1, "
                     r"30 rows copied\b", caplog.text), caplog.text


def vacuum_all(p: Any, table: str) -> None:
    p.spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        p.sql(table, "VACUUM {t} RETAIN 0 HOURS")
    finally:
        p.spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")


#: In the slow tier: the default tier keeps a window closing inside a bootstrap
#: through the capture (tests/integration/test_bootstrap_capture.py).
@pytest.mark.slow
@READS
def test_changes_between_chunks_survive_a_vacuum_only_through_the_capture(make_pipeline, reads, caplog):
    """Updates, deletes and re-inserts land on the source between chunks, and the source is
    VACUUMed (retaining 0 hours) while the bootstrap runs: the change data of the versions after the
    snapshot is gone before the bootstrap ends, so only the captures between chunks (a copying
    budget asks for one before each chunk) can have kept them. The source keeps deletion vectors, so
    the snapshot's files stay readable after a VACUUM for the file-group chunks read at V (see the
    limits in docs/how-it-works.md)."""
    caplog.set_level(logging.INFO, logger="lakemirror")
    p = make_pipeline(bootstrap={**CHUNKS, "chunk_budget_seconds": 0.001, **reads})
    make_source(p, "hot", appends=8, props="'delta.enableDeletionVectors' = 'true'")
    v = p.latest_version("hot")
    steps = {
        2: ["UPDATE {t} SET v = 'u1' WHERE id % 7 = 0", "DELETE FROM {t} WHERE id % 11 = 0"],
        3: ["INSERT INTO {t} SELECT id, 're' FROM range(0, 80) WHERE id % 11 = 0 AND id % 2 = 0",
            "UPDATE {t} SET v = 'u2' WHERE id % 13 = 0"],
        4: ["DELETE FROM {t} WHERE id % 17 = 0", "INSERT INTO {t} VALUES (1000, 'new'), (1001, 'new')"],
    }
    failed_read: list[str] = []

    def between(n: int) -> None:
        for statement in steps.get(n, []):
            p.sql("hot", statement)
        if n == 5:  # every change above is older than VACUUM's retention (0 hours) now
            vacuum_all(p, "hot")
            try:
                tables.read(p.spark, p.source("hot"), readChangeFeed="true", startingVersion=v + 1).count()
            except Exception as exc:  # noqa: BLE001 (what a reader from V+1 would see)
                failed_read.append(str(exc)[:200])

    faults = with_faults(p)
    faults.every["bootstrap_between_chunks"] = between
    p.start()
    wait_caught_up(p, "hot")
    p.assert_replica_equals_source("hot")
    assert failed_read, "the change feed from the snapshot's next version must be gone by then"
    assert len(set(chunk_commits(p, "hot"))) == 8
    assert len(captures(caplog)) >= 3


def test_a_bootstrap_outlives_the_sources_retention_by_reading_each_chunk_at_the_latest_version(make_pipeline):
    """Delta refuses to time-travel to a version older than the source's
    ``delta.deletedFileRetentionDuration`` unless it is the latest; a bootstrap longer than that
    retention reads each key-range chunk at the source's latest version when it copies it. The
    changes themselves are captured while they are within the retention."""
    p = make_pipeline(bootstrap={**CHUNKS, "chunk_budget_seconds": 0.001})
    make_source(p, "brief", appends=8, props=RETENTION)
    v = p.latest_version("brief")
    refused: list[str] = []

    def between(n: int) -> None:
        if n == 2:
            age_commits(p, "brief", 2 * 3600)  # V is now older than the source's retention
            p.sql("brief", "UPDATE {t} SET v = 'u' WHERE id % 7 = 0")
            p.sql("brief", "DELETE FROM {t} WHERE id % 11 = 0")
        if n == 3:
            p.sql("brief", "INSERT INTO {t} VALUES (1000, 'new')")
            try:
                tables.read(p.spark, p.source("brief"), versionAsOf=v).count()
            except Exception as exc:  # noqa: BLE001 (what a read of the snapshot at V now gets)
                refused.append(str(exc)[:200])

    faults = with_faults(p)
    faults.every["bootstrap_between_chunks"] = between
    p.start()
    wait_caught_up(p, "brief")
    assert refused and "TIME_TRAVEL" in refused[0], f"the test's premise: V can no longer be read ({refused})"
    p.assert_replica_equals_source("brief")
    assert len(set(chunk_commits(p, "brief"))) == 8


#: One chunk (the default for a small table) in the slow tier: the chunks below take the same read at
#: the latest version, one by one, and the default tier's other pipelines bootstrap in one chunk.
@pytest.mark.parametrize("bootstrap", [pytest.param({}, id="default", marks=pytest.mark.slow),
                                       pytest.param(CHUNKS, id="chunked")])
def test_a_source_idle_past_its_retention_and_written_just_after_the_pin_is_read_at_its_latest(make_pipeline,
                                                                                             bootstrap):
    """Delta refuses ``VERSION AS OF V`` once V is no longer the latest version and V's commit is
    older than the retention. A table idle for longer than its retention (a week, by default) and
    written to between the pin and the first read is read at its latest version instead: nothing is
    refused, nothing pinned again, and the replica holds the write."""
    p = make_pipeline(bootstrap=bootstrap)
    make_source(p, "idle", appends=4, props=RETENTION)
    age_commits(p, "idle", 2 * 3600)  # the source's latest commit is now older than its retention
    v = p.latest_version("idle")

    faults = with_faults(p)
    faults.at("bootstrap_before_snapshot", 1, lambda: p.sql("idle", "UPDATE {t} SET v = 'u' WHERE id % 3 = 0"))
    p.start()
    wait_caught_up(p, "idle")
    p.assert_replica_equals_source("idle")
    assert faults.calls["bootstrap_before_snapshot"] == 1, "pinned once"
    assert p.latest_version("idle") == v + 1
    assert p.app.states.load(p.runner("idle").slug).epoch == 1


def test_chunks_after_a_write_to_a_source_idle_past_its_retention_are_read_at_its_latest(make_pipeline, caplog):
    """The first chunk reads V while V is the source's latest version; a write lands; the next
    chunks read the new latest version (V, older than the retention, would be refused), and the
    write reaches the first chunk's rows from the change log."""
    p = make_pipeline(bootstrap={**CHUNKS, "chunk_budget_seconds": 3600})
    make_source(p, "idle", appends=5, props=RETENTION)
    age_commits(p, "idle", 2 * 3600)

    def write_after_the_first_chunk() -> None:
        p.sql("idle", "UPDATE {t} SET v = 'u' WHERE id % 3 = 0")
        p.sql("idle", "DELETE FROM {t} WHERE id % 7 = 0")

    faults = with_faults(p)
    faults.at("bootstrap_between_chunks", 1, write_after_the_first_chunk)
    p.start()
    wait_caught_up(p, "idle")
    p.assert_replica_equals_source("idle")
    assert len(set(chunk_commits(p, "idle"))) == 5
    assert "TIME_TRAVEL" not in caplog.text, "no read was refused"


@READS
def test_chunks_of_two_tables_run_in_parallel_up_to_the_limit(make_pipeline, reads):
    p = make_pipeline(bootstrap={"chunk_bytes": 1, "parallel_chunks": 2, **reads})
    make_source(p, "a", appends=6)
    make_source(p, "b", appends=6)
    inside = {"now": 0, "max": 0}
    lock = threading.Lock()
    release = threading.Event()

    def enter(n: int) -> None:
        with lock:
            inside["now"] += 1
            inside["max"] = max(inside["max"], inside["now"])
            if inside["now"] >= 2:
                release.set()
        if not release.wait(60):  # the first chunk inside waits for a second one, once: then the
            release.set()         # event stays set (and a lone chunk waits no more)
        with lock:
            inside["now"] -= 1

    faults = with_faults(p)
    faults.every["bootstrap_inside_chunk"] = enter
    p.start()
    wait_caught_up(p, "a", "b")
    p.assert_replica_equals_source("a")
    p.assert_replica_equals_source("b")
    assert inside["max"] == 2, inside


def test_a_key_range_chunk_reads_only_its_own_files(make_pipeline, tmp_path):
    """The public chunk reads rest on Delta's data skipping: a chunk's scan must not open a file
    outside its key range. Checked with the public API alone: a file of another chunk is moved away
    and the chunk still reads in full (a scan that listed it would fail on the missing file)."""
    from pathlib import Path

    from lakemirror.sources.snapshot_files import KeyRangeReads

    p = make_pipeline()
    make_source(p, "ranged", appends=6)
    version = p.latest_version("ranged")
    reads = KeyRangeReads(p.spark, p.source("ranged"), version, ["id"])
    chunks = reads.plan(1)
    assert [c.rows for c in chunks] == [10] * 6 and all(c.key_range is not None for c in chunks)
    assert [(c.key_range.lower, c.key_range.upper) for c in chunks] == [
        (None, "10"), ("10", "20"), ("20", "30"), ("30", "40"), ("40", "50"), ("50", None)]
    by_file = {r["f"]: r["lo"] for r in reads.snapshot().selectExpr("_metadata.file_path AS f", "id")
               .groupBy("f").agg({"id": "min"}).withColumnRenamed("min(id)", "lo").collect()}
    other = next(f for f, lo in by_file.items() if lo == 0)  # chunk 0's file
    moved = Path(other.removeprefix("file:"))
    moved.rename(tmp_path / "away.parquet")
    try:
        assert sorted(r["id"] for r in reads.read(chunks[3]).collect()) == list(range(30, 40))
        with pytest.raises(Exception):
            reads.read(chunks[0]).count()  # the test's premise: a scan that needs the file fails
    finally:
        (tmp_path / "away.parquet").rename(moved)
