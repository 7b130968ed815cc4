from __future__ import annotations

import pytest

from lakemirror.sources.retention import RetentionWindow, headroom_seconds, parse_interval, time_travel_refused

DAY = 86400.0


@pytest.mark.parametrize("text,seconds", [
    ("interval 7 days", 7 * DAY), ("interval 1 week", 7 * DAY), ("INTERVAL 30 DAYS", 30 * DAY),
    ("interval 1 day 12 hours", 1.5 * DAY), ("interval 0 hours", 0.0), ("168 hours", 7 * DAY),
    ("interval 90 minutes", 5400.0), ("interval 1 second", 1.0),
])
def test_parse_interval(text: str, seconds: float) -> None:
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["", "interval", "7 fortnights", "interval seven days", "interval 7 days ago"])
def test_parse_interval_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_interval(text)


def test_window_defaults_and_properties() -> None:
    assert RetentionWindow.from_properties({}).seconds == 7 * DAY
    w = RetentionWindow.from_properties({"delta.deletedFileRetentionDuration": "interval 60 days",
                                         "delta.logRetentionDuration": "interval 2 days"})
    assert w.seconds == 2 * DAY
    # A value we cannot read never makes the window look longer than the default.
    assert RetentionWindow.from_properties({"delta.logRetentionDuration": "soon"}).seconds == 7 * DAY


def test_caught_up_table_has_the_whole_window() -> None:
    w = RetentionWindow(3 * DAY, 30 * DAY)
    assert headroom_seconds(applied_through=9, latest_version=9, commit_times={}, window=w, now=1e9) == 3 * DAY


def test_headroom_counts_from_the_oldest_unapplied_commit() -> None:
    w = RetentionWindow(3 * DAY, 30 * DAY)
    times = {10: 1000.0, 11: 5000.0}
    assert headroom_seconds(applied_through=9, latest_version=11, commit_times=times, window=w,
                            now=1000.0 + DAY) == 2 * DAY
    assert headroom_seconds(applied_through=9, latest_version=11, commit_times=times, window=w,
                            now=1000.0 + 4 * DAY) == 0.0


def test_a_needed_commit_missing_from_the_log_means_no_headroom() -> None:
    w = RetentionWindow()
    assert headroom_seconds(applied_through=9, latest_version=12, commit_times={12: 5.0}, window=w, now=6.0) == 0.0


def test_deltas_refusal_to_read_a_version_is_told_apart_from_other_failures_and_found_in_a_cause() -> None:
    refused = RuntimeError("[DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION] Cannot time "
                           "travel beyond delta.deletedFileRetentionDuration (0 HOURS) set on the table.")
    assert time_travel_refused(refused)
    try:
        try:
            raise refused
        except RuntimeError as exc:
            raise ValueError("reading the chunk failed") from exc
    except ValueError as wrapped:
        assert time_travel_refused(wrapped)
    assert not time_travel_refused(RuntimeError("[FAILED_READ_FILE.FILE_NOT_EXIST] File does not exist"))
