"""The pure parts of a chunked bootstrap: the chunk planner, the copy/catch-up decision (an injected
clock), the progress figures and the saved plan."""

from __future__ import annotations

import random

import pytest

from lakemirror.checkpoints.bootstrap_state import FileBootstrapStore, InMemoryBootstrapStore, bootstrap_store_for
from lakemirror.checkpoints.state import FileStateStore, InMemoryStateStore
from lakemirror.sinks.batch.bootstrap_plan import (
    CATCH_UP, CHUNK, DONE, BootstrapPlan, BootstrapPolicy, BootstrapProgress, CatchUpRound, next_step,
)
from lakemirror.sources.chunks import SourceFile, bootstrap_app_id, chunk_app_id, chunk_number, plan_chunks


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


POLICY = BootstrapPolicy(chunk_budget_seconds=60.0, safety_factor=2.0)


def decide(policy: BootstrapPolicy = POLICY, **kw):  # type: ignore[no-untyped-def]
    args = dict(now=1000.0, copying_since=1000.0, headroom_seconds=86400.0, expected_chunk_seconds=10.0,
                chunks_left=5, source_ahead=True)
    args.update(kw)
    return next_step(policy, **args)  # type: ignore[arg-type]


def test_copying_goes_on_until_the_budget_is_used_then_the_change_feed_is_applied():
    assert decide(now=1059.0).kind == CHUNK
    step = decide(now=1060.0)
    assert step.kind == CATCH_UP and not step.urgent and "budget of 60s" in step.reason
    assert decide(now=5000.0, source_ahead=False).kind == CHUNK  # nothing to apply
    assert decide(chunks_left=0).kind == DONE


def test_a_closing_change_window_forces_a_catch_up_before_the_budget_and_says_so():
    step = decide(now=1001.0, headroom_seconds=19.0, expected_chunk_seconds=10.0)
    assert step.kind == CATCH_UP and step.urgent and "closes in 19s" in step.reason
    assert decide(now=1001.0, headroom_seconds=21.0, expected_chunk_seconds=10.0).kind == CHUNK


def test_the_default_budget_is_a_fraction_of_the_headroom():
    policy = BootstrapPolicy(headroom_fraction=0.25)
    assert policy.budget_seconds(4000.0) == 1000.0
    assert decide(policy, now=1999.0, headroom_seconds=4000.0).kind == CHUNK
    assert decide(policy, now=2000.0, headroom_seconds=4000.0).kind == CATCH_UP


def test_progress_rate_and_eta_count_only_this_runs_copy():
    p = BootstrapProgress(version=3, chunks_total=10, chunks_done=6, rows_total=1000, rows_copied=200,
                          started_at=100.0, now=120.0, rows_done_estimate=600, chunks_copied=2)
    assert p.rows_per_second == 10.0
    assert p.eta_seconds == 40.0
    assert "chunk 6/10" in p.describe() and "ETA 40s" in p.describe()
    unknown = BootstrapProgress(3, 10, 6, None, 0, 100.0, 120.0, chunks_copied=2)
    assert unknown.eta_seconds == 40.0  # 4 chunks left at 2 per 20 s
    assert BootstrapProgress(3, 10, 0, None, 0, 100.0, 100.0).eta_seconds is None
    assert BootstrapProgress(3, 2, 2, None, 0, 100.0, 150.0).eta_seconds == 0.0


def test_the_plan_round_trips_and_belongs_to_one_epoch(tmp_path):
    plan = BootstrapPlan(2, 7, plan_chunks(files(5, 5, 5), 6))
    plan = plan.with_round(CatchUpRound(0, 7, 9)).with_round(CatchUpRound(0, 7, 9, done=True))
    plan = plan.with_round(CatchUpRound(1, 9, 12))
    assert plan.applied_through == 9  # round 1 is not done
    for store in (FileBootstrapStore(tmp_path / "b"), InMemoryBootstrapStore()):
        assert store.load("t", 2) is None
        store.save("t", plan.to_json())
        saved = store.load("t", 2)
        assert saved is not None and BootstrapPlan.from_json(saved) == plan
        assert store.load("t", 3) is None  # another epoch's plan is never reused
        store.forget("t")
        assert store.load("t", 2) is None
    assert isinstance(bootstrap_store_for(FileStateStore(tmp_path)), FileBootstrapStore)
    assert isinstance(bootstrap_store_for(InMemoryStateStore()), InMemoryBootstrapStore)


def test_status_shows_a_running_bootstraps_chunks_and_eta():
    from lakemirror.daemon.status import render_table

    boot = BootstrapProgress(3, 12, 4, None, 40, 100.0, 120.0, chunks_copied=4)
    text = render_table([{"table": "t", "state": "bootstrapping", "bootstrap": boot.as_dict()},
                         {"table": "u", "state": "running", "bootstrap": None}])
    assert "bootstrapping 4/12 chunks, ETA 40s" in text
    assert "running" in text.splitlines()[2]
