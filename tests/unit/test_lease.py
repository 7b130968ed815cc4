"""One writer per pipeline: the lease's policy (pure, on an injected clock), its keeper over the
in-memory twin, and the real folder store, including two processes racing for one lease."""

from __future__ import annotations

import multiprocessing
import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lakemirror.checkpoints.lease import (
    Holder, LeaseHeld, LeasePolicy, LeaseRecord, Standing, Stored, Verdict, judge, record_for, renewal,
)
from lakemirror.checkpoints.lease_store import FileLeaseStore, InMemoryLeaseStore, lease_name
from lakemirror.checkpoints.pipeline_lease import PipelineLease
from lakemirror.daemon.lease import process_alive, process_start, this_process

POLICY = LeasePolicy(ttl_seconds=30.0, renew_seconds=5.0)


def holder(name: str = "a", host: str = "h1", pid: int = 100, **kw: Any) -> Holder:
    return Holder(host=host, pid=pid, token=name, since=1000.0, **kw)


def stored(record: LeaseRecord | None, generation: int = 1, modified_at: float = 1000.0) -> Stored:
    return Stored(record.generation if record else generation, record, modified_at)


def never_asked(h: Holder) -> bool | None:
    raise AssertionError(f"liveness asked of {h}")


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the policy ---------------------------------------------------------------------------------

def test_nobody_holds_a_new_lease() -> None:
    d = judge(None, holder("b"), 1000.0, POLICY, never_asked)
    assert (d.verdict, d.generation) == (Verdict.ACQUIRE, 1)


def test_a_live_lease_of_another_host_is_held_until_it_expires() -> None:
    rec = record_for(holder("a", host="other"), 3, 1000.0, POLICY)
    me = holder("b", host="h1")
    assert judge(stored(rec), me, 1029.9, POLICY, never_asked).verdict is Verdict.HELD
    d = judge(stored(rec), me, 1030.0, POLICY, never_asked)
    assert (d.verdict, d.generation) == (Verdict.TAKE_OVER, 4)
    assert "did not renew it for 30s" in d.reason


def test_a_released_lease_is_free_at_once_and_the_generation_moves_on() -> None:
    rec = replace(record_for(holder("a", host="other"), 7, 1000.0, POLICY), released=True)
    d = judge(stored(rec), holder("b"), 1001.0, POLICY, never_asked)
    assert (d.verdict, d.generation) == (Verdict.ACQUIRE, 8)


def test_same_host_dead_pid_is_taken_over_at_once_a_live_one_is_not() -> None:
    rec = record_for(holder("a", pid=4242), 2, 1000.0, POLICY)
    me = holder("b", pid=5000)
    assert judge(stored(rec), me, 1001.0, POLICY, lambda h: False).verdict is Verdict.TAKE_OVER
    assert judge(stored(rec), me, 1001.0, POLICY, lambda h: True).verdict is Verdict.HELD
    # Liveness that cannot be told counts as alive: never two writers on a guess.
    assert judge(stored(rec), me, 1001.0, POLICY, lambda h: None).verdict is Verdict.HELD


def test_same_host_after_a_reboot_or_an_earlier_process_with_our_pid_is_taken_over() -> None:
    rebooted = record_for(holder("a", pid=7, boot_id="boot-1"), 1, 1000.0, POLICY)
    me = holder("b", pid=7, boot_id="boot-2", process_start="55")
    assert judge(stored(rebooted), me, 1001.0, POLICY, never_asked).verdict is Verdict.TAKE_OVER
    # A container restarted on its pod keeps the host name and often the pid: another start time.
    earlier = record_for(holder("a", pid=7, boot_id="boot-2", process_start="12"), 1, 1000.0, POLICY)
    assert judge(stored(earlier), me, 1001.0, POLICY, never_asked).verdict is Verdict.TAKE_OVER
    # The same process (a second pipeline context in one daemon process) is refused.
    same = record_for(holder("a", pid=7, boot_id="boot-2", process_start="55"), 1, 1000.0, POLICY)
    assert judge(stored(same), me, 1001.0, POLICY, never_asked).verdict is Verdict.HELD


def test_an_unreadable_record_is_held_until_it_is_older_than_the_lifetime() -> None:
    assert judge(Stored(5, None, 1000.0), holder("b"), 1010.0, POLICY, never_asked).verdict is Verdict.HELD
    d = judge(Stored(5, None, 1000.0), holder("b"), 1030.0, POLICY, never_asked)
    assert (d.verdict, d.generation) == (Verdict.TAKE_OVER, 6)


def test_renewal_is_lost_to_a_newer_generation_or_past_expiry() -> None:
    mine = record_for(holder("a"), 2, 1000.0, POLICY)
    assert renewal(stored(mine), mine, 1005.0)[0] is Standing.KEPT
    theirs = record_for(holder("b", host="h2"), 3, 1040.0, POLICY)
    standing, reason = renewal(stored(theirs), mine, 1041.0)
    assert standing is Standing.LOST and "took the lease over" in reason and "host h2" in reason
    # Frozen past its own expiry: lost even if nobody took it yet (someone may be taking it now).
    assert renewal(stored(mine), mine, 1030.0)[0] is Standing.LOST
    # The store could not be read: kept while the record lives.
    assert renewal(None, mine, 1029.0)[0] is Standing.KEPT


def test_the_refusal_is_one_line_naming_the_holder() -> None:
    h = holder("a", host="db-7", pid=31337, url="http://127.0.0.1:9464", config="/etc/lakemirror/p.yaml")
    text = str(LeaseHeld("orders", "/ck/orders/lease", h, 21.4))
    assert "\n" not in text
    for part in ("pipeline orders", "host db-7", "pid 31337", "http://127.0.0.1:9464", "since 1970-01-01 00:16:40 UTC",
                 "/etc/lakemirror/p.yaml", "expires in 21s"):
        assert part in text


def test_a_policy_renewing_slower_than_it_expires_is_refused() -> None:
    with pytest.raises(ValueError):
        LeasePolicy(ttl_seconds=5, renew_seconds=5)


# -- the keeper on the twin ---------------------------------------------------------------------

def keeper(store: Any, name: str, clock: Clock, lost: list[str] | None = None, **kw: Any) -> PipelineLease:
    return PipelineLease("p", [store], holder(name, **kw), POLICY, lambda h: True, clock=clock,
                         on_lost=(lost.append if lost is not None else lambda r: None))


def test_a_second_daemon_is_refused_and_takes_over_once_the_first_is_gone() -> None:
    clock, store = Clock(), InMemoryLeaseStore()
    first = keeper(store, "a", clock, host="h1")
    first.acquire()
    assert first.held
    second = keeper(store, "b", clock, host="h2")
    with pytest.raises(LeaseHeld) as refused:
        second.acquire()
    assert "host h1" in str(refused.value) and "expires in 30s" in str(refused.value)
    clock.now += 20
    assert first.renew(url="http://h1:9464")
    clock.now += 25  # renewed at 1020: still held at 1045
    with pytest.raises(LeaseHeld) as again:
        second.acquire()
    assert "http://h1:9464" in str(again.value)
    clock.now += 10  # 1055 >= 1020 + 30: the first daemon stopped renewing
    second.acquire()
    assert second.held and store.newest() is not None and store.newest().generation == 2  # type: ignore[union-attr]
    assert sorted(store.records) == [2], "older generations are pruned by the new holder"


def test_a_frozen_holder_learns_at_its_next_renewal_that_it_lost_the_lease() -> None:
    clock, store, lost = Clock(), InMemoryLeaseStore(), []  # type: ignore[var-annotated]
    first = keeper(store, "a", clock, lost, host="h1")
    first.acquire()
    clock.now += 31
    keeper(store, "b", clock, host="h2").acquire()
    assert not first.renew()
    assert first.lost is not None and "took the lease over" in first.lost and lost == [first.lost]
    assert not first.held
    first.release()  # must not mark the new holder's lease released
    newest = store.newest()
    assert newest is not None and newest.record is not None and not newest.record.released
    assert newest.record.holder.token == "b"


def test_release_frees_the_lease_for_the_next_daemon_at_once() -> None:
    clock, store = Clock(), InMemoryLeaseStore()
    first = keeper(store, "a", clock, host="h1")
    first.acquire()
    first.release()
    second = keeper(store, "b", clock, host="h2")
    second.acquire()
    assert second.held


def test_a_refused_daemon_releases_the_stores_it_had_taken() -> None:
    clock, folder, bucket = Clock(), InMemoryLeaseStore(), InMemoryLeaseStore()
    other = PipelineLease("p", [bucket], holder("x", host="elsewhere"), POLICY, lambda h: True, clock=clock)
    other.acquire()  # another machine holds the object store's copy
    me = PipelineLease("p", [folder, bucket], holder("a"), POLICY, lambda h: True, clock=clock)
    with pytest.raises(LeaseHeld):
        me.acquire()
    newest = folder.newest()
    assert newest is not None and newest.record is not None and newest.record.released


def test_renewal_failures_keep_the_lease_until_it_expires() -> None:
    clock, lost = Clock(), []  # type: ignore[var-annotated]

    class Flaky(InMemoryLeaseStore):
        failing = False

        def write(self, record: LeaseRecord) -> None:
            if self.failing:
                raise OSError("volume unavailable")
            super().write(record)

    store = Flaky()
    k = keeper(store, "a", clock, lost)
    k.acquire()
    store.failing = True
    clock.now += 10
    assert k.renew()
    clock.now += 19
    assert k.renew()
    clock.now += 1  # 30 s since the last renewal that landed
    assert not k.renew() and "not renewed for 30s" in (k.lost or "")


# -- the folder store ---------------------------------------------------------------------------

def test_file_store_creates_a_generation_only_once(tmp_path: Path) -> None:
    store = FileLeaseStore(tmp_path / "lease")
    rec = record_for(holder("a"), 1, 1000.0, POLICY)
    assert store.create(rec)
    assert not store.create(record_for(holder("b"), 1, 1000.0, POLICY))
    newest = store.newest()
    assert newest is not None and newest.record == rec
    store.write(replace(rec, renewed_at=1005.0, expires_at=1035.0))
    assert store.newest().record.renewed_at == 1005.0  # type: ignore[union-attr]
    assert sorted(os.listdir(tmp_path / "lease")) == [lease_name(1)], "no temporary file is left behind"


def _race(folder: str, name: str, start: Any, out: Any) -> None:
    me = Holder(host=socket.gethostname(), pid=os.getpid(), token=name, since=0.0,
                process_start=process_start(os.getpid()))
    lease = PipelineLease("p", [FileLeaseStore(folder)], me, POLICY, process_alive)
    start.wait()
    try:
        lease.acquire()
        out.put((name, "acquired"))
    except LeaseHeld as exc:
        out.put((name, str(exc)))
    start.wait()  # hold it until both have tried


@pytest.mark.parametrize("rounds", [5])
def test_two_processes_racing_for_one_folder_lease_one_wins(tmp_path: Path, rounds: int) -> None:
    ctx = multiprocessing.get_context("fork")
    for r in range(rounds):
        folder = str(tmp_path / f"round{r}" / "lease")
        start, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(folder, n, start, out)) for n in ("x", "y")]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(60)
        assert sorted(v == "acquired" for v in results.values()) == [False, True], results
        loser = next(v for v in results.values() if v != "acquired")
        assert "is already run by host" in loser and "pid" in loser


def test_a_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(1), ctx.Queue()
    folder = str(tmp_path / "lease")
    p = ctx.Process(target=_race, args=(folder, "gone", start, out))
    p.start()
    assert out.get(timeout=60) == ("gone", "acquired")
    p.join(60)  # it exits holding the lease, as a killed daemon does
    me = this_process()
    lease = PipelineLease("p", [FileLeaseStore(folder)], me, POLICY, process_alive)
    lease.acquire()  # long before the 30 s expiry
    assert lease.held
    lease.release()


def test_process_alive_tells_this_process_from_a_gone_or_reused_pid() -> None:
    me = this_process()
    assert process_alive(me) is True
    assert process_alive(replace(me, process_start="1")) is False  # the pid now belongs to another process
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=os.getpid)
    p.start()
    p.join(60)
    assert process_alive(replace(me, pid=p.pid, process_start=None)) is False


def test_a_killed_holder_not_yet_reaped_is_gone() -> None:
    """A supervisor that restarts the daemon before reaping the killed one: the pid is a zombie."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder_ = Holder(host=socket.gethostname(), pid=child.pid, token="t", since=0.0,
                         process_start=process_start(child.pid))
        assert process_alive(holder_) is True
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(500):
            if (Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split() or ["?"])[0] == "Z":
                break
            import time
            time.sleep(0.01)
        assert process_alive(holder_) is False
    finally:
        child.kill()
        child.wait()
