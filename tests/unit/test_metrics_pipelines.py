"""Several pipelines in one process share one registry (one ``/metrics``): each keeps its own
bookkeeping, and a pipeline that stops for good takes its series with it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from lakemirror.daemon.metrics import Metrics
from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.supervisor.control.lag import LagReading
from lakemirror.supervisor.control.table_state import TableState, TableStatus


def progress(rows: int) -> BootstrapProgress:
    return BootstrapProgress(version=3, chunks_total=4, chunks_done=1, rows_total=1000, rows_copied=rows,
                             started_at=0.0, now=1.0, rows_copied_this_run=rows)


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def feed(metrics: Metrics) -> None:
    metrics.state_changed("orders", TableStatus(state=TableState.RUNNING))
    metrics.lag_measured("orders", LagReading(lag_seconds=4.0, versions_behind=2, latest_source_version=9,
                                              applied_through_version=7, oldest_unapplied_at=100.0))
    metrics.bootstrap_progressed("orders", progress(10))


def test_a_stopped_pipeline_takes_its_series_off_the_registry_and_the_others_keep_theirs() -> None:
    main = Metrics("main", CollectorRegistry(), clock=lambda: 110.0)
    posted = main.for_pipeline("posted")
    posted.watch_feed_letters(lambda: {"orders": 2}, lambda: {"orders": 2})
    feed(main)
    feed(posted)
    assert sample(posted, "lakemirror_lag_seconds", pipeline="posted", table="orders") == 10.0
    assert sample(posted, "lakemirror_feed_dead_letters_pending", pipeline="posted", table="orders") == 2

    posted.pipeline_removed()

    text = generate_latest(main.registry).decode()
    assert 'pipeline="posted"' not in text, "no series of the stopped pipeline is left to go on ageing"
    assert sample(main, "lakemirror_lag_seconds", pipeline="main", table="orders") == 10.0
    assert sample(main, "lakemirror_table_state", pipeline="main", table="orders", state="running") == 1
    assert sample(main, "lakemirror_bootstrap_rows_copied_total", pipeline="main", table="orders") == 10
    again = main.for_pipeline("posted")  # posted again under the same id: counted from nothing
    again.bootstrap_progressed("orders", progress(5))
    assert sample(again, "lakemirror_bootstrap_rows_copied_total", pipeline="posted", table="orders") == 5


def test_two_pipelines_replicating_a_table_of_the_same_name_count_its_bootstrap_rows_apart() -> None:
    main = Metrics("main", CollectorRegistry())
    other = main.for_pipeline("other")
    main.bootstrap_progressed("orders", progress(100))
    other.bootstrap_progressed("orders", progress(30))
    main.bootstrap_progressed("orders", progress(150))
    assert sample(main, "lakemirror_bootstrap_rows_copied_total", pipeline="main", table="orders") == 150
    assert sample(other, "lakemirror_bootstrap_rows_copied_total", pipeline="other", table="orders") == 30
