"""lakemirror.supervisor.control.lag (honest lag) and Delta source offsets
(lakemirror.delta_log.stream_offsets.applied_through_from_offset)."""

from __future__ import annotations

import json

import pytest

from lakemirror.delta_log.stream_offsets import applied_through_from_offset
from lakemirror.supervisor.control.lag import LagReading, compute_lag

NOW = 1_700_000_000.0


def test_caught_up_is_zero_even_when_the_last_commit_is_old() -> None:
    # the source has been idle for a day: lag must not grow
    reading = compute_lag(applied_through=42, latest_version=42, commit_times={42: NOW - 86_400}, now=NOW)
    assert reading == LagReading(lag_seconds=0.0, versions_behind=0, latest_source_version=42,
                                 applied_through_version=42)


def test_caught_up_needs_no_commit_times() -> None:
    assert compute_lag(applied_through=7, latest_version=7, commit_times={}, now=NOW).lag_seconds == 0.0


def test_ahead_of_a_stale_head_reading_counts_as_caught_up() -> None:
    assert compute_lag(applied_through=9, latest_version=7, commit_times={}, now=NOW) == LagReading(0.0, 0, 7, 9)


def test_lag_is_measured_from_the_oldest_unapplied_version() -> None:
    times = {10: NOW - 500, 11: NOW - 300, 12: NOW - 120, 13: NOW - 5}
    reading = compute_lag(applied_through=10, latest_version=13, commit_times=times, now=NOW)
    assert reading == LagReading(lag_seconds=300.0, versions_behind=3, latest_source_version=13,
                                 applied_through_version=10, oldest_unapplied_at=NOW - 300,
                                 unapplied_commit_times={11: NOW - 300, 12: NOW - 120, 13: NOW - 5})
    assert reading.lag_at(NOW + 60) == 360.0, "a reading not renewed keeps counting from that commit"


def test_a_batch_after_the_reading_reprices_it_from_the_oldest_version_left() -> None:
    times = {11: NOW - 300, 12: NOW - 120, 13: NOW - 5}
    reading = compute_lag(applied_through=10, latest_version=13, commit_times=times, now=NOW)
    # A batch applied 11 and 12 ten seconds later: 13 prices the lag, with no read of the source.
    after = reading.repriced(12, NOW + 10)
    assert (after.lag_seconds, after.versions_behind, after.applied_through_version) == (15.0, 1, 12)
    assert after.lag_at(NOW + 20) == 25.0
    # Everything the reading saw is applied: 0 until a probe sees a newer commit.
    done = reading.repriced(13, NOW + 30)
    assert (done.lag_seconds, done.versions_behind, done.lag_at(NOW + 90)) == (0.0, 0, 0.0)
    # Never backwards, and an unknown applied version keeps the reading (as of now).
    assert reading.repriced(9, NOW + 60).lag_seconds == 360.0
    assert reading.repriced(None, NOW + 60).applied_through_version == 10


def test_a_repriced_reading_without_the_next_commit_time_takes_the_next_known_one() -> None:
    reading = compute_lag(applied_through=10, latest_version=14, commit_times={11: NOW - 50, 14: NOW - 2}, now=NOW)
    assert reading.repriced(11, NOW).lag_seconds == 2.0  # 12's time was not read: 14's bounds it


def test_lag_grows_with_time_while_stuck() -> None:
    times = {5: NOW - 60}
    first = compute_lag(applied_through=4, latest_version=5, commit_times=times, now=NOW)
    later = compute_lag(applied_through=4, latest_version=5, commit_times=times, now=NOW + 600)
    assert (first.lag_seconds, later.lag_seconds) == (60.0, 660.0)


def test_clock_skew_never_gives_negative_lag() -> None:
    reading = compute_lag(applied_through=0, latest_version=1, commit_times={1: NOW + 30}, now=NOW)
    assert reading.lag_seconds == 0.0 and reading.versions_behind == 1


def test_missing_commit_time_of_the_oldest_unapplied_version_is_an_error() -> None:
    with pytest.raises(ValueError, match="commit time of version 11 is needed"):
        compute_lag(applied_through=10, latest_version=12, commit_times={12: NOW}, now=NOW)


# -- offsets ------------------------------------------------------------------------------------

OFFSET = {"sourceVersion": 1, "reservoirId": "3bffe7c2", "reservoirVersion": 8, "index": -1,
          "isStartingVersion": False}


def test_offset_dict_means_every_version_below_is_applied() -> None:
    assert applied_through_from_offset(OFFSET) == 7


def test_offset_mid_version_still_means_the_previous_version() -> None:
    assert applied_through_from_offset({**OFFSET, "reservoirVersion": 8, "index": 3}) == 7


def test_offset_as_json_string() -> None:
    assert applied_through_from_offset(json.dumps(OFFSET)) == 7
    assert applied_through_from_offset('{"reservoirVersion": "12", "index": -1}') == 11


def test_offset_at_version_zero() -> None:
    assert applied_through_from_offset({"reservoirVersion": 0, "index": -1}) == -1


@pytest.mark.parametrize("offset", [None, {}, {"index": 3}, "{}", '{"logOffset": 5}'])
def test_offset_that_cannot_be_told(offset: object) -> None:
    assert applied_through_from_offset(offset) is None  # type: ignore[arg-type]


def test_malformed_json_offset_is_an_error() -> None:
    with pytest.raises(ValueError):
        applied_through_from_offset("{not json")


def test_an_offset_at_its_versions_last_file_has_applied_that_version() -> None:
    from lakemirror.delta_log.stream_offsets import applied_through_from_offset
    # DeltaSource ends a batch that read all of version 3 (one file) at (3, 0), not at (4, -1).
    assert applied_through_from_offset({"reservoirVersion": 3, "index": 0}, files_in_version=1) == 3
    assert applied_through_from_offset({"reservoirVersion": 3, "index": 0}, files_in_version=2) == 2
    assert applied_through_from_offset({"reservoirVersion": 3, "index": 0}) == 2  # unknown: the safe side
    assert applied_through_from_offset({"reservoirVersion": 4, "index": -1}, files_in_version=1) == 3
