"""supervisor.change_feed.launch_slots: a few launches at once; a bootstrap gives its slot back while it copies."""

from __future__ import annotations

import threading
import time

import pytest

from lakemirror.supervisor.change_feed.launch_slots import LaunchSlots, default_launch_slots


def test_no_more_launches_than_slots_hold_one_at_once() -> None:
    slots = LaunchSlots(2)
    inside, most, lock = [0], [0], threading.Lock()

    def launch() -> None:
        with slots.held():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=launch) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == 2 and inside[0] == 0


def test_a_bootstrap_gives_its_slot_to_another_launch_and_takes_one_again() -> None:
    slots = LaunchSlots(1)
    copying, other_done, back = threading.Event(), threading.Event(), threading.Event()

    def bootstrapping() -> None:
        with slots.held():
            with slots.given_back():
                copying.set()
                assert other_done.wait(10), "another launch ran while this one copied"
            back.set()

    first = threading.Thread(target=bootstrapping)
    first.start()
    assert copying.wait(10)
    with slots.held():  # the only slot, free while the first copies
        other_done.set()
    first.join(10)
    assert back.is_set()
    with slots.held():  # and given back at the end
        pass


def test_slots_by_default_and_at_least_one() -> None:
    assert default_launch_slots(2) == 4 and default_launch_slots(1) == 4 and default_launch_slots(16) == 32
    with pytest.raises(ValueError, match="at least one slot"):
        LaunchSlots(0)
