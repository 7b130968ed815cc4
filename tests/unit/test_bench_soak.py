"""bench.soak: the soak's windows, goals, storage growth and section (pure), and the memory it samples."""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench.soak import BATCH_GROWTH_LIMIT, RSS_FLAT_WITHIN, parameters, process_tree_mib, render, summarize, timeline

T0 = 1_000.0  # the writer's start; the measured time is 60 s after it, for 600 s; windows of 100 s


def _sample(at: float, python: float, jvm: float, files: int, log: int) -> dict[str, Any]:
    table = {"active_files": files, "data_objects": files * 3, "data_bytes": files * 1000, "log_objects": log,
             "log_bytes": log * 2**20, "checkpoints": log // 10}
    return {"at": at, "rss_mib": {"python": python, "jvm": jvm},
            "tables": {"t00": table, "t01": dict(table), "checkpoint table": {**table, "log_objects": log * 2}}}


def _summary(batches: list[tuple[float, float]], samples: list[dict[str, Any]],
             series: list[tuple[float, float]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return summarize(batches=batches, samples=samples, series=series, measured_from=T0 + 60,
                     writer_started=T0, writer_stopped=T0 + 660, window=100.0)


def test_batch_cost_is_compared_between_the_first_and_the_last_window() -> None:
    first = [(T0 + 60 + i * 10, 2.0 + i * 0.1) for i in range(10)]      # p50 2.5
    middle = [(T0 + 300, 50.0)]                                          # in neither window
    last = [(T0 + 560 + i * 10, 2.9) for i in range(10)] + [(T0 + 660, 3.1)]
    warm = [(T0 + 10, 40.0)]                                             # the warm-up: never counted
    s = _summary([*warm, *first, *middle, *last], [])
    b = s["batch_seconds"]
    assert (b["first_count"], b["last_count"]) == (10, 11)
    assert b["first_p50"] == pytest.approx(2.45) and b["last_p50"] == 2.9
    assert b["ratio"] == pytest.approx(2.9 / 2.45) and b["met"] is True and b["goal"] == BATCH_GROWTH_LIMIT
    grown = _summary([*first, *((t, d * 1.5) for t, d in last)], [])
    assert grown["batch_seconds"]["met"] is False
    assert _summary([], [])["batch_seconds"]["met"] is None  # no batch: not judged


def test_rss_must_stay_within_15_percent_and_storage_growth_is_per_hour() -> None:
    samples = [_sample(T0 + 60 + i * 60, 300.0, 1500.0 + i * 10, 10 + i, 20 + 10 * i) for i in range(11)]
    s = _summary([], samples)
    jvm = s["rss_mib"]["jvm"]
    assert jvm["first_median"] == 1505.0 and jvm["last_median"] == 1595.0
    assert jvm["met"] is (abs(1595 / 1505 - 1) <= RSS_FLAT_WITHIN) is True and s["rss_met"] is True
    leak = [_sample(T0 + 60 + i * 60, 300.0 + 40 * i, 1500.0, 10, 20) for i in range(11)]
    assert _summary([], leak)["rss_mib"]["python"]["met"] is False and _summary([], leak)["rss_met"] is False
    storage = s["storage"]["t00"]
    assert storage["first"]["log_objects"] == 20 and storage["last"]["log_objects"] == 120
    assert storage["per_hour"]["log_objects"] == pytest.approx(100 / (600 / 3600))
    assert s["storage"]["checkpoint table"]["last"]["log_objects"] == 240


def test_lag_is_reported_for_both_windows() -> None:
    series = [(60.0 + i, 1.0) for i in range(50)] + [(600.0 + i, 3.0) for i in range(50)]  # relative to T0
    lag = _summary([], [], series)["lag_seconds"]
    assert lag["first"] == {"p50": 1.0, "max": 1.0} and lag["last"] == {"p50": 3.0, "max": 3.0}


def test_the_timeline_takes_the_last_sample_of_each_step_and_sums_the_replicas() -> None:
    samples = [_sample(T0 + 60 + i * 30, 300.0, 1500.0, 10 + i, 20 + i) for i in range(5)]  # every 30 s
    points = timeline(samples, [(T0 + 61, 2.0), (T0 + 70, 4.0), (T0 + 130, 5.0)], every=60.0, start=T0 + 60)
    assert [p["minute"] for p in points] == [0.0, 1.0, 2.0]
    assert points[0]["active_files"] == 20 and points[1]["active_files"] == 2 * 12 and points[2]["active_files"] == 28
    assert points[1]["batch_p50"] == 3.0 and points[2]["batch_p50"] == 5.0
    assert points[1]["checkpoint_table_log_objects"] == 2 * 22 and points[1]["log_mib"] == 2 * 22


def test_the_section_names_each_goal_and_its_verdict() -> None:
    samples = [_sample(T0 + 60 + i * 60, 300.0, 1500.0, 10 + i, 20 + i) for i in range(11)]
    batches = [(T0 + 70, 2.0), (T0 + 600, 2.1)]
    soak = _summary(batches, samples)
    soak["timeline"] = timeline(samples, batches, 300.0, T0 + 60)
    run = {"system": "lakemirror, Spark-only path", "tables": 2, "rows_per_table": 10_000, "measured_at": 0.0,
           "uptime_at_start": "up", "warmup_seconds": 60.0, "writer": "delta-rs", "replicas_equal_sources": True,
           "source_commits": 1200, "lag": {"unapplied": 0}, "soak": soak,
           "soak_parameters": parameters(quick=False)}
    text = "\n".join(render([run, {"system": "lakemirror, S3 driver path", "error": "TimeoutError: x"}]))
    assert "| batch seconds, p50 (1 and 1 batches) | 2.00 | 2.10 | 1.05 | <= 1.2 | met |" in text
    assert "| RSS MiB, jvm (median) | 1500 | 1500 | 1.00 | within 15% | met |" in text
    assert "| t00 | 10 -> 20 (+60.0/h)" in text
    assert "Replicas exact after the drain: yes" in text
    assert "- lakemirror, S3 driver path: the soak failed: TimeoutError: x" in text
    assert "| 5.0 |" in text  # a timeline point 5 minutes in


def test_the_memory_of_a_process_tree_is_read_by_kind() -> None:
    mine = process_tree_mib(os.getpid())
    assert mine.get("python", 0) > 10
    assert process_tree_mib(2**22 + 7) == {}  # no such process


def test_the_full_soak_is_an_hour_at_4_tables_in_10_minute_windows() -> None:
    full, quick = parameters(quick=False), parameters(quick=True)
    assert (full["minutes"], full["tables"], full["window_minutes"], full["row"]) == (60.0, 4, 10.0, "spark")
    assert quick["minutes"] >= 2 * quick["window_minutes"]
