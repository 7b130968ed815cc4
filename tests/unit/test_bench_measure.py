"""bench.measure: outside lag per source commit (pure)."""

from __future__ import annotations

import math

import pytest

from bench.measure import Apply, lags, percentile, summarize


def test_each_commit_is_reflected_by_the_first_later_apply_covering_it() -> None:
    commits = {10: 100.0, 11: 101.0, 12: 102.0}
    applies = [Apply(100.5, 9), Apply(101.5, 11), Apply(104.0, 12)]
    found, missing = lags(commits, applies)
    assert found == {10: 1.5, 11: 0.5, 12: 2.0}
    assert missing == []


def test_an_apply_before_the_commit_does_not_count_and_unapplied_commits_are_reported() -> None:
    found, missing = lags({5: 50.0, 6: 60.0}, [Apply(49.0, 6), Apply(51.0, 5)])
    assert found == {5: 1.0}
    assert missing == [6]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary() -> None:
    s = summarize({1: 0.0, 2: 1.0, 3: 2.0}, [Apply(2.0, 1), Apply(3.0, 3)])
    assert (s.commits, s.unapplied, s.p50, s.max) == (3, 0, 2.0, 2.0)
    assert math.isclose(s.mean, (2.0 + 2.0 + 1.0) / 3)
    empty = summarize({1: 0.0}, [])
    assert empty.unapplied == 1 and math.isnan(empty.p99)


def test_summary_over_tables_pools_their_commits() -> None:
    from bench.measure import summarize_runs

    s = summarize_runs([({1: 0.0}, [Apply(1.0, 1)]), ({1: 0.0, 2: 5.0}, [Apply(3.0, 1)])])
    assert (s.commits, s.unapplied, s.max) == (3, 1, 3.0)


def test_the_outside_lag_at_a_moment_is_the_age_of_the_oldest_commit_not_yet_applied() -> None:
    from bench.measure import lag_at, sampled_lag

    commits = {1: 10.0, 2: 11.0, 3: 12.0}
    applies = [Apply(15.0, 2), Apply(20.0, 3)]
    assert lag_at(commits, applies, 9.0) == 0.0       # nothing made yet
    assert lag_at(commits, applies, 14.0) == 4.0      # 1, 2, 3 pending: 1 is the oldest
    assert lag_at(commits, applies, 16.0) == 4.0      # 1 and 2 applied at 15: 3, made at 12
    assert lag_at(commits, applies, 20.0) == 0.0      # all applied
    # A sawtooth: each commit's own lag averages 3.5 s here, the largest over two tables at a moment more.
    other = ({1: 13.0}, [Apply(19.0, 1)])
    assert sampled_lag([(commits, applies), other], [14.0, 16.0, 18.0]) == [4.0, 4.0, 6.0]
