"""The turn chooser (pure) and the turn pool with in-memory runners."""

from __future__ import annotations

import threading
import time

import pytest

from lakemirror.supervisor.apply_workers.worker_pool import Candidate, TurnPool, is_due, next_turn


def test_a_table_never_served_is_due_at_once_whatever_the_check_says() -> None:
    assert is_due(Candidate("a", pending=False), now=0.0, min_interval=5.0)


def test_pending_work_waits_for_the_trigger_interval_since_the_last_turn_began() -> None:
    c = Candidate("a", pending=True, last_started=100.0, last_ended=103.0)
    assert not is_due(c, now=104.9, min_interval=5.0)
    assert is_due(c, now=105.0, min_interval=5.0)


def test_nothing_pending_is_not_due_until_the_idle_recheck() -> None:
    c = Candidate("a", pending=False, last_started=100.0, last_ended=101.0)
    assert not is_due(c, now=129.9, min_interval=1.0, idle_recheck=30.0)
    assert is_due(c, now=130.0, min_interval=1.0, idle_recheck=30.0)


def test_a_table_that_cannot_be_checked_gets_a_turn_every_trigger_interval() -> None:
    c = Candidate("a", pending=None, last_started=100.0, last_ended=100.5)
    assert not is_due(c, now=100.9, min_interval=1.0)
    assert is_due(c, now=101.0, min_interval=1.0)


def test_the_least_recently_served_due_table_goes_first_and_new_tables_before_all() -> None:
    cands = [Candidate("b", True, 45.0, 50.0), Candidate("a", True, 30.0, 35.0), Candidate("c", False, 40.0, 31.0)]
    assert next_turn(cands, now=60.0, min_interval=1.0) == "a"  # c has nothing pending
    assert next_turn([*cands, Candidate("new", None)], now=60.0, min_interval=1.0) == "new"
    assert next_turn([Candidate("c", False, 59.0, 59.5)], now=60.0, min_interval=1.0) is None


def test_round_robin_bounds_the_wait_to_one_turn_of_every_other_table() -> None:
    # Simulate one worker over 4 always-busy tables: each is served exactly once per round.
    served: dict[str, tuple[float, float]] = {}
    order = []
    now = 0.0
    for _ in range(12):
        cands = [Candidate(t, True, *served.get(t, (None, None))) for t in "abcd"]
        table = next_turn(cands, now, min_interval=0.0)
        assert table is not None
        order.append(table)
        served[table] = (now, now + 1.0)
        now += 1.0
    assert order[:4] == ["a", "b", "c", "d"] and order[4:8] == order[:4] and order[8:] == order[:4]


def test_the_lazy_choice_is_the_eager_one_and_asks_only_down_to_it() -> None:
    import random

    rng = random.Random(7)
    for _ in range(500):
        cands = []
        for t in "abcdefgh":
            started = rng.choice([None, rng.uniform(0, 60)])
            ended = None if started is None else started + rng.uniform(0, 3)
            cands.append(Candidate(t, rng.choice([True, False, None]), started, ended))
        now = rng.uniform(55, 70)
        asked: list[str] = []

        def look(c: Candidate) -> bool | None:
            asked.append(c.table)
            return c.pending

        chosen = next_turn(cands, now, 1.0, look=look)
        assert chosen == next_turn(cands, now, 1.0)
        if chosen is not None:
            assert asked[-1] == chosen, "nothing is asked once the choice is made"


def test_tables_behind_the_first_due_one_in_line_are_not_looked_at() -> None:
    """16 tables on one worker that cannot keep up, each with a new commit 3 s after its turn, and
    turns of 0.5 s: a claim asks the table first in line (it has work by then), not the tables that
    have just had their turn and have nothing yet."""
    now = [0.0]

    class Committing(FakeRunner):
        checks = 0
        served_at = 0.0

        def has_pending(self) -> bool | None:
            self.checks += 1
            return now[0] >= self.served_at + 3.0

    tables = [Committing(f"t{i:02d}") for i in range(16)]
    pool = TurnPool(1, lambda: tables, min_interval=1.0, clock=lambda: now[0])
    order = []
    for _ in range(64):
        runner = pool._claim()  # noqa: SLF001
        assert isinstance(runner, Committing)
        order.append(runner.table)
        now[0] += 0.5
        runner.served_at = now[0]
        pool._busy.clear()  # noqa: SLF001
        pool._served[runner.table].ended = now[0]  # noqa: SLF001
    assert order == [t.table for t in tables] * 4, "round robin"
    looks = sum(t.checks for t in tables)
    assert looks == 64, f"one look a claim, not one for every waiting table ({looks})"


class FakeRunner:
    def __init__(self, table: str, pending: bool = True, turn_seconds: float = 0.01) -> None:
        self.table = table
        self.pending = pending
        self.turn_seconds = turn_seconds
        self.turns = 0
        self.ready = True
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()

    def ready_for_turn(self) -> bool:
        return self.ready

    def has_pending(self) -> bool | None:
        return self.pending

    def take_turn(self) -> None:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(self.turn_seconds)
        with self.lock:
            self.active -= 1
            self.turns += 1


def _wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_the_pool_never_gives_one_table_two_turns_at_once_and_serves_every_busy_table() -> None:
    runners = [FakeRunner(t) for t in "abcdef"]
    active_total = []

    def runners_now() -> list[FakeRunner]:
        active_total.append(sum(r.active for r in runners))
        return runners

    pool = TurnPool(2, runners_now, min_interval=0.0, clock=time.monotonic, idle_wait=0.005)
    pool.start()
    try:
        _wait_for(lambda: all(r.turns >= 3 for r in runners))
    finally:
        pool.stop()
    assert max(r.max_active for r in runners) == 1
    assert max(active_total) <= 2  # never more tables applying than workers


def test_a_table_without_work_or_not_ready_gets_no_turn_after_its_first() -> None:
    idle, paused, busy = FakeRunner("idle", pending=False), FakeRunner("paused"), FakeRunner("busy")
    paused.ready = False
    pool = TurnPool(1, lambda: [idle, paused, busy], min_interval=0.0, clock=time.monotonic, idle_wait=0.005)
    pool.start()
    try:
        _wait_for(lambda: busy.turns >= 20)
    finally:
        pool.stop()
    assert idle.turns == 1 and paused.turns == 0


def test_a_runner_raising_does_not_lose_the_worker() -> None:
    class Broken(FakeRunner):
        def take_turn(self) -> None:
            raise RuntimeError("boom")

    broken, fine = Broken("broken"), FakeRunner("fine")
    pool = TurnPool(1, lambda: [broken, fine], min_interval=0.0, clock=time.monotonic, idle_wait=0.005)
    pool.start()
    try:
        _wait_for(lambda: fine.turns >= 5)
    finally:
        pool.stop()


def test_the_log_is_not_checked_for_a_table_that_cannot_be_due_or_is_known_to_have_work() -> None:
    class Counting(FakeRunner):
        checks = 0

        def has_pending(self) -> bool | None:
            self.checks += 1
            return self.pending

    now = [100.0]
    table = Counting("t")
    table.ready = True
    pool = TurnPool(1, lambda: [table], min_interval=5.0, clock=lambda: now[0])
    assert pool._claim() is table and table.checks == 1  # noqa: SLF001 (the chooser, without threads)
    pool._busy.clear()  # noqa: SLF001 (the turn ended)
    now[0] = 102.0
    assert pool._claim() is None and table.checks == 1, "within the trigger interval: no check"  # noqa: SLF001
    table.pending = False
    now[0] = 106.0
    assert pool._claim() is None and table.checks == 2  # noqa: SLF001
    table.pending = True
    now[0] = 107.0
    assert pool._claim() is None and table.checks == 2, "a look that found nothing stands a while"  # noqa: SLF001
    now[0] = 107.25
    assert pool._claim() is table and table.checks == 3  # noqa: SLF001


def test_an_idle_table_is_looked_at_a_few_times_a_turn_interval_and_a_commit_seen_within_a_quarter() -> None:
    class Counting(FakeRunner):
        checks = 0

        def has_pending(self) -> bool | None:
            self.checks += 1
            return self.pending

    now = [0.0]
    table = Counting("t", pending=False)
    pool = TurnPool(1, lambda: [table], min_interval=5.0, clock=lambda: now[0])  # workers look every 0.25 s
    assert pool._claim() is table  # noqa: SLF001 (its first turn, whatever the log says)
    pool._busy.clear()  # noqa: SLF001
    looks = 0
    while now[0] < 25.0:  # idle, within the idle recheck: no turn, a few looks per interval
        now[0] += 0.25
        assert pool._claim() is None  # noqa: SLF001
        looks += 1
    assert looks == 100
    # One look at the first turn, then one every quarter interval (1.25 s) from 5 s to 25 s: 17, where
    # every worker's look asked the log (81).
    assert table.checks == 1 + 17
    table.pending = True  # a commit lands
    landed = now[0]
    while pool._claim() is None:  # noqa: SLF001
        now[0] += 0.25
    assert now[0] - landed <= 5.0 / 4, "seen within a quarter of the turn interval"
    pool._busy.clear()  # noqa: SLF001
    table.pending = False
    now[0] += 5.0
    assert pool._claim() is None  # noqa: SLF001 (a look that finds nothing)
    table.ready = False  # the table's query runs by itself (its turn was withdrawn) ...
    assert pool._claim() is None  # noqa: SLF001
    table.ready, table.pending = True, True  # ... and has planned a batch: looked at at once
    assert pool._claim() is table  # noqa: SLF001


def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        TurnPool(0, list, min_interval=1.0, clock=time.monotonic)


def test_only_sparks_unfinished_temporary_files_are_taken_for_interrupted_writes() -> None:
    from lakemirror.checkpoints.stream_dir import interrupted_writes

    names = ["0", "1", ".0.crc", ".1.0f1e2d3c-4b5a.tmp", "..1.0f1e2d3c-4b5a.tmp.crc", ".2.abc.tmp", "tmp", "3.tmp",
             "3.tmp.crc"]
    assert interrupted_writes(names) == ["..1.0f1e2d3c-4b5a.tmp.crc", ".1.0f1e2d3c-4b5a.tmp", ".2.abc.tmp"]


@pytest.mark.parametrize("rate_limited, proven, small_backlog, once", [
    (False, True, True, True),     # a caught-up table: one micro-batch
    (False, False, True, False),   # the first turn since a launch may meet a backlog: split it
    (True, True, True, False),     # the user's rate limits are honoured
    (False, True, False, False),   # a long way behind: split by the source's admission limits
    (False, True, None, False),    # cannot tell (a table known by name): split
])
def test_only_a_caught_up_table_without_rate_limits_takes_its_turn_as_one_batch(
        rate_limited: bool, proven: bool, small_backlog: bool | None, once: bool) -> None:
    from lakemirror.supervisor.apply_workers.worker_pool import one_batch_turn

    assert one_batch_turn(rate_limited=rate_limited, proven=proven, small_backlog=small_backlog) is once
