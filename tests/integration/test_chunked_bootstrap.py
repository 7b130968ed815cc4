"""Chunked, resumable bootstraps interleaved with the change feed (sinks/batch/chunked_bootstrap.py).

Sources are written in many small appends (one file each) and bootstrapped with a chunk target of
one byte, so every file is a chunk. Crashes are exceptions raised at the runner's fault points;
source changes are made between chunks from the same hook.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from lakemirror import tables

pytestmark = pytest.mark.integration

CHUNKS = {"chunk_bytes": 1, "parallel_chunks": 1}

#: Every chunked test runs on both chunk reads: the public key ranges (the default) and Delta's
#: internal file reads (``bootstrap.internal_file_reads``).
READS = pytest.mark.parametrize("reads", [{}, {"internal_file_reads": True}], ids=["key_ranges", "internal_files"])


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


def catch_up_commits(p: Any, table: str) -> int:
    """How many catch-up rounds the table's bootstrap committed to its replica."""
    return (tables.delta_table(p.spark, p.replica(table)).history()
            .where("userMetadata LIKE '%/bootstrap/catch-up%'").count())


def chunk_commits(p: Any, table: str) -> list[str]:
    rows = (tables.delta_table(p.spark, p.replica(table)).history()
            .where("userMetadata LIKE '%/bootstrap/chunk/%'").select("userMetadata").collect())
    return [r["userMetadata"] for r in rows]


@READS
def test_a_crashed_bootstrap_resumes_at_the_first_uncommitted_chunk(make_pipeline, reads):
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
    # the stream carries on from the bootstrap's version
    p.sql("big", "UPDATE {t} SET v = 'after' WHERE id % 4 = 0")
    p.wait_caught_up("big")
    p.assert_replica_equals_source("big")


def test_a_small_table_is_one_commit_as_before(make_pipeline):
    p = make_pipeline()
    make_source(p, "small", appends=3)
    p.start()
    p.wait_caught_up("small")
    p.assert_replica_equals_source("small")
    ops = [r["operation"] for r in tables.delta_table(p.spark, p.replica("small")).history().collect()]
    assert sorted(ops) == ["SET TBLPROPERTIES", "WRITE"], ops  # the copy, then the replica's properties
    assert not chunk_commits(p, "small") or len(chunk_commits(p, "small")) == 1


def vacuum_all(p: Any, table: str) -> None:
    p.spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        p.sql(table, "VACUUM {t} RETAIN 0 HOURS")
    finally:
        p.spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")


@READS
def test_changes_between_chunks_survive_a_vacuum_only_through_the_interleaving(make_pipeline, reads):
    """Updates, deletes and re-inserts land on the source between chunks, and the source is
    VACUUMed (retaining 0 hours) while the bootstrap runs: the change data of the versions after the
    snapshot is gone before the bootstrap ends, so only the catch-ups between chunks can have applied
    them. The source keeps deletion vectors, so its snapshot's files stay readable after a VACUUM
    (see the limits in docs/how-it-works.md)."""
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
    assert catch_up_commits(p, "hot") >= 3


def test_a_bootstrap_outlives_the_sources_retention_by_reading_later_chunks_after_the_catch_ups(make_pipeline):
    """Delta refuses to time-travel to a version older than the source's
    ``delta.deletedFileRetentionDuration``; a bootstrap longer than that retention reads its later
    key-range chunks at the version the catch-up rounds reached instead of at the snapshot's V.
    The changes themselves are read by the catch-ups while they are within the retention."""
    import time

    p = make_pipeline(bootstrap={**CHUNKS, "chunk_budget_seconds": 0.001})
    make_source(p, "brief", appends=8, props="'delta.enableDeletionVectors' = 'true', "
                                            "'delta.deletedFileRetentionDuration' = 'interval 5 seconds'")
    v = p.latest_version("brief")
    refused: list[str] = []

    def between(n: int) -> None:
        if n == 2:
            time.sleep(6)  # V is now older than the source's retention
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


BRIEF_RETENTION = "'delta.enableDeletionVectors' = 'true', 'delta.deletedFileRetentionDuration' = 'interval 5 seconds'"


@pytest.mark.parametrize("bootstrap", [{}, CHUNKS], ids=["default", "chunked"])
def test_a_source_idle_past_its_retention_and_written_just_after_the_pin_is_pinned_again(make_pipeline, bootstrap):
    """Delta refuses ``VERSION AS OF V`` once V is no longer the latest version and V's commit is
    older than the retention. A table idle for longer than its retention (a week, by default) and
    written to between the pin and the first read would fail its bootstrap: it is pinned anew."""
    import time

    p = make_pipeline(bootstrap=bootstrap)
    make_source(p, "idle", appends=4, props=BRIEF_RETENTION)
    time.sleep(6)  # the source's latest commit is now older than its retention
    v = p.latest_version("idle")

    faults = with_faults(p)
    faults.at("bootstrap_before_snapshot", 1, lambda: p.sql("idle", "UPDATE {t} SET v = 'u' WHERE id % 3 = 0"))
    p.start()
    wait_caught_up(p, "idle")
    p.assert_replica_equals_source("idle")
    assert faults.calls["bootstrap_before_snapshot"] == 2, "refused at V, then pinned at the write's version"
    assert p.latest_version("idle") == v + 1


def test_a_chunk_refused_after_the_replica_exists_is_read_after_a_catch_up(make_pipeline, caplog):
    """The first chunk reads V while V is the source's latest version; a write lands; the next
    chunk's read at V is refused (V is older than the retention): a catch-up round runs, and the
    chunks are read at the version it reached, with no copying budget asking for it."""
    import time

    p = make_pipeline(bootstrap={**CHUNKS, "chunk_budget_seconds": 3600})
    make_source(p, "idle", appends=5, props=BRIEF_RETENTION)
    time.sleep(6)

    def write_after_the_first_chunk() -> None:
        p.sql("idle", "UPDATE {t} SET v = 'u' WHERE id % 3 = 0")
        p.sql("idle", "DELETE FROM {t} WHERE id % 7 = 0")

    faults = with_faults(p)
    faults.at("bootstrap_between_chunks", 1, write_after_the_first_chunk)
    p.start()
    wait_caught_up(p, "idle")
    p.assert_replica_equals_source("idle")
    assert len(set(chunk_commits(p, "idle"))) == 5
    assert catch_up_commits(p, "idle") == 1
    assert "Delta refused to read source version" in caplog.text, "the catch-up answered the refusal"


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
