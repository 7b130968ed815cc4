"""A chunked bootstrap keeps its source's change window by capturing the change feed beside the copy
(sinks/batch/change_capture.py), and applies the captured changes at its end with one MERGE that
costs what those changes cost (sinks/batch/bootstrap_apply.py).

No test waits for a retention to pass: a commit's time is its log file's modification time, so the
tests age the source's commits (``age_commits``) where the real thing would take minutes or hours.
The one scenario that runs against the clock is marked slow; the timing logic itself is replayed
with an injected clock in tests/unit/test_bootstrap_capture_policy.py.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.batch.bootstrap_apply import apply_captured
from lakemirror.sinks.batch.bootstrap_plan import BootstrapPlan, CaptureRound, ChunkRead
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.chunks import Chunk
from lakemirror.sources.key_ranges import KeyRange
from lakemirror.tables import TableLocation
from tests.integration.conftest import age_commits
from tests.integration.test_chunked_bootstrap import CHUNKS, make_source, wait_caught_up, with_faults

pytestmark = pytest.mark.integration

HOUR = "'delta.deletedFileRetentionDuration' = 'interval 1 hours'"


def apply_metrics(p: Any, table: str) -> list[dict[str, str]]:
    """The operation metrics of the bootstrap's final MERGE commits on the replica."""
    rows = (tables.delta_table(p.spark, p.replica(table)).history()
            .where("userMetadata LIKE '%/bootstrap/apply%'").select("operationMetrics").collect())
    return [dict(r["operationMetrics"]) for r in rows]


def refused_from(p: Any, table: str, version: int) -> str:
    """What a read of the change feed from ``version`` gets now ('' when it is not refused)."""
    try:
        tables.read(p.spark, p.source(table), readChangeFeed="true", startingVersion=version).count()
    except Exception as exc:  # noqa: BLE001 (the test's premise: the window has closed)
        return str(exc)[:300]
    return ""


def test_a_window_that_closes_inside_the_first_chunk_is_kept_by_the_capture(make_pipeline: Any) -> None:
    """The case that looped: pin, plan, copy a first chunk for longer than the source keeps its
    change feed, and only then catch up, which Delta refused, resync after resync. Here the change
    window closes while the first chunk is still being copied; the capture, running beside it, has
    already copied the changes, and the bootstrap ends in its first epoch."""
    p = make_pipeline(bootstrap={**CHUNKS, "capture_poll_seconds": 0.2})  # change_window_policy: fail
    make_source(p, "short", appends=4, props=HOUR)
    pinned = p.latest_version("short")
    captured = threading.Event()
    premise: list[str] = []

    def inside_the_first_chunk() -> None:  # chunk 0 (keys below 10) is read at the pin, not committed
        p.sql("short", "UPDATE {t} SET v = 'u' WHERE id IN (3, 25)")  # chunk 0's range, and chunk 2's
        p.sql("short", "DELETE FROM {t} WHERE id = 31")
        p.sql("short", "INSERT INTO {t} VALUES (100, 'new')")
        age_commits(p, "short", 50 * 60)  # the changes have used most of the hour
        assert captured.wait(180), "the capture copied the changes while the first chunk was being copied"
        age_commits(p, "short", 2 * 3600)  # and now the window has closed on them
        premise.append(refused_from(p, "short", pinned + 1))

    faults = with_faults(p)
    faults.every["bootstrap_after_capture"] = lambda n: captured.set()
    faults.at("bootstrap_inside_chunk", 1, inside_the_first_chunk)
    p.start()
    wait_caught_up(p, "short")
    assert "TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION" in premise[0], premise
    p.assert_replica_equals_source("short")
    assert p.app.states.load(p.runner("short").slug).epoch == 1, "no resync"
    # Only the key of the chunk copied before its change is MERGEd: chunk 0's file, nothing else.
    [merge] = apply_metrics(p, "short")
    assert (merge["numSourceRows"], merge["numTargetRowsUpdated"], merge["numTargetFilesRemoved"]) == ("1", "1", "1")


def test_a_bootstrap_the_window_outruns_fails_once_saying_the_retention_it_needs(make_pipeline: Any) -> None:
    """When the capture comes too late (here its capturer looks at the source once an hour, for a
    window of an hour), the bootstrap cannot converge: it says so in the table's state, once, with
    the retention it needs, and is not resynced into the same loss (policy resync notwithstanding)."""
    p = make_pipeline(change_window_policy="resync", bootstrap={**CHUNKS, "capture_poll_seconds": 3600})
    make_source(p, "late", appends=3, props=HOUR)

    def inside_the_first_chunk() -> None:
        p.sql("late", "UPDATE {t} SET v = 'u' WHERE id = 3")
        age_commits(p, "late", 2 * 3600)  # past the window ...
        p.sql("late", "INSERT INTO {t} VALUES (100, 'new')")  # ... and no longer the latest: refused

    faults = with_faults(p)
    faults.at("bootstrap_inside_chunk", 1, inside_the_first_chunk)
    p.start()
    p.tick_until(lambda: p.views()["late"].state == "failed", 300, "the table to fail")
    error = p.views()["late"].last_error
    assert "cannot keep up with the source's change window" in error, error
    assert "needs a change window of at least" in error and "ALTER TABLE" in error, error
    assert "delta.deletedFileRetentionDuration" in error and "lakemirror resync" in error, error
    for _ in range(10):
        p.app.supervisor.tick()
    assert p.views()["late"].state == "failed" and p.views()["late"].last_error == error
    assert p.app.states.load(p.runner("late").slug).epoch == 1, "not resynced into the same loss"
    # The advice works: with the retention raised, resume continues the bootstrap from its chunks.
    p.sql("late", "ALTER TABLE {t} SET TBLPROPERTIES ('delta.deletedFileRetentionDuration' = 'interval 1 days')")
    p.app.supervisor.resume("late")
    wait_caught_up(p, "late")
    p.assert_replica_equals_source("late")
    assert p.app.states.load(p.runner("late").slug).epoch == 1


def test_a_catch_up_costs_what_its_changes_cost(make_pipeline: Any) -> None:
    """Changes land after three of six chunks are copied. The change to a copied chunk is MERGEd
    into that chunk's file alone; the changes to chunks not yet copied, and a new key, arrive with
    those chunks' own reads and cost the MERGE nothing. Delta's own metrics say what was rewritten."""
    p = make_pipeline(bootstrap=CHUNKS)
    make_source(p, "cost", appends=6)

    def between(n: int) -> None:
        if n == 3:  # chunks 0-2 committed
            p.sql("cost", "UPDATE {t} SET v = 'u' WHERE id IN (12, 45)")  # copied chunk 1; chunk 4, not yet
            p.sql("cost", "DELETE FROM {t} WHERE id = 51")
            p.sql("cost", "INSERT INTO {t} VALUES (100, 'new')")

    faults = with_faults(p)
    faults.every["bootstrap_between_chunks"] = between
    p.start()
    wait_caught_up(p, "cost")
    p.assert_replica_equals_source("cost")
    [merge] = apply_metrics(p, "cost")
    assert merge["numSourceRows"] == "1", merge  # id 12 alone: 45, 51 and 100 came with their chunks
    assert merge["numTargetFilesRemoved"] == "1" and merge["numTargetRowsCopied"] == "9", merge
    assert (merge["numTargetRowsUpdated"], merge["numTargetRowsInserted"], merge["numTargetRowsDeleted"]) == (
        "1", "0", "0"), merge


def _key_ranges(*bounds: int) -> tuple[Chunk, ...]:
    edges: list[str | None] = [None, *[str(b) for b in bounds], None]
    return tuple(Chunk(n, (), 0, 10, KeyRange("id", "bigint", edges[n], edges[n + 1])) for n in range(len(edges) - 1))


def test_the_final_merge_reads_only_the_chunks_its_changes_fall_in(spark: Any, tmp_path: Path) -> None:
    """Its condition names the key ranges of the changed chunks, so Delta's data skipping leaves the
    other chunks' files unread: checked by moving one of them away (a MERGE that opened it fails)."""
    replica = TableLocation(TableName("dst", "s", "r"), str(tmp_path / "replica"))
    for lo in (0, 10, 20):
        spark.range(lo, lo + 10).selectExpr("id", "'v' AS v").coalesce(1).write.format("delta").mode("append") \
            .save(replica.path)
    changes = TableLocation(replica.name, str(tmp_path / "changes"))
    spark.sql("SELECT 15L AS id, 'changed' AS v, 'update_postimage' AS _change_type, 5L AS _commit_version, "
              "current_timestamp() AS _commit_timestamp").write.format("delta").save(changes.path)
    merge_plan = plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"])
    ranged = BootstrapPlan(1, 3, _key_ranges(10, 20), {n: ChunkRead(3) for n in range(3)},
                           (CaptureRound(0, 3, 5, done=True),))
    last = tables.read(spark, replica).where("id >= 20").selectExpr("_metadata.file_path AS f").first()
    away, moved = Path(last["f"].removeprefix("file:")), tmp_path / "away.parquet"
    away.rename(moved)
    try:
        whole = BootstrapPlan(1, 3, (Chunk(0, (), 0, 30, KeyRange("id", "bigint", None, None)),), {0: ChunkRead(3)},
                              ranged.captures)
        with pytest.raises(Exception):  # the premise: a MERGE over the whole replica opens that file
            apply_captured(spark, replica=replica, changes=changes, merge_plan=merge_plan, plan=whole, through=5,
                           txn=TxnId("test/apply-whole", 0))
        applied = apply_captured(spark, replica=replica, changes=changes, merge_plan=merge_plan, plan=ranged,
                                 through=5, txn=TxnId("test/apply", 0))
    finally:
        moved.rename(away)
    assert applied.chunks == (1,) and applied.outcome is not None and applied.outcome.counts.updated == 1
    assert sorted(tuple(r) for r in tables.read(spark, replica).where("v = 'changed'").collect()) == [(15, "changed")]
    assert tables.read(spark, replica).count() == 30


@pytest.mark.slow
def test_a_source_with_a_60s_window_written_every_2s_bootstraps_in_one_epoch(make_pipeline: Any, caplog: Any) -> None:
    """Against the clock, the numbers that used to loop: a source keeping its change feed for 60 s,
    written every 2 s (or as fast as a loaded machine lets it), whose planning and first chunk
    together take longer than that (the first chunk is held for 65 s). The bootstrap converges in
    its first epoch and the replica equals the source."""
    caplog.set_level(logging.INFO, logger="lakemirror")
    p = make_pipeline(bootstrap=CHUNKS)
    make_source(p, "live", appends=4, props="'delta.deletedFileRetentionDuration' = 'interval 60 seconds'")
    stop = threading.Event()
    writes: list[float] = []

    def writer() -> None:
        n = 0
        while not stop.wait(2.0):
            p.sql("live", f"UPDATE {{t}} SET v = 'w{n}' WHERE id = {n % 40}")
            writes.append(time.time())
            n += 1

    thread = threading.Thread(target=writer, daemon=True)
    faults = with_faults(p)
    faults.at("bootstrap_inside_chunk", 1, lambda: time.sleep(65))  # planning + chunk 0 > the window
    thread.start()
    try:
        p.start()
        p.tick_until(lambda: p.views()["live"].state == "running", 1200, "the bootstrap to end")
        ended = time.time()
    finally:
        stop.set()
        thread.join(120)
    wait_caught_up(p, "live")
    p.assert_replica_equals_source("live")
    assert p.app.states.load(p.runner("live").slug).epoch == 1, "converged without a resync"
    # The premise: the first change after the pin was older than the window when the bootstrap
    # ended, so copying first and catching up afterwards would have been refused.
    assert writes and ended - writes[0] > 60, (writes[:1], ended)
    assert len(re.findall(r"bootstrap capture \d+ copied", caplog.text)) >= 2, "captured while copying"
