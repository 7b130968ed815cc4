"""Group commit: every item written exactly once, callers return only after their item is
written, concurrent callers share writes, and a failed write reaches every caller it carried."""

from __future__ import annotations

import threading
import time

import pytest

from lakemirror.checkpoints.group_commit import GroupCommit


def test_a_lone_caller_writes_its_item_itself() -> None:
    written: list[list[int]] = []
    group = GroupCommit(written.append)
    group.submit(1)
    group.submit(2)
    assert written == [[1], [2]]


def test_callers_arriving_during_a_write_share_the_next_one_and_return_after_it() -> None:
    written: list[list[int]] = []
    first_write_started, release_first = threading.Event(), threading.Event()
    durable: set[int] = set()

    def write(items: list[int]) -> None:
        if not written:
            first_write_started.set()
            assert release_first.wait(10)
        time.sleep(0.01)
        written.append(sorted(items))
        durable.update(items)

    group = GroupCommit(write)
    returned_before_durable: list[int] = []

    def submit(i: int) -> None:
        group.submit(i)
        if i not in durable:
            returned_before_durable.append(i)

    leader = threading.Thread(target=submit, args=(0,))
    leader.start()
    assert first_write_started.wait(10)
    followers = [threading.Thread(target=submit, args=(i,)) for i in range(1, 9)]
    for t in followers:
        t.start()
    time.sleep(0.2)  # every follower is queued behind the first write
    release_first.set()
    for t in [leader, *followers]:
        t.join(10)
    assert written == [[0], list(range(1, 9))]
    assert group.group_sizes == [1, 8]
    assert returned_before_durable == []


def test_a_failed_write_raises_in_every_caller_it_carried_and_the_next_write_proceeds() -> None:
    calls: list[list[str]] = []
    gate = threading.Event()

    def write(items: list[str]) -> None:
        calls.append(items)
        if len(calls) == 1:
            assert gate.wait(10)
        if len(calls) == 2:
            raise OSError("disk full")

    group = GroupCommit(write)
    errors: dict[str, BaseException | None] = {}

    def submit(item: str) -> None:
        try:
            group.submit(item)
            errors[item] = None
        except OSError as exc:
            errors[item] = exc

    threads = [threading.Thread(target=submit, args=("a",))]
    threads[0].start()
    time.sleep(0.1)
    threads += [threading.Thread(target=submit, args=(x,)) for x in ("b", "c")]
    for t in threads[1:]:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(10)
    assert errors["a"] is None
    assert isinstance(errors["b"], OSError) and isinstance(errors["c"], OSError)
    group.submit("d")
    assert calls[-1] == ["d"]


@pytest.mark.parametrize("threads", [2, 16])
def test_many_threads_every_item_written_exactly_once(threads: int) -> None:
    written: list[int] = []
    lock = threading.Lock()

    def write(items: list[int]) -> None:
        time.sleep(0.002)
        with lock:
            written.extend(items)

    group = GroupCommit(write)
    workers = [threading.Thread(target=lambda k=k: [group.submit(k * 100 + i) for i in range(50)])
               for k in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(30)
    assert sorted(written) == sorted(k * 100 + i for k in range(threads) for i in range(50))
    assert sum(group.group_sizes) == threads * 50
