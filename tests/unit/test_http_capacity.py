"""lakemirror.daemon.http_capacity: which connections are served when the server is full, with an
injected clock and a record of the connections closed."""

from __future__ import annotations

import pytest

from lakemirror.daemon.http_capacity import Capacity


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0  # every event a second later: ages are distinct
        return self.now


def capacity(limit: int = 2, reserve: int = 1) -> tuple[Capacity[str], list[str]]:
    closed: list[str] = []
    return Capacity(limit, reserve, closed.append, clock=Clock()), closed


def test_below_the_limit_every_connection_gets_a_slot() -> None:
    cap, closed = capacity()
    assert [cap.admit("a"), cap.admit("b")] == ["slot", "slot"] and closed == []
    assert cap.counts() == (2, 0, 0)


def test_past_the_limit_the_longest_waiting_connection_gives_way() -> None:
    cap, closed = capacity()
    cap.admit("a")
    cap.admit("b")
    cap.waiting("a")  # a finished a request and waits again: b has waited longer
    assert cap.admit("c") == "slot" and closed == ["b"]
    assert cap.admit("d") == "slot" and closed == ["b", "a"]
    cap.release("a")
    cap.release("b")
    assert cap.counts() == (2, 0, 0)


def test_a_busy_connection_is_never_taken() -> None:
    cap, closed = capacity()
    cap.admit("a")
    cap.admit("b")
    cap.busy("a")
    assert cap.admit("c") == "slot" and closed == ["b"]
    cap.busy("c")
    assert cap.admit("probe") == "reserve" and not cap.reserved("c") and cap.reserved("probe")
    assert cap.counts() == (2, 2, 1)


def test_the_reserve_gives_way_too_and_only_busy_everywhere_is_refused() -> None:
    cap, closed = capacity(limit=1, reserve=1)
    cap.admit("a")
    cap.busy("a")
    assert cap.admit("r1") == "reserve"
    assert cap.admit("r2") == "reserve" and closed == ["r1"]  # a stalled probe slot gives way
    cap.busy("r2")
    assert cap.admit("x") is None and closed == ["r1"]
    cap.waiting("a")
    assert cap.admit("y") == "slot" and closed == ["r1", "a"]


def test_bounds() -> None:
    with pytest.raises(ValueError):
        Capacity(0, 1, lambda c: None)
    cap: Capacity[str] = Capacity(1, 0, lambda c: None)
    cap.admit("a")
    cap.busy("a")
    assert cap.admit("b") is None
