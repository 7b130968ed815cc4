"""History (SCD type 2), property-style: any permutation, duplication and batching of a history's
events leaves the replica equal to the SCD2 fold of the distinct events ordered by position."""

from __future__ import annotations

import random
from typing import Any

import pytest

from lakemirror.sinks.events.history_plan import (
    Close, HistoryMemoryReplica, Version, fold_versions, history_fold, plan_history, plan_history_batch,
)
from lakemirror.sources.change_event import DELETE, SNAPSHOT, STREAM, TRUNCATE, UPSERT, ChangeEvent, Position

KEYS = ("tenant", "id")


def ev(op: str, key: tuple[Any, ...], lsn: int, phase: int = STREAM, **cols: Any) -> ChangeEvent:
    keys = tuple(zip(KEYS, key)) if op != TRUNCATE else ()
    columns = {**dict(keys), **cols} if op == UPSERT else {}
    return ChangeEvent("t", op, keys, Position(phase, lsn, 7, 0), columns, ts_ms=lsn * 10 + phase)


def history(rng: random.Random, *, truncates: bool) -> list[ChangeEvent]:
    """Snapshot reads, then streamed changes with increasing lsn: updates, deletes, re-inserts, deletes of
    absent rows, primary-key updates (a delete and a create at one lsn) and, optionally, truncates."""
    keys = [(t, i) for t in ("a", None) for i in range(4)]
    events = [ev(UPSERT, k, 1000, SNAPSHOT, v=rng.randint(0, 9)) for k in keys if rng.random() < 0.6]
    lsn = 10
    for _ in range(rng.randint(5, 40)):
        lsn += rng.randint(1, 3)
        roll = rng.random()
        key = rng.choice(keys)
        if truncates and roll < 0.06:
            events.append(ev(TRUNCATE, (), lsn))
        elif roll < 0.30:
            events.append(ev(DELETE, key, lsn))
        elif roll < 0.40:
            new = rng.choice([k for k in keys if k != key])
            events += [ev(DELETE, key, lsn), ev(UPSERT, new, lsn, v=rng.randint(0, 9))]
        else:
            events.append(ev(UPSERT, key, lsn, v=rng.choice([None, rng.randint(0, 9)])))
    return events


def deliver(rng: random.Random, events: list[ChangeEvent]) -> list[list[ChangeEvent]]:
    """Shuffled, some events redelivered (also in later batches), cut into random batches."""
    stream = events + [rng.choice(events) for _ in range(rng.randint(0, len(events)))]
    rng.shuffle(stream)
    batches, i = [], 0
    while i < len(stream):
        n = rng.randint(1, max(1, len(stream) // 3))
        batches.append(stream[i:i + n])
        i += n
    return batches


def replay(batches: list[list[ChangeEvent]], replica: HistoryMemoryReplica | None = None) -> HistoryMemoryReplica:
    replica = replica or HistoryMemoryReplica()
    for n, batch in enumerate(batches):
        plans, refused = plan_history_batch(batch)
        assert not refused
        for plan in plans.values():
            replica.apply(plan_history(plan, replica.read(plan)), now=float(n))
    return replica


def chain(replica: HistoryMemoryReplica, key: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """(start lsn, end lsn or None, v) per version of ``key``."""
    return [(v.start[1], v.end[1] if v.end else None, v.columns.get("v")) for v in replica.rows()[key]]


def assert_well_formed(rows: dict[Any, list[Version]]) -> None:
    for versions in rows.values():
        starts = [v.start for v in versions]
        assert len(starts) == len(set(starts)), "two versions at one position"
        assert sum(v.is_current for v in versions) <= 1
        for a, b in zip(versions, versions[1:]):
            assert a.end is not None and a.end <= b.start, "versions overlap or an older one is current"


@pytest.mark.parametrize("seed", range(400))
def test_any_permutation_duplication_and_batching_folds_to_the_ordered_history(seed: int) -> None:
    rng = random.Random(seed)
    events = history(rng, truncates=seed % 2 == 0)
    want = history_fold(events)
    assert_well_formed(want)
    assert replay(deliver(rng, events)).rows() == want
    assert replay([events]).rows() == want                # one batch
    assert replay([[e] for e in events]).rows() == want   # one event a batch, in order
    assert replay([[e] for e in reversed(events)]).rows() == want   # newest first


@pytest.mark.parametrize("seed", range(100))
def test_a_replayed_history_changes_nothing(seed: int) -> None:
    rng = random.Random(seed)
    events = history(rng, truncates=True)
    replica = replay(deliver(rng, events))
    before = (dict(replica.versions), dict(replica.closes))
    replay(deliver(rng, events), replica)
    assert (replica.versions, replica.closes) == before


def test_the_fold_of_inserts_updates_a_delete_and_a_reinsert() -> None:
    a = ("a", 1)
    replica = replay([[ev(UPSERT, a, 10, v=1)], [ev(UPSERT, a, 20, v=2)], [ev(DELETE, a, 30)],
                      [ev(UPSERT, a, 40, v=4)]])
    assert chain(replica, a) == [(10, 20, 1), (20, 30, 2), (40, None, 4)]
    v = replica.rows()[a]
    assert (v[1].start_ts_ms, v[1].end_ts_ms) == (201, 301) and [x.is_current for x in v] == [False, False, True]


def test_a_late_update_is_inserted_into_the_chain_in_position_order() -> None:
    a = ("a", 1)
    replica = replay([[ev(UPSERT, a, 10, v=1), ev(UPSERT, a, 30, v=3)], [ev(UPSERT, a, 20, v=2)]])
    assert chain(replica, a) == [(10, 20, 1), (20, 30, 2), (30, None, 3)]


def test_a_late_update_before_a_delete_ends_at_the_delete() -> None:
    a = ("a", 1)
    replica = replay([[ev(UPSERT, a, 10, v=1)], [ev(DELETE, a, 30)], [ev(UPSERT, a, 20, v=2)]])
    assert chain(replica, a) == [(10, 20, 1), (20, 30, 2)]


def test_a_delete_before_its_insert_arrives_is_remembered() -> None:
    a = ("a", 1)
    replica = replay([[ev(DELETE, a, 30)], [ev(UPSERT, a, 10, v=1)]])
    assert chain(replica, a) == [(10, 30, 1)]


def test_a_late_older_delete_keeps_the_newer_one_for_a_later_insert() -> None:
    """v[10, 40) closed by a delete at 40; a delete at 20 arrives: v ends at 20 and the delete at 40,
    which ends no version now, is remembered, so an insert at 30 arriving last ends at 40."""
    a = ("a", 1)
    replica = replay([[ev(UPSERT, a, 10, v=1)], [ev(DELETE, a, 40)], [ev(DELETE, a, 20)]])
    assert chain(replica, a) == [(10, 20, 1)]
    assert [c.order[1] for (k, _), (c, _) in replica.closes.items() if k == a] == [40]
    replay([[ev(UPSERT, a, 30, v=3)]], replica)
    assert chain(replica, a) == [(10, 20, 1), (30, 40, 3)]


def test_a_late_truncate_closes_spanning_versions_and_keeps_their_deletes() -> None:
    a, b = ("a", 1), ("a", 2)
    replica = replay([[ev(UPSERT, a, 10, v=1), ev(DELETE, a, 50), ev(UPSERT, b, 10, v=1)], [ev(TRUNCATE, (), 30)]])
    assert chain(replica, a) == [(10, 30, 1)] and chain(replica, b) == [(10, 30, 1)]
    replay([[ev(UPSERT, a, 40, v=4)]], replica)
    assert chain(replica, a) == [(10, 30, 1), (40, 50, 4)]


def test_redeliveries_are_counted_stale_and_write_nothing() -> None:
    a = ("a", 1)
    events = [ev(UPSERT, a, 10, v=1), ev(DELETE, a, 20)]
    replica = replay([events])
    [plan] = plan_history_batch(events)[0].values()
    write = plan_history(plan, replica.read(plan))
    assert write.empty and write.stale == 2


def test_a_snapshot_read_lands_before_every_streamed_change() -> None:
    a = ("a", 1)
    replica = replay([[ev(UPSERT, a, 50, v="streamed")], [ev(UPSERT, a, 9999, SNAPSHOT, v="snap")]])
    assert chain(replica, a) == [(9999, 50, "snap"), (50, None, "streamed")]


def test_one_version_per_order_whatever_the_arrival() -> None:
    x, y = ev(UPSERT, ("a", 1), 10, v="x"), ev(UPSERT, ("a", 1), 10, v="y")
    one, _ = plan_history_batch([x, y])
    other, _ = plan_history_batch([y, x])
    assert one["t"].changes == other["t"].changes and len(one["t"].changes[("a", 1)]) == 1


def test_remembered_deletes_are_purged_past_the_horizon_truncates_stay() -> None:
    replica = replay([[ev(DELETE, ("a", 1), 30), ev(TRUNCATE, (), 40)]])
    assert replica.purge(now=50.0, horizon_seconds=60.0) == 0
    assert replica.purge(now=61.0, horizon_seconds=60.0) == 1
    assert [k for k, _ in replica.closes] == [None]


def test_fold_versions_closes_and_reopens() -> None:
    from lakemirror.sinks.events.history_plan import _Step
    o = lambda n, r: (1, n, 0, 0, r)  # noqa: E731
    got = fold_versions(("k",), [_Step(o(3, 0), False), _Step(o(1, 1), True, {"v": 1}), _Step(o(5, 1), True, {"v": 5}),
                                 _Step(o(4, 0), False)])
    assert [(v.start, v.end) for v in got] == [(o(1, 1), o(3, 0)), (o(5, 1), None)]
    assert Close(None, o(1, 0)).key is None


def apply_crashing(replica: HistoryMemoryReplica, batches: list[list[ChangeEvent]], crash_at: int, point: str) -> None:
    """Apply ``batches`` in the executor's commit order (remembered deletes, the replica's MERGE, new
    truncates), dying at ``point`` of batch ``crash_at``; the replay of that batch finds the commits made
    before the crash already done (Delta skips a commit whose transaction id it has)."""
    from lakemirror.sinks.events.history_plan import HistoryWrite

    for n, batch in enumerate(batches):
        for plan in plan_history_batch(batch)[0].values():
            write = plan_history(plan, replica.read(plan))
            deletes = HistoryWrite(closes=tuple(c for c in write.closes if c.key is not None))
            merge = HistoryWrite(write.inserts, write.updates, (), write.truncates)
            truncates = HistoryWrite(closes=tuple(c for c in write.closes if c.key is None))
            if n != crash_at:
                for part in (deletes, merge, truncates):
                    replica.apply(part, now=float(n))
                continue
            done = {"after_deletes": 1, "after_merge": 2}[point]
            for part in (deletes, merge, truncates)[:done]:
                replica.apply(part, now=float(n))
            again = plan_history(plan, replica.read(plan))   # the replayed batch
            parts = (HistoryWrite(closes=tuple(c for c in again.closes if c.key is not None)),
                     HistoryWrite(again.inserts, again.updates, (), again.truncates),
                     HistoryWrite(closes=tuple(c for c in again.closes if c.key is None)))
            for part in parts[done:]:
                replica.apply(part, now=float(n))


@pytest.mark.parametrize("seed", range(300))
def test_a_crash_between_the_commits_of_a_batch_is_repaired_by_its_replay(seed: int) -> None:
    rng = random.Random(seed)
    events = history(rng, truncates=True)
    batches = deliver(rng, events)
    replica = HistoryMemoryReplica()
    apply_crashing(replica, batches, rng.randrange(len(batches)), rng.choice(["after_deletes", "after_merge"]))
    assert replica.rows() == history_fold(events)
