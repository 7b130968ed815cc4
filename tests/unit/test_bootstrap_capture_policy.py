"""When a bootstrapping table captures its change feed, and whether its source's change window is long
enough (sinks/batch/capture_policy.py): pure, with an injected clock.

The simulations replay the case that used to loop: a source keeping its change feed for 60 s and
written every 2 s, whose bootstrap pinned, planned and copied its first chunk for longer than the
window, so its first catch-up between chunks was refused, again and again after each resync. The
capture runs beside planning and copying, so the only time that matters is a capture's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from lakemirror.sinks.batch.bootstrap_plan import BootstrapPolicy
from lakemirror.sinks.batch.capture_policy import (
    copy_budget_used, duration_text, interval_text, needed_window_seconds, next_capture, poll_seconds, window_at_risk,
)

POLICY = BootstrapPolicy()  # a quarter of the window, safety factor 2


def step(**kw):  # type: ignore[no-untyped-def]
    args = dict(now=1000.0, window_seconds=60.0, captured_through=10, latest_version=12, oldest_pending_at=995.0,
                capture_seconds=2.0)
    args.update(kw)
    return next_capture(POLICY, **args)  # type: ignore[arg-type]


def test_nothing_to_capture_waits_a_poll_and_a_fresh_change_waits_until_it_is_due():
    idle = step(latest_version=10)
    assert not idle.capture and idle.wait_seconds == poll_seconds(POLICY, 60.0) == 7.5
    fresh = step(oldest_pending_at=999.0)  # 1 s old; due at 15 s (a quarter of 60 s)
    assert not fresh.capture and fresh.wait_seconds == 7.5
    soon = step(oldest_pending_at=990.0)   # 10 s old: due in 5 s, sooner than the next poll
    assert not soon.capture and soon.wait_seconds == 5.0


def test_a_change_that_has_used_its_share_of_the_window_is_captured():
    due = step(oldest_pending_at=985.0)
    assert due.capture and not due.urgent and "15s old" in due.reason


def test_a_window_closing_within_the_safety_factor_of_a_capture_is_captured_at_once_and_said():
    urgent = step(oldest_pending_at=999.0, window_seconds=10.0, capture_seconds=5.0)  # 9 s left < 2 x 5 s
    assert urgent.capture and urgent.urgent and "closes in 9s" in urgent.reason
    unknown = step(oldest_pending_at=None)  # the log no longer gives the commit's time: at once
    assert unknown.capture and unknown.urgent


def test_the_poll_follows_the_window_within_bounds_unless_set():
    assert poll_seconds(POLICY, 7 * 86400.0) == 60.0
    assert poll_seconds(POLICY, 2.0) == 0.5
    assert poll_seconds(BootstrapPolicy(capture_poll_seconds=0.1), 86400.0) == 0.1


def test_the_retention_a_bootstrap_needs_is_measured_and_rounded_for_a_person():
    assert not window_at_risk(POLICY, 60.0, 22.5)
    assert window_at_risk(POLICY, 60.0, 40.0)
    assert needed_window_seconds(POLICY, 40.0) == 80.0
    assert needed_window_seconds(POLICY, 41.0) == 90.0   # 10 s steps up to two minutes
    assert needed_window_seconds(POLICY, 61.0) == 180.0  # whole minutes up to two hours
    assert needed_window_seconds(POLICY, 7225.0) == 5 * 3600.0  # whole hours above
    assert needed_window_seconds(POLICY, 0.0) == 10.0
    assert interval_text(180.0) == "interval 3 minutes" and interval_text(90.0) == "interval 90 seconds"
    assert interval_text(7200.0) == "interval 2 hours" and duration_text(60.0) == "1 minute"


def test_a_copying_budget_adds_captures_between_chunks_only_when_set():
    assert not copy_budget_used(POLICY, now=1e9, since=0.0)
    budget = BootstrapPolicy(chunk_budget_seconds=30.0)
    assert not copy_budget_used(budget, now=129.0, since=100.0)
    assert copy_budget_used(budget, now=130.0, since=100.0)


# -- the case that used to loop, replayed --------------------------------------------------------------


@dataclass
class Source:
    """A source committing a version every ``every`` seconds from t=0 (version 0, the pin) on."""

    every: float = 2.0

    def latest(self, now: float) -> int:
        return int(now // self.every)

    def committed_at(self, version: int) -> float:
        return version * self.every


@dataclass
class Replay:
    """The capturer's loop over simulated time: each look at the log and each capture take time;
    Delta refuses a capture whose first version is older than the window when it begins."""

    window: float
    capture_seconds: float
    source: Source = field(default_factory=Source)
    look_seconds: float = 0.2
    policy: BootstrapPolicy = POLICY
    captured: int = 0
    refused_at: float | None = None
    ages: list[float] = field(default_factory=list)

    def run(self, until: float) -> "Replay":
        now = 0.0 + poll_seconds(self.policy, self.window)  # a fresh epoch looks after one poll
        slowest = 0.0
        while now < until:
            now += self.look_seconds
            latest = self.source.latest(now)
            pending = self.source.committed_at(self.captured + 1) if latest > self.captured else None
            s = next_capture(self.policy, now=now, window_seconds=self.window, captured_through=self.captured,
                             latest_version=latest, oldest_pending_at=pending, capture_seconds=slowest)
            if not s.capture:
                now += s.wait_seconds
                continue
            assert pending is not None
            age = now - pending
            if age >= self.window:
                self.refused_at = now
                return self
            self.ages.append(age)
            self.captured = latest
            now += self.capture_seconds
            slowest = max(slowest, self.capture_seconds)
        return self


def test_a_60s_window_written_every_2s_is_kept_however_long_planning_and_the_first_chunk_take():
    """Planning and the first chunk took longer than the window; the capture never waits for them.
    Over ten minutes every change is captured long before the window closes, with no warning."""
    replay = Replay(window=60.0, capture_seconds=3.0).run(until=600.0)
    assert replay.refused_at is None
    assert replay.captured >= Source().latest(600.0) - 15, "the capture keeps up with the source"
    assert max(replay.ages) < 30.0 and not window_at_risk(POLICY, 60.0, max(replay.ages))
    # What copying first and catching up after would have met: planning (30 s) plus a first chunk
    # (90 s) leave the oldest change 118 s old when the first catch-up begins, past the window.
    assert 30.0 + 90.0 - Source().committed_at(1) >= 60.0


def test_captures_slower_than_half_the_window_are_reported_with_the_retention_they_need():
    replay = Replay(window=60.0, capture_seconds=40.0).run(until=600.0)
    assert replay.refused_at is None, "still converging, but without the margin"
    oldest = max(replay.ages)
    assert window_at_risk(POLICY, 60.0, oldest)
    assert needed_window_seconds(POLICY, oldest) >= 80.0
    assert not window_at_risk(POLICY, needed_window_seconds(POLICY, oldest), oldest), "the advice is enough"


def test_a_window_shorter_than_one_capture_cannot_converge():
    replay = Replay(window=20.0, capture_seconds=25.0).run(until=600.0)
    assert replay.refused_at is not None


@pytest.mark.parametrize("window", [10.0, 20.0, 60.0, 3600.0])
def test_any_window_a_few_captures_long_converges(window):
    replay = Replay(window=window, capture_seconds=window / 5).run(until=20 * window)
    assert replay.refused_at is None and not window_at_risk(POLICY, window, max(replay.ages, default=0.0))
