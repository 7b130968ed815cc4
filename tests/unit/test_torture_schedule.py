"""The crash-torture schedule (tests/torture/harness.py) is pure: check its shape without Spark."""

from __future__ import annotations

from tests.torture.harness import NAMED_POINTS, REPEATABLE_POINTS, schedule


def test_every_named_point_first_then_random_and_later_arrivals() -> None:
    plan = schedule(25, seed=7)
    assert len(plan) == 25
    assert plan[:len(NAMED_POINTS)] == list(NAMED_POINTS)
    rest = plan[len(NAMED_POINTS):]
    assert "random" in rest
    later = [p for p in rest if p != "random"]
    assert later and all(p.split(":")[0] in REPEATABLE_POINTS and int(p.split(":")[1]) >= 2 for p in later)


def test_a_short_run_takes_a_prefix_of_the_named_points_and_is_reproducible() -> None:
    assert schedule(3, seed=1) == list(NAMED_POINTS[:3])
    assert schedule(30, seed=5) == schedule(30, seed=5)
