"""The recovery point across tables (pure): which replica version of each table shows its source as of
one instant, on hand-made timelines and on a simulated orders-and-lines workload with random batches."""

from __future__ import annotations

import random

import pytest

from lakemirror.supervisor.recovery.recovery_point import (
    NoRecoveryPoint, ReplicaCommit, TableTimeline, intervals, recovery_point,
)


def c(replica: int, first: int, last: int, t_first: float | None, t_last: float, epoch: int = 1) -> ReplicaCommit:
    return ReplicaCommit(replica, first, last, t_first, t_last, epoch)


def test_intervals_run_from_a_batch_to_the_next_change_and_stop_at_a_resync() -> None:
    tl = TableTimeline("t", "dst.s.t", (c(3, 1, 2, 10, 20), c(4, 3, 3, 30, 30), c(6, 5, 7, 50, 70),
                                        c(9, 0, 0, 90, 90, epoch=2)), exact_until=None)
    got = [(i.start, i.end, i.commit.replica_version) for i in intervals(tl)]
    assert got == [(20, 30, 3), (30, 50, 4), (70, None, 6), (90, None, 9)]
    assert [(i.start, i.end) for i in intervals(TableTimeline("t", "r", (c(3, 1, 2, 10, 20),), exact_until=99))] == [(20, 99)]


def test_the_newest_common_instant_and_an_explicit_one() -> None:
    orders = TableTimeline("orders", "dr.s.orders", (c(1, 1, 1, 10, 10), c(2, 2, 4, 20, 40), c(3, 5, 5, 50, 50)),
                           exact_until=60)
    lines = TableTimeline("lines", "dr.s.lines", (c(1, 1, 2, 11, 21), c(2, 3, 3, 31, 31)), exact_until=None)
    # orders is exact on [10, 20), [40, 50), [50, 60); lines on [21, 31) and at 31: never together.
    with pytest.raises(NoRecoveryPoint, match="no instant in common"):
        recovery_point([orders, lines])
    both = recovery_point([orders, TableTimeline("lines", "dr.s.lines", (c(1, 1, 2, 11, 41), c(2, 3, 3, 55, 55)),
                                                 exact_until=70)])
    assert (both.as_of, both.valid_until, both.versions()) == (55, 60, {"orders": 3, "lines": 2})
    explicit = recovery_point([orders, TableTimeline("lines", "l", (c(1, 1, 2, 11, 41), c(2, 3, 3, 55, 55)),
                                                     exact_until=70)], at=52)
    assert (explicit.as_of, explicit.valid_until, explicit.versions()) == (52, 55, {"orders": 3, "lines": 1})


def test_refusals_name_the_table_and_the_reason() -> None:
    a = TableTimeline("a", "ra", (c(1, 1, 3, 10, 30),), exact_until=100)
    b = TableTimeline("b", "rb", (c(1, 1, 1, 20, 20), c(2, 2, 5, 25, 60)), exact_until=None)
    with pytest.raises(NoRecoveryPoint) as caught:
        recovery_point([a, b], at=40)
    assert set(caught.value.reasons) == {"b"} and "several source versions" in caught.value.reasons["b"]
    with pytest.raises(NoRecoveryPoint) as caught:
        recovery_point([a, b], at=5)
    assert "oldest recorded" in caught.value.reasons["a"]
    with pytest.raises(NoRecoveryPoint) as caught:
        recovery_point([a, TableTimeline("empty", "re", ())])
    assert set(caught.value.reasons) == {"empty"}
    with pytest.raises(NoRecoveryPoint, match="anchor 'c'"):
        recovery_point([a, b], anchor="c")


def simulate(rng: random.Random, steps: int) -> tuple[TableTimeline, TableTimeline]:
    """A writer that, per step i, commits order i (time 10i) then its lines (time 10i+3); each replica
    applied a random prefix of its versions in random contiguous batches; the source may or may not be
    reachable to say what is past the newest batch."""
    def timeline(name: str, offset: int) -> TableTimeline:
        applied = rng.randint(1, steps)
        cuts = sorted(rng.sample(range(1, applied), k=rng.randint(0, applied - 1))) + [applied]
        commits, first, version = [], 1, 0
        for last in cuts:
            version += rng.randint(1, 2)  # other replica commits (a schema change) may come between
            commits.append(ReplicaCommit(version, first, last, 10 * first + offset, 10 * last + offset, 1))
            first = last + 1
        reachable = rng.random() < 0.5
        until = (10 * (applied + 1) + offset if applied < steps else 10 * steps + 50) if reachable else None
        return TableTimeline(name, f"dr.s.{name}", tuple(commits), until)
    return timeline("orders", 0), timeline("lines", 3)


def source_steps(offset: int, at: float, steps: int) -> int:
    """How many steps' commits of a table the source had at ``at``."""
    return sum(1 for i in range(1, steps + 1) if 10 * i + offset <= at)


@pytest.mark.parametrize("seed", range(300))
def test_the_cut_shows_each_source_exactly_and_anchored_never_an_order_without_its_lines(seed: int) -> None:
    rng = random.Random(seed)
    steps = rng.randint(1, 25)
    orders, lines = simulate(rng, steps)
    for anchor in (None, "lines"):
        try:
            rp = recovery_point([orders, lines], anchor=anchor)
        except NoRecoveryPoint:
            continue
        got = {t.table: t.source_version for t in rp.tables}
        # Exact: each replica version holds precisely the steps its source had at the cut's instant.
        assert got["orders"] == source_steps(0, rp.as_of, steps)
        assert got["lines"] == source_steps(3, rp.as_of, steps)
        if rp.valid_until is not None:
            before = rp.valid_until - 1e-6
            assert got == {"orders": source_steps(0, before, steps), "lines": source_steps(3, before, steps)}
        if anchor == "lines":
            assert got["orders"] == got["lines"]  # no order without its lines, no lines without their order


def test_a_cut_exists_where_the_latest_versions_disagree() -> None:
    """The failover case the cut exists for: orders ran ahead of lines; their latest replica versions
    show orders 4 and 5 without lines, the cut shows steps 1-3 of both."""
    orders = TableTimeline("orders", "o", (c(1, 1, 3, 10, 30), c(2, 4, 5, 40, 50)), exact_until=1000)
    lines = TableTimeline("lines", "l", (c(1, 1, 2, 13, 23), c(2, 3, 3, 33, 33)), exact_until=43)
    latest = {"orders": 5, "lines": 3}
    rp = recovery_point([orders, lines], anchor="lines")
    assert {t.table: t.source_version for t in rp.tables} == {"orders": 3, "lines": 3} != latest
    assert (rp.as_of, rp.valid_until, rp.versions()) == (33, 40, {"orders": 1, "lines": 2})
