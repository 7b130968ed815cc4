"""lakemirror.daemon.status.render_table and lakemirror.daemon.http.readiness."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from lakemirror.daemon.http import readiness
from lakemirror.daemon.status import render_table
from lakemirror.supervisor.control.loop import TableView

RUNNING = TableView(table="orders", state="running", lag_seconds=1.234, versions_behind=2, applied_through=10,
                    rows_applied=55, batches=3, failures=0, retries=0, next_retry_at=None, last_error=None,
                    last_batch_at=990.0)
DEGRADED = TableView(table="customers", state="degraded", lag_seconds=None, versions_behind=None,
                     applied_through=None, rows_applied=0, batches=0, failures=2, retries=2, next_retry_at=1030.4,
                     last_error="boom " * 30, last_batch_at=None)


def test_render_table_aligns_columns_and_formats_values() -> None:
    text = render_table([asdict(RUNNING), asdict(DEGRADED)], now=1000.0)
    assert text.splitlines() == [
        "TABLE      STATE     LAG   BEHIND  APPLIED@V  ROWS  BATCHES  LAST BATCH  LAST ERROR",
        "orders     running   1.2s  2       10         55    3        10s ago",
        "customers  degraded  -     -       -          0     0        -           "
        + ("retry in 30s: " + "boom " * 30)[:80],
    ]


def test_render_table_with_no_rows_is_the_header() -> None:
    assert render_table([], now=0.0) == "TABLE  STATE  LAG  BEHIND  APPLIED@V  ROWS  BATCHES  LAST BATCH  LAST ERROR"


def test_render_table_tolerates_sparse_rows_from_the_checkpoint_table() -> None:
    text = render_table([{"table": "t", "state": "stopped (last seen)", "lag_seconds": 0,
                          "applied_through": 0, "last_batch_at": 500.0}], now=400.0)
    assert text.splitlines()[1] == "t      stopped (last seen)  0.0s  -       0          0     0        0s ago"


def test_overdue_retry_shows_zero() -> None:
    row = {**asdict(DEGRADED), "last_error": "x", "next_retry_at": 900.0}
    assert render_table([row], now=1000.0).splitlines()[1].endswith("retry in 0s: x")


# -- readiness ----------------------------------------------------------------------------------

def test_ready_when_all_running_within_slo() -> None:
    assert readiness([RUNNING, replace(RUNNING, table="b", lag_seconds=None)], lag_slo_seconds=60) == (True, [])


def test_not_ready_while_the_tables_are_unknown_or_there_are_none() -> None:
    """An event source's daemon answered ready with ``tables: []`` while its JVM started."""
    ok, reasons = readiness([], lag_slo_seconds=60)
    assert ok is False and reasons == ["the pipeline has no tables yet: they are still being listed, or the "
                                       "schema has none"]


def test_paused_tables_do_not_count() -> None:
    assert readiness([RUNNING, replace(RUNNING, table="p", state="paused")], 60) == (True, [])


def test_not_ready_reasons() -> None:
    views = [
        replace(RUNNING, table="slow", lag_seconds=400.26),
        replace(DEGRADED, last_error="ConcurrentAppendException"),
        replace(RUNNING, table="new", state="starting"),
        replace(RUNNING, table="at_slo", lag_seconds=300.0),
    ]
    ok, reasons = readiness(views, lag_slo_seconds=300)
    assert ok is False
    assert reasons == [
        "slow lags 400.3s > SLO 300s",
        "customers is degraded: ConcurrentAppendException",
        "new is starting",
    ]


def test_status_names_each_tables_apply_path_and_why_a_batch_took_another(tmp_path: Any) -> None:
    from lakemirror.daemon.status import render_apply_paths
    from lakemirror.identifiers import TableName
    from lakemirror.schema import Column
    from lakemirror.sinks.merge.apply_choice import DRIVER, ApplyChoice
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
    from lakemirror.sinks.merge.planner import plan_merge
    from lakemirror.supervisor.change_feed.stream_wiring import apply_detail
    from lakemirror.tables import TableLocation

    plan = plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"])
    target = TableLocation(TableName("dst", "s", "orders"), str(tmp_path / "orders"))
    undecided = DeltaMergeSink(target, plan, stable_source=True)
    assert apply_detail(undecided, None) is None, "nothing chosen before the first batch"
    sink = DeltaMergeSink(target, plan, stable_source=True,
                          choice=ApplyChoice(DRIVER, "applies on the driver by a delta-rs MERGE on object storage",
                                             10.0, 1 << 30, 1 << 20))
    sink.batch_note = "batch 7 had more change rows than the driver takes (10000): Spark applied it"
    detail = apply_detail(sink, None)
    assert detail == {"path": "driver", "reason": "applies on the driver by a delta-rs MERGE on object storage",
                      "latest_batch": "batch 7 had more change rows than the driver takes (10000): Spark applied it"}
    text = render_apply_paths([{"table": "orders", "detail": {"apply": detail}}, {"table": "idle", "detail": None}])
    assert text.splitlines() == [
        "apply paths:",
        "  orders: driver: applies on the driver by a delta-rs MERGE on object storage (latest batch: batch 7 had "
        "more change rows than the driver takes (10000): Spark applied it)"]
    assert render_apply_paths([{"table": "idle"}]) == ""
