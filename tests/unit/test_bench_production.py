"""bench.production and bench.production_report: the runs of the production workload, the issue's
goals judged from them, and how its section reads (pure)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import _steady_table, main
from bench.production import (DEFAULT_ROWS, PRODUCTION, ROW_BASE, ROWS, S3Server, S3Site, merge_runs, parameters,
                              plan)
from bench.production_report import (LAG_AGREEMENT, exact_verdicts, lag_agreement, lag_verdicts, ratio_verdicts,
                                     render, within)
from bench.systems import DRIVER_PATH, SPARK_REWRITE

RECIPE, DRIVER, SPARK, CONNECT, LOOP = (ROWS[k].name for k in ("recipe", "driver", "spark", "connect", "loop"))


def _run(system: str, tables: int, p99: float, writer: str = "spark", run_id: float = 1.0, **extra: Any) -> dict[str, Any]:
    lag = {"commits": 10, "unapplied": 0, "p50": p99 / 2, "p95": p99, "p99": p99, "max": p99, "mean": p99 / 2}
    return {"system": system, "tables": tables, "rows_per_table": 100, "seconds": 90.0, "warmup_seconds": 60.0,
            "lag": lag, "replicas_equal_sources": True, "measured_at": 0.0, "uptime_at_start": "up, load average: 9.00",
            "writer": writer, "run_id": run_id, "source_commits": 600, "ready_seconds": 30.0, **extra}


def _metric(p50: float, mx: float, outside_p50: float, outside_max: float) -> dict[str, Any]:
    return {"daemon_metric_lag": {"samples": 90, "p50": p50, "max": mx, "mean": p50,
                                  "outside_p50": outside_p50, "outside_max": outside_max, "outside_mean": outside_p50}}


def test_spark_reaches_the_bucket_as_s3a_and_delta_rs_as_s3() -> None:
    site = S3Site(S3Server(port=1))
    warehouse = site.warehouse(Path("/tmp/bench-lakemirror-abc"))
    assert warehouse == "s3a://lakemirror-bench/bench-lakemirror-abc/lakehouse"
    assert site.uri(warehouse, "dst", "t00") == "s3://lakemirror-bench/bench-lakemirror-abc/lakehouse/dst/bench/t00"
    assert site.spark_uri(warehouse, "src", "t00") == "s3a://lakemirror-bench/bench-lakemirror-abc/lakehouse/src/bench/t00"


def test_each_lakemirror_row_selects_its_path_by_its_own_settings() -> None:
    """Both paths exist whatever the daemon's default for driver_apply; nothing else is forced."""
    assert ROWS["driver"].settings == {"driver_apply": True} and ROWS["driver"].expected_path == "driver"
    assert ROWS["spark"].settings == {"driver_apply": False} == ROWS["connect"].settings
    assert ROWS["connect"].connect and not ROWS["spark"].connect
    assert ROW_BASE == {"kernel_change_feed": False}
    # scripts/measure-s3-costs.py's Spark path keeps its forced MERGE
    assert PRODUCTION == {"driver_apply": False, "rewrite_below_bytes": 0, "kernel_change_feed": False}
    assert S3Site(S3Server(port=1)).own_process(RECIPE) and S3Site(S3Server(port=1)).own_process(SPARK)
    assert not S3Site(S3Server(port=1)).own_process(LOOP)


def test_the_full_run_has_every_row_for_both_writers_at_4_and_16_tables_and_connect_at_4() -> None:
    runs = plan(parameters(quick=False))
    assert runs[:5] == [("delta-rs", 4, k) for k in ("recipe", "driver", "spark", "connect", "loop")]
    assert ("delta-rs", 16, "connect") not in runs and ("spark", 16, "connect") not in runs
    assert len(runs) == 2 * (5 + 4)
    assert {w for w, _, _ in runs} == {"delta-rs", "spark"}
    assert "recipe_tuned" not in DEFAULT_ROWS and all(k != "recipe_tuned" for _, _, k in runs)
    quick = plan(parameters(quick=True))
    assert len(quick) == 2 * 5 and {n for _, n, _ in quick} == {2}


def test_a_part_of_the_run_is_a_filter_and_an_opt_in_row_can_be_named() -> None:
    p = parameters(quick=False)
    assert plan(p, systems=["connect", "recipe"], writers=["spark"]) == [
        ("spark", 4, "recipe"), ("spark", 4, "connect"), ("spark", 16, "recipe")]
    assert plan(p, tables=[16], systems=["driver"]) == [("delta-rs", 16, "driver"), ("spark", 16, "driver")]
    assert plan(p, systems=["recipe_tuned"], writers=["delta-rs"], tables=[4]) == [("delta-rs", 4, "recipe_tuned")]
    with pytest.raises(ValueError, match="unknown row"):
        plan(p, systems=["nope"])
    with pytest.raises(ValueError, match="unknown writer"):
        plan(p, writers=["pandas"])


def test_rows_measured_again_replace_their_own_and_keep_the_others() -> None:
    kept = [_run(RECIPE, 4, 9.0, run_id=1), _run(SPARK, 4, 5.0, run_id=1), _run(SPARK, 4, 6.0, writer="delta-rs")]
    fresh = [_run(SPARK, 4, 3.0, run_id=2)]
    merged = merge_runs(kept, fresh)
    assert [(r["system"], r["writer"], r["lag"]["p99"]) for r in merged] == [
        (RECIPE, "spark", 9.0), (SPARK, "delta-rs", 6.0), (SPARK, "spark", 3.0)]


def test_a_partial_run_drops_the_runs_of_systems_no_longer_benchmarked() -> None:
    kept = [_run("lakemirror, S3, Spark MERGE", 4, 27.0, writer="delta-rs"), _run(LOOP, 16, 8.0, writer="delta-rs")]
    merged = merge_runs(kept, [_run(SPARK, 4, 3.0, writer="delta-rs")])
    assert [(r["system"], r["tables"]) for r in merged] == [(LOOP, 16), (SPARK, 4)]


def test_the_ratio_goals_are_judged_per_writer_and_table_count() -> None:
    runs = [_run(RECIPE, 4, 20.0), _run(SPARK, 4, 9.0), _run(CONNECT, 4, 12.0), _run(LOOP, 4, 2.0),
            _run(DRIVER, 4, 2.9, apply_paths={"t00": {"path": DRIVER_PATH}}),
            _run(RECIPE, 16, 60.0), _run(SPARK, 16, 31.0)]
    verdicts = {(v.goal.split(":")[0], v.tables): v for v in ratio_verdicts(runs)}
    driver = verdicts[("S3 driver path", 4)]
    assert driver.met is True and driver.measured == "1.45x (2.90 / 2.00 s)"
    assert verdicts[("Spark-only path", 4)].met is True            # 9 <= 0.5 x 20
    assert verdicts[("Spark-only path", 16)].met is False          # 31 > 0.5 x 60
    assert verdicts[("Spark Connect", 4)].met is False             # 12 > 1.25 x 9
    assert ("S3 driver path", 16) not in verdicts                  # neither row ran at 16


def test_a_goal_is_not_judged_on_missing_failed_mixed_or_off_path_rows() -> None:
    runs = [_run(RECIPE, 4, 20.0), {"system": SPARK, "tables": 4, "writer": "spark", "error": "RuntimeError: boom"},
            _run(LOOP, 4, 2.0, run_id=7), _run(DRIVER, 4, 2.5, apply_paths={
                "t00": {"path": DRIVER_PATH}, "t01": {"path": SPARK_REWRITE, "reason": "applies by rewriting"}}),
            _run(RECIPE, 2, 4.0), _run(SPARK, 2, 1.0), _run(DRIVER, 16, 3.0)]
    verdicts = {(v.goal.split(":")[0], v.tables): v for v in ratio_verdicts(runs)}
    assert verdicts[("Spark-only path", 4)].met is None and "the lakemirror, Spark-only path run failed" in \
        verdicts[("Spark-only path", 4)].note
    driver = verdicts[("S3 driver path", 4)]
    assert driver.met is None and "did not take its path for t01" in driver.note and "different runs" in driver.note
    assert verdicts[("Spark-only path", 2)].met is None and "set at 4 and 16 tables" in verdicts[("Spark-only path", 2)].note
    assert verdicts[("S3 driver path", 16)].met is None and "no delta-rs CDF loop run" in verdicts[("S3 driver path", 16)].note
    nan = ratio_verdicts([_run(SPARK, 4, math.nan), _run(RECIPE, 4, 10.0)])
    assert nan[0].met is None and "no commit of the measured window" in nan[0].note


def test_the_lag_metric_agrees_within_20_percent_of_the_outside_measure_at_p50_and_max() -> None:
    assert within(11.9, 10.0) and within(8.0, 10.0) and not within(12.1, 10.0) and not within(7.9, 10.0)
    assert within(0.0, 0.0) and not within(0.5, 0.0) and within(None, 1.0) is None and within(math.nan, 1.0) is None
    agree = _run(SPARK, 4, 9.0, **_metric(5.5, 11.0, 5.0, 10.0))
    apart = _run(DRIVER, 4, 2.0, **_metric(1.0, 9.0, 1.0, 4.0))
    assert lag_agreement(agree)["max"] == {"metric": 11.0, "outside": 10.0, "agree": True}
    assert lag_agreement(_run(RECIPE, 4, 9.0)) is None
    found = {v.goal: v for v in lag_verdicts([agree, apart, _run(RECIPE, 4, 9.0)])}
    assert len(found) == 2
    assert found[f"lag metric within {LAG_AGREEMENT:.0%} of the outside measure: {SPARK}"].met is True
    off = found[f"lag metric within {LAG_AGREEMENT:.0%} of the outside measure: {DRIVER}"]
    assert off.met is False and off.measured == "p50 1.00 vs 1.00 s; max 9.00 vs 4.00 s"
    old = _run(SPARK, 4, 9.0, daemon_metric_lag={"samples": 10, "max": 3.0, "mean": 2.0})  # before the outside figure
    assert lag_verdicts([old])[0].met is None


def test_every_replica_exact_is_judged_per_writer() -> None:
    runs = [_run(SPARK, 4, 1.0), _run(LOOP, 4, 1.0, writer="delta-rs", replicas_equal_sources=False),
            {"system": RECIPE, "tables": 4, "writer": "spark", "error": "x"}]
    found = {v.writer: v for v in exact_verdicts(runs)}
    assert found["delta-rs"].met is False and "not exact: delta-rs CDF loop at 4" in found["delta-rs"].note
    assert found["spark"].met is False and "failed: " + RECIPE in found["spark"].note


def test_the_section_reads_goals_then_each_writer_and_table_count_against_the_recipe() -> None:
    runs = [_run(RECIPE, 4, 20.0), _run(SPARK, 4, 8.0, **_metric(4.0, 8.0, 4.1, 8.2),
                                          apply_paths={"t00": {"path": SPARK_REWRITE, "reason": "applies by rewriting"}}),
            _run(DRIVER, 4, 3.0, apply_paths={"t00": {"path": SPARK_REWRITE, "reason": "applies by rewriting"}}),
            _run(CONNECT, 4, 9.0, connect_server_start_seconds=40.0,
                 peak_resident_mib={"python": 200.0, "server jvm": 1300.0}),
            _run(LOOP, 4, 2.0, writer="delta-rs"),
            {"system": CONNECT, "tables": 4, "writer": "delta-rs", "error": "RuntimeError: no server", "measured_at": 0.0}]
    p = parameters(quick=False)
    text = "\n".join(render(runs, p, _steady_table))
    assert text.index("### Goals") < text.index("### Sources written by delta-rs, 4 tables") < \
        text.index("### Sources written by spark, 4 tables")
    assert f"| Spark-only path: p99 <= 0.5x the user recipe's | spark | 4 | 0.40x (8.00 / 20.00 s) | 0.50x | met |" in text
    assert f"p99 vs {RECIPE}" in text  # the recipe is the base of the table
    assert "the writer made 600 commits (1.00 a table a second)" in text
    assert f"apply path: {SPARK_REWRITE} for 1 of 1 tables" in text
    assert f"**{DRIVER} did not take its path for t00**" in text
    assert "`lakemirror_lag_seconds` p50 4.00 s against 4.10 s outside (within 20%)" in text
    assert "the Connect server's peak RSS 1300 MiB JVM" in text
    assert f"- {CONNECT}, sources written by delta-rs, 4 tables: the run failed: RuntimeError: no server" in text
    failed_only = "\n".join(render([runs[-1]], p, _steady_table))
    assert "failed: RuntimeError: no server" in failed_only


def test_the_sources_are_checkpointed_as_spark_writers_leave_them(tmp_path: Path) -> None:
    """delta-rs's sources every 10 commits (Delta's default), not every 100 (delta-rs's); Spark's
    writer needs no property for it."""
    from deltalake import DeltaTable

    from bench.systems import LocalSite
    from bench.workload import SourceTable

    assert S3Site(S3Server(port=1)).source_properties == {"delta.checkpointInterval": "10"}
    assert S3Site(S3Server(port=1), writer="spark").source_properties == {}
    assert LocalSite.source_properties == {}
    source = SourceTable(tmp_path / "t", 10, properties=S3Site(S3Server(port=1)).source_properties)
    source.create()
    assert DeltaTable(str(source.path)).metadata().configuration == {
        "delta.enableChangeDataFeed": "true", "delta.checkpointInterval": "10"}


@pytest.mark.parametrize("args, message", [
    (["--quick", "--rows", "recipe"], "add --only production"),
    (["--only", "production", "--rows", "nope"], "unknown row(s) ['nope']"),
    (["--only", "production", "--tables", "four"], "--tables: not a list of int"),
    (["--only", "soak", "--soak-minutes", "5"], "--soak-minutes: at least 20"),
])
def test_a_part_named_wrong_is_refused_before_anything_runs(args: list[str], message: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_every_in_process_row_runs_the_baseline_it_names() -> None:
    """The production loop row runs the delta-rs CDF loop (its name differs from the local workloads'
    "delta-rs"), never the full refresh; an unknown name is refused."""
    from bench.__main__ import baseline_runner
    from bench.systems import DeltaRsLoop, FullRefresh

    for row in ROWS.values():
        if row.kind == "loop":
            assert baseline_runner(row.name) is DeltaRsLoop
    assert baseline_runner("delta-rs") is DeltaRsLoop
    assert baseline_runner("full refresh") is FullRefresh
    with pytest.raises(ValueError, match="no in-process baseline"):
        baseline_runner("delta-rs loop")


def test_rows_measured_at_different_commits_each_name_their_own() -> None:
    """The section's heading names one commit; when its rows come from several, each row says its own."""
    p = parameters(quick=False)
    one = "\n".join(render([_run(RECIPE, 4, 20.0, commit="aaaaaaa"), _run(SPARK, 4, 8.0, commit="aaaaaaa")], p,
                           _steady_table))
    assert "at `aaaaaaa`" not in one
    two = "\n".join(render([_run(RECIPE, 4, 20.0, commit="aaaaaaa"), _run(SPARK, 4, 8.0, commit="bbbbbbb")], p,
                           _steady_table))
    assert "(00:00 UTC at `aaaaaaa`)" in two and "(00:00 UTC at `bbbbbbb`)" in two
