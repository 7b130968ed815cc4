"""bench.chunked and bench.retention: the chunked bootstrap workload's source, its retention run's
writer plan and figures, and how its section reads (no Spark)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from bench.chunked import DELETION_VECTORS, RETENTION_SYSTEM, _source, render, retention_interval
from bench.retention import HotKeys, StepSizes, WriterLog, catch_ups, plan_step, summarize


def test_the_source_holds_every_id_once_in_one_file_per_append(tmp_path: Path) -> None:
    largest = _source(tmp_path / "t", 1003, 4, DELETION_VECTORS)
    dt = DeltaTable(str(tmp_path / "t"))
    table = pa.table(QueryBuilder().register("t", dt).execute("SELECT id, v, payload FROM t ORDER BY id").read_all())
    assert table.column("id").to_pylist() == list(range(1003))
    assert table.column("v").to_pylist() == list(range(1003))
    assert table.column("payload").to_pylist()[:3] == ["p0", "p1", "p2"] and table.column("payload")[-1].as_py() == "p1002"
    sizes = dt.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    assert len(sizes) == 4 and largest == max(sizes)
    assert dt.metadata().configuration == DELETION_VECTORS
    assert "deletionVectors" in (dt.protocol().writer_features or [])


def test_hot_keys_are_the_first_and_last_ids_and_new_ids_follow_the_source() -> None:
    keys = HotKeys.of_source(100, 3)
    assert keys.live == (0, 1, 2, 97, 98, 99) and keys.deleted == () and keys.next_id == 100
    assert HotKeys.of_source(5, 10).live == (0, 1, 2, 3, 4)  # ranges that meet are one range
    with pytest.raises(ValueError, match="positive"):
        HotKeys.of_source(0, 3)


def test_each_step_changes_a_key_once_and_reinserts_only_keys_deleted_before() -> None:
    rng = random.Random(7)
    keys = HotKeys.of_source(1000, 50)
    sizes = StepSizes(updates=6, deletes=4, reinserts=3, inserts=2)
    deleted_before: set[int] = set()
    reinserted = 0
    for _ in range(40):
        step = plan_step(rng, keys, sizes)
        ids = [k for k, _ in step.changes]
        assert len(ids) == len(set(ids)), "a key changes at most once per commit"
        ops = {k: op for k, op in step.changes}
        assert all(k in keys.live for k, op in ops.items() if op in "ud")
        inserted = [k for k, op in ops.items() if op == "i"]
        again = [k for k in inserted if k < keys.next_id]
        assert set(again) <= deleted_before and len(again) == step.counts["reinserts"]
        assert [k for k in inserted if k >= keys.next_id] == list(range(keys.next_id, keys.next_id + 2))
        assert step.counts == {"updates": 6, "deletes": 4, "reinserts": len(again), "inserts": 2}
        after = step.after
        assert not set(after.live) & set(after.deleted)
        assert set(after.deleted) == (set(keys.deleted) - set(again)) | {k for k, op in ops.items() if op == "d"}
        deleted_before = set(after.deleted)
        reinserted += len(again)
        keys = after
    assert reinserted > 0


def test_catch_up_rounds_are_read_from_the_daemon_log() -> None:
    text = ("2026-11-25 18:00:00,000 INFO table src.bench.hot: bootstrap capture 0 copied source versions 20..23 "
            "of the change feed (120 change rows, 1.2s)\nnoise\n2026-11-25 18:00:09,000 INFO table src.bench.hot: "
            "bootstrap capture 1 copied source versions 24..24 of the change feed (? change rows, 0.4s)\n")
    assert catch_ups(text) == [{"round": 0, "first_version": 20, "last_version": 23, "change_rows": 120},
                               {"round": 1, "first_version": 24, "last_version": 24, "change_rows": 0}]


def test_the_writer_log_skips_a_line_cut_short() -> None:
    lines = [json.dumps({"commit": 20, "at": 10.0, "updates": 1}), json.dumps({"vacuum": 11.0, "seconds": 0.5}),
             '{"commit": 21, "at"']
    log = WriterLog.parse(lines)
    assert log.commits == [{"version": 20, "at": 10.0, "updates": 1}] and log.vacuums == [11.0]


def test_the_summary_counts_what_happened_while_the_bootstrap_ran() -> None:
    def commit(version: int, at: float) -> dict[str, Any]:
        return {"version": version, "at": at, "updates": 2, "deletes": 1, "reinserts": 1, "inserts": 1}
    log = WriterLog(commits=[commit(v, 100.0 + 2 * (v - 20)) for v in range(20, 60)],
                    vacuums=[95.0, 110.0, 130.0, 145.0, 160.0, 190.0])
    # pinned at 19, bootstrap from 90 to 150; the writer's first commit (version 20) at 100; retention 36 s
    s = summarize(log, pinned=19, started=90.0, ended=150.0, retain_hours=0.01)
    assert s["retain_seconds"] == 36.0 and s["bootstrap_seconds"] == 60.0 and s["bootstrap_over_retention"] == 1.67
    assert s["versions_during_bootstrap"] == 26 and s["last_version_during_bootstrap"] == 45  # at 100..150
    assert s["vacuums_during_bootstrap"] == 4                                                 # 95, 110, 130, 145
    assert s["vacuum_removed_first_change_by"] == 55.0  # the VACUUM at 145 is the first past 100 + 36
    assert s["changes_during_bootstrap"] == {"updates": 52, "deletes": 26, "reinserts": 26, "inserts": 26}
    short = summarize(log, pinned=19, started=90.0, ended=120.0, retain_hours=0.01)
    assert short["vacuum_removed_first_change_by"] is None  # no VACUUM in time to remove version 20's data
    log.commits[0]["began"] = 85.0  # a MERGE that took 15 s wrote files up to 15 s before it returned
    assert summarize(log, pinned=19, started=90.0, ended=150.0, retain_hours=0.01)["vacuum_removed_first_change_by"] == 40.0


def _when(r: dict[str, Any]) -> str:
    return "Measured then."


def _retention_row(**extra: Any) -> dict[str, Any]:
    return {"system": RETENTION_SYSTEM, "kind": "retention", "rows": 500_000, "files": 20, "retain_hours": 0.01,
            "retain_seconds": 36.0, "bootstrap_seconds": 95.2, "bootstrap_over_retention": 2.64,
            "versions_during_bootstrap": 41, "last_version_during_bootstrap": 60, "vacuums_during_bootstrap": 9,
            "vacuum_removed_first_change_by": 47.5, "pinned_version": 19, "last_source_version": 62,
            "catch_up_rounds": 19, "changes_during_bootstrap": {"updates": 600, "deletes": 150, "reinserts": 90,
                                                                "inserts": 60},
            "cdf_read_works": False, "cdf_error": "AnalysisException: [DELTA_CHANGE_DATA_FILE_NOT_FOUND] gone",
            "replica_equal_source": True, "load_average_1min": 3.1, **extra}


def test_the_section_reports_the_retention_run_and_keeps_older_copy_rows() -> None:
    copy = {"system": "copy floor (Spark read at V, written as a new Delta table)", "rows": 500_000, "files": 20,
            "seconds_to_replica": 30.0, "replica_equal_source": True}  # a row of a run before the retention run
    text = "\n".join(render([copy, _retention_row()], _when))
    assert "| copy floor (Spark read at V, written as a new Delta table) | 30.0 | 1.0x | - | - | yes | - |" in text
    assert "runs `VACUUM … RETAIN 0.01 HOURS`" in text and "no retention at all, not 36 s" in text, \
        "a run of the RETAIN writer says that Delta rounded its retention to 0 hours"
    current = "\n".join(render([_retention_row(vacuum="table retention")], _when))
    assert "runs a plain `VACUUM`" in current and "`delta.deletedFileRetentionDuration` (36 s" in current
    assert ("| 500,000 | 95.2 | 36 | 2.64x | 41 | 9 | 19 | fails (a VACUUM during the bootstrap could remove V+1's change data) | "
            "yes (0 lost) | 3.1 |") in text
    assert "(V = 19; its commits during the bootstrap were versions V+1 to 60, its last commit, before it stopped, version 62)" in text
    assert "ran 47.5 s into the bootstrap" in text and "DELTA_CHANGE_DATA_FILE_NOT_FOUND" in text


def test_a_retention_run_that_proves_nothing_or_fails_says_so() -> None:
    works = "\n".join(render([_retention_row(cdf_read_works=True, cdf_error=None, replica_equal_source=False,
                                             versions_during_bootstrap=0)], _when))
    assert "WORKS: the retention was not shorter than this bootstrap" in works and "NO (changes lost)" in works
    assert "it committed nothing during the bootstrap, its last commit" in works
    late = "\n".join(render([_retention_row(vacuum_removed_first_change_by=None)], _when))
    assert "fails, but no VACUUM during the bootstrap could remove V+1's change data" in late
    failed = "\n".join(render([{"system": RETENTION_SYSTEM, "kind": "retention", "rows": 10, "files": 2,
                                "retain_hours": 0.01, "error": "RuntimeError: the table failed"}], _when))
    assert "**The run failed:** RuntimeError: the table failed" in failed


def test_the_retention_run_sets_the_sources_own_retention_in_seconds() -> None:
    assert retention_interval(0.01) == "interval 36 seconds"
    assert retention_interval(0.02) == "interval 72 seconds"


def test_change_files_counts_what_a_version_wrote_and_what_is_left(tmp_path: Path) -> None:
    from bench.chunked import _change_files

    log = tmp_path / "_delta_log"
    log.mkdir()
    actions = [{"commitInfo": {"operation": "MERGE"}},
               {"cdc": {"path": "_change_data/cdc-00000-a.parquet", "size": 10, "dataChange": False}},
               {"cdc": {"path": "_change_data/cdc-00001-b%20c.parquet", "size": 10, "dataChange": False}},
               {"add": {"path": "part-0.parquet", "size": 10, "dataChange": True}}]
    (log / f"{3:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    (tmp_path / "_change_data").mkdir()
    (tmp_path / "_change_data" / "cdc-00001-b c.parquet").write_bytes(b"x")   # paths in the log are URL-encoded
    assert _change_files(tmp_path, 3) == {"written": 2, "left": 1}
    assert _change_files(tmp_path, 4) == {"written": 0, "left": 0}
