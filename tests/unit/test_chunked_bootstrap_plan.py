"""The pure parts of a chunked bootstrap: the chunk planner, the saved plan, which captured changes
each chunk still needs, how a MERGE is narrowed to the chunks its changes fall in, and the progress
figures (the capture's timing: tests/unit/test_bootstrap_capture_policy.py)."""

from __future__ import annotations

import random

import pytest

from lakemirror.checkpoints.bootstrap_state import FileBootstrapStore, InMemoryBootstrapStore, bootstrap_store_for
from lakemirror.checkpoints.state import FileStateStore, InMemoryStateStore
from lakemirror.sinks.batch.bootstrap_plan import (
    BootstrapPlan, BootstrapProgress, CaptureRound, ChunkRead, OutdatedPlan, change_filter_sql, chunk_of_sql,
    target_predicate,
)
from lakemirror.sources.chunks import Chunk, SourceFile, bootstrap_app_id, chunk_app_id, chunk_number, plan_chunks
from lakemirror.sources.key_ranges import KeyRange


def files(*sizes: int) -> list[SourceFile]:
    return [SourceFile(f"part-{i:03d}.parquet", size, 10) for i, size in enumerate(sizes)]


def test_chunks_group_files_in_path_order_up_to_the_target():
    chunks = plan_chunks(files(40, 40, 40, 100, 10, 10), target_bytes=100)
    assert [c.paths for c in chunks] == [
        ("part-000.parquet", "part-001.parquet"), ("part-002.parquet",), ("part-003.parquet",),
        ("part-004.parquet", "part-005.parquet")]
    assert [c.number for c in chunks] == [0, 1, 2, 3]
    assert [c.size_bytes for c in chunks] == [80, 40, 100, 20]
    assert all(c.rows == 10 * len(c.paths) for c in chunks)


def test_the_plan_is_a_function_of_the_file_list_not_its_order():
    listed = files(*[random.Random(1).randint(1, 90) for _ in range(50)])
    shuffled = list(listed)
    random.Random(2).shuffle(shuffled)
    assert plan_chunks(listed, 120) == plan_chunks(shuffled, 120)
    every = [p for c in plan_chunks(listed, 120) for p in c.paths]
    assert sorted(every) == sorted(f.path for f in listed) and len(every) == len(set(every))


def test_a_file_larger_than_the_target_is_a_chunk_of_its_own_and_an_empty_table_one_empty_chunk():
    chunks = plan_chunks(files(500, 5), target_bytes=100)
    assert [c.paths for c in chunks] == [("part-000.parquet",), ("part-001.parquet",)]
    empty = plan_chunks([], 100)
    assert len(empty) == 1 and empty[0].paths == () and empty[0].rows == 0
    assert plan_chunks([SourceFile("a", 1)], 100)[0].rows is None  # no statistics: rows unknown
    with pytest.raises(ValueError):
        plan_chunks(files(1), 0)
    with pytest.raises(ValueError):
        plan_chunks([SourceFile("a", 1), SourceFile("a", 1)], 100)


def test_chunk_app_ids_are_distinct_per_chunk_and_epoch():
    app = bootstrap_app_id("lakemirror/p/t/e2")
    assert chunk_number(app, chunk_app_id(app, 17)) == 17
    assert chunk_number(app, chunk_app_id(bootstrap_app_id("lakemirror/p/t/e1"), 17)) is None
    assert chunk_number(app, f"{app}/catch-up") is None
    assert len({chunk_app_id(app, n) for n in range(100)}) == 100


def key_ranges(*bounds: int) -> tuple[Chunk, ...]:
    """Key-range chunks of ``id`` split at ``bounds`` (open at both ends), 10 rows each."""
    edges: list[str | None] = [None, *[str(b) for b in bounds], None]
    return tuple(Chunk(n, (), 100, 10, KeyRange("id", "bigint", edges[n], edges[n + 1])) for n in range(len(edges) - 1))


def test_progress_carries_every_committed_chunk_over_and_rates_only_this_run():
    p = BootstrapProgress(version=3, chunks_total=10, chunks_done=6, rows_total=1000, rows_copied=600,
                          started_at=100.0, now=120.0, rows_copied_this_run=200, chunks_copied=2)
    assert p.rows_per_second == 10.0  # this run's 200 rows in 20 s; the 400 before are not this run's
    assert p.eta_seconds == 40.0      # 400 rows left at 10 rows/s
    assert "chunk 6/10, 600 rows copied of 1000" in p.describe() and "ETA 40s" in p.describe()
    assert p.as_dict()["rows_copied"] == 600
    unknown = BootstrapProgress(3, 10, 6, None, 60, 100.0, 120.0, chunks_copied=2)
    assert unknown.eta_seconds == 40.0  # 4 chunks left at 2 per 20 s
    assert BootstrapProgress(3, 10, 0, None, 0, 100.0, 100.0).eta_seconds is None
    assert BootstrapProgress(3, 2, 2, None, 0, 100.0, 150.0).eta_seconds == 0.0


def test_rows_copied_come_from_the_commits_and_else_from_the_plan():
    plan = BootstrapPlan(1, 7, key_ranges(10, 20))
    plan = plan.with_read(0, ChunkRead(7, 12)).with_read(1, ChunkRead(8))  # chunk 1: commit not confirmed
    assert plan.rows_copied({0, 1}) == 12 + 10
    assert plan.rows_copied(set()) == 0
    whole = BootstrapPlan(1, 7, (Chunk(0, (), 0, None),))  # one chunk whose files had no row counts
    assert whole.rows_copied({0}) == 0
    assert whole.with_read(0, ChunkRead(9, 31)).rows_copied({0}) == 31


def test_the_plan_round_trips_and_belongs_to_one_epoch(tmp_path):
    plan = BootstrapPlan(2, 7).with_chunks(plan_chunks(files(5, 5, 5), 6))
    plan = plan.with_capture(CaptureRound(0, 7, 9)).with_capture(CaptureRound(0, 7, 9, done=True))
    plan = plan.with_capture(CaptureRound(1, 9, 12)).with_read(0, ChunkRead(8, 10)).with_read(1, ChunkRead(11))
    plan = plan.with_final(12)
    assert plan.captured_through == 9  # round 1 is not done
    assert plan.floor(0) == 8 and plan.floor(2) == 7  # a chunk with no read saved: V
    for store in (FileBootstrapStore(tmp_path / "b"), InMemoryBootstrapStore()):
        assert store.load("t", 2) is None
        store.save("t", plan.to_json())
        saved = store.load("t", 2)
        assert saved is not None and BootstrapPlan.from_json(saved) == plan
        assert store.load("t", 3) is None  # another epoch's plan is never reused
        store.forget("t")
        assert store.load("t", 2) is None
    unplanned = BootstrapPlan(2, 7)
    assert BootstrapPlan.from_json(unplanned.to_json()) == unplanned and unplanned.chunks is None
    assert isinstance(bootstrap_store_for(FileStateStore(tmp_path)), FileBootstrapStore)
    assert isinstance(bootstrap_store_for(InMemoryStateStore()), InMemoryBootstrapStore)


def test_a_plan_whose_catch_ups_wrote_to_the_replica_is_not_resumed():
    """Plans of the format before change capture: without catch-up rounds their chunks were all
    read at V (resumable as such); with rounds, the replica holds merged rows and keys dropped from
    later chunks, which this format cannot continue."""
    old = {"epoch": 2, "version": 7, "chunks": [c.to_json() for c in key_ranges(10)], "rounds": []}
    resumed = BootstrapPlan.from_json(old)
    assert resumed.reads == {} and resumed.floor(1) == 7 and resumed.captures == ()
    with pytest.raises(OutdatedPlan, match="catch-up rounds"):
        BootstrapPlan.from_json({**old, "rounds": [{"number": 0, "after": 7, "through": 9, "done": True}]})


def test_each_key_needs_the_changes_after_its_own_chunk_was_read():
    one = BootstrapPlan(1, 7, (Chunk(0, (), 0, None),)).with_read(0, ChunkRead(9))
    assert change_filter_sql(one, 12) == "`_commit_version` <= 12 AND `_commit_version` > 9"
    ranged = BootstrapPlan(1, 7, key_ranges(10, 20, 30))
    for n, version in enumerate([8, 8, 11, 11]):
        ranged = ranged.with_read(n, ChunkRead(version))
    sql = change_filter_sql(ranged, 15)
    # chunks 0-1 (keys below 20, NULL keys too) were read at 8, chunks 2-3 at 11: one WHEN per run
    assert sql == ("`_commit_version` <= 15 AND `_commit_version` > CASE WHEN (`id` IS NULL OR `id` < "
                   "CAST('20' AS BIGINT)) THEN 8 ELSE 11 END")
    files_at_v = BootstrapPlan(1, 7, plan_chunks(files(5, 5, 5), 6))
    assert change_filter_sql(files_at_v, 9) == "`_commit_version` <= 9 AND `_commit_version` > 7"
    with pytest.raises(ValueError, match="one version"):
        change_filter_sql(files_at_v.with_read(1, ChunkRead(8)), 9)


def test_a_merge_is_narrowed_to_the_key_ranges_of_the_chunks_its_changes_fall_in():
    plan = BootstrapPlan(1, 7, key_ranges(10, 20, 30, 40, 50))
    assert chunk_of_sql(plan) == ("CASE WHEN (`id` IS NULL OR `id` < CAST('10' AS BIGINT)) THEN 0 WHEN `id` >= "
                                  "CAST('10' AS BIGINT) AND `id` < CAST('20' AS BIGINT) THEN 1 WHEN `id` >= "
                                  "CAST('20' AS BIGINT) AND `id` < CAST('30' AS BIGINT) THEN 2 WHEN `id` >= "
                                  "CAST('30' AS BIGINT) AND `id` < CAST('40' AS BIGINT) THEN 3 WHEN `id` >= "
                                  "CAST('40' AS BIGINT) AND `id` < CAST('50' AS BIGINT) THEN 4 ELSE 5 END")
    assert target_predicate(plan, {1, 2, 5}, "t") == (
        "(t.`id` >= CAST('10' AS BIGINT) AND t.`id` < CAST('30' AS BIGINT)) OR (t.`id` >= CAST('50' AS BIGINT))")
    assert target_predicate(plan, {0}, "t") == "((t.`id` IS NULL OR t.`id` < CAST('10' AS BIGINT)))"
    assert target_predicate(plan, set(range(6)), "t") is None  # every chunk: nothing to narrow
    assert target_predicate(plan, set(), "t") is None
    files_plan = BootstrapPlan(1, 7, plan_chunks(files(5, 5, 5), 6))
    assert chunk_of_sql(files_plan) is None and target_predicate(files_plan, {1}, "t") is None
    whole = BootstrapPlan(1, 7, (Chunk(0, (), 0, None, KeyRange("id", "bigint", None, None)),))
    assert chunk_of_sql(whole) is None


def test_status_shows_a_running_bootstraps_chunks_and_eta():
    from lakemirror.daemon.status import render_table

    boot = BootstrapProgress(3, 12, 4, None, 40, 100.0, 120.0, chunks_copied=4)
    text = render_table([{"table": "t", "state": "bootstrapping", "bootstrap": boot.as_dict()},
                         {"table": "u", "state": "running", "bootstrap": None}])
    assert "bootstrapping 4/12 chunks, ETA 40s" in text
    assert "running" in text.splitlines()[2]
