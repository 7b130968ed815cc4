"""bench.production: where the production workload's tables live and how its section reads (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.__main__ import _steady_table
from bench.production import CONNECT_MODE, LOCAL_MODE, PRODUCTION, S3Server, S3Site, render


def _run(system: str, tables: int, p99: float, **extra: Any) -> dict[str, Any]:
    lag = {"commits": 10, "unapplied": 0, "p50": p99 / 2, "p95": p99, "p99": p99, "max": p99, "mean": p99 / 2}
    return {"system": system, "tables": tables, "rows_per_table": 100, "seconds": 90.0, "lag": lag,
            "replicas_equal_sources": True, "measured_at": 0.0, "uptime_at_start": "up, load average: 9.00",
            **extra}


def test_spark_reaches_the_bucket_as_s3a_and_delta_rs_as_s3() -> None:
    site = S3Site(S3Server(port=1))
    warehouse = site.warehouse(Path("/tmp/bench-lakemirror-abc"))
    assert warehouse == "s3a://lakemirror-bench/bench-lakemirror-abc/lakehouse"
    assert site.uri(warehouse, "dst", "t00") == "s3://lakemirror-bench/bench-lakemirror-abc/lakehouse/dst/bench/t00"


def test_the_production_settings_take_no_driver_shortcut() -> None:
    assert PRODUCTION == {"driver_apply": False, "rewrite_below_bytes": 0, "kernel_change_feed": False}


def test_each_lakemirror_run_is_judged_against_the_goal_of_its_table_count() -> None:
    runs = [_run(LOCAL_MODE, 4, 2.5), _run("delta-rs CDF loop", 4, 1.0), _run(LOCAL_MODE, 16, 12.0),
            _run(CONNECT_MODE, 4, 9.0, connect_server_start_seconds=40.0,
                 peak_resident_mib={"python": 200.0, "server jvm": 1300.0}),
            {"system": CONNECT_MODE, "tables": 16, "error": "RuntimeError: no server", "measured_at": 0.0}]
    text = "\n".join(render(runs, {"fraction": 0.01, "trigger": 1.0, "warmup": 60, "drain": 120}, _steady_table))
    assert f"- {LOCAL_MODE}: `uptime` at start: `up, load average: 9.00`; goal met (p99 2.50 s)" in text
    assert f"- {LOCAL_MODE}: `uptime` at start: `up, load average: 9.00`; goal missed (p99 12.00 s)" in text
    assert f"- {CONNECT_MODE}: `uptime` at start: `up, load average: 9.00`; goal missed (p99 9.00 s)" in text
    assert "the Connect server's peak RSS 1300 MiB JVM" in text
    assert "- delta-rs CDF loop: `uptime`" in text and "delta-rs CDF loop: `uptime` at start: `up, load average: 9.00`;" not in text
    assert f"{CONNECT_MODE}, 16 tables: the run failed: RuntimeError: no server" in text
    assert "### 4 tables (goal: lakemirror's p99 <= 3 s)" in text and "### 16 tables (goal: lakemirror's p99 <= 10 s)" in text
    assert "0.40x" in text  # the loop's p99 against the production path's, in the 4-table table
    nothing = _run(LOCAL_MODE, 16, float("nan"))
    text = "\n".join(render([nothing], {}, _steady_table))
    assert "goal missed (no commit of the measured window applied)" in text


def test_the_production_sources_are_checkpointed_as_spark_writers_leave_them(tmp_path: Path) -> None:
    """Every 10 commits (Delta's default), not every 100 (delta-rs's): a change-feed reader replays
    the commits since the last checkpoint for each snapshot of the source."""
    from deltalake import DeltaTable

    from bench.systems import LocalSite
    from bench.workload import SourceTable

    assert S3Site(S3Server(port=1)).source_properties == {"delta.checkpointInterval": "10"}
    assert LocalSite.source_properties == {}
    source = SourceTable(tmp_path / "t", 10, properties=S3Site(S3Server(port=1)).source_properties)
    source.create()
    assert DeltaTable(str(source.path)).metadata().configuration == {
        "delta.enableChangeDataFeed": "true", "delta.checkpointInterval": "10"}
