"""The sequence guard, property-style: any permutation, duplication and batching of a history's
events folds to the replica the ordered history gives, with tombstones and truncates."""

from __future__ import annotations

import random
from typing import Any

import pytest

from lakemirror.sources.change_event import DELETE, SNAPSHOT, STREAM, TRUNCATE, UPSERT, ChangeEvent, Position
from lakemirror.sinks.events.guard_plan import GuardedMemoryReplica, ordered_fold, plan_batch, position_value, row_order

KEYS = ("tenant", "id")


def ev(op: str, key: tuple[Any, ...], lsn: int, phase: int = STREAM, table: str = "t", **cols: Any) -> ChangeEvent:
    keys = tuple(zip(KEYS, key)) if op != TRUNCATE else ()
    columns = {**dict(keys), **cols} if op == UPSERT else {}
    return ChangeEvent(table, op, keys, Position(phase, lsn, 7, 0), columns)


def history(rng: random.Random, *, truncates: bool) -> list[ChangeEvent]:
    """A source's history: snapshot reads, then streamed changes with increasing lsn; composite keys
    with NULLs, deletes, re-inserts, a primary-key update (delete + create at one lsn), truncates."""
    keys = [(t, i) for t in ("a", None) for i in range(4)]
    events = [ev(UPSERT, k, 1000, SNAPSHOT, v=rng.randint(0, 9)) for k in keys if rng.random() < 0.6]
    lsn = 10
    for _ in range(rng.randint(5, 30)):
        lsn += rng.randint(1, 3)
        roll = rng.random()
        key = rng.choice(keys)
        if truncates and roll < 0.05:
            events.append(ev(TRUNCATE, (), lsn))
        elif roll < 0.30:
            events.append(ev(DELETE, key, lsn))
        elif roll < 0.40:  # a primary-key update: delete under the old key, create under the new, one lsn
            new = rng.choice([k for k in keys if k != key])
            events += [ev(DELETE, key, lsn), ev(UPSERT, new, lsn, v=rng.randint(0, 9))]
        else:
            events.append(ev(UPSERT, key, lsn, v=rng.choice([None, rng.randint(0, 9)])))
    return events


def deliver(rng: random.Random, events: list[ChangeEvent]) -> list[list[ChangeEvent]]:
    """Shuffled, some events redelivered, cut into random batches."""
    stream = events + [rng.choice(events) for _ in range(rng.randint(0, len(events)))]
    rng.shuffle(stream)
    batches, i = [], 0
    while i < len(stream):
        n = rng.randint(1, max(1, len(stream) // 2))
        batches.append(stream[i:i + n])
        i += n
    return batches


def replay(batches: list[list[ChangeEvent]]) -> GuardedMemoryReplica:
    replica = GuardedMemoryReplica()
    for n, batch in enumerate(batches):
        plans, refused = plan_batch(batch)
        assert not refused
        for plan in plans.values():
            replica.apply(plan, now=float(n))
    return replica


@pytest.mark.parametrize("seed", range(400))
def test_any_permutation_duplication_and_batching_folds_to_the_ordered_history(seed: int) -> None:
    rng = random.Random(seed)
    events = history(rng, truncates=seed % 2 == 0)
    want = ordered_fold(events)
    assert replay(deliver(rng, events)).live() == want
    assert replay([events]).live() == want           # one batch
    assert replay([[e] for e in events]).live() == want  # one event a batch, in order


def test_a_late_older_insert_does_not_resurrect_a_deleted_row() -> None:
    replica = replay([[ev(UPSERT, ("a", 1), 10, v=1)], [ev(DELETE, ("a", 1), 20)], [ev(UPSERT, ("a", 1), 15, v=2)]])
    assert replica.live() == {}
    assert row_order(position_value(replica.tombstones[("a", 1)].order)) == (STREAM, 20, 7, 0, 0)


def test_a_newer_reinsert_after_a_delete_applies() -> None:
    replica = replay([[ev(DELETE, ("a", 1), 20)], [ev(UPSERT, ("a", 1), 30, v=3)]])
    assert replica.live() == {("a", 1): {"tenant": "a", "id": 1, "v": 3}}


def test_tombstones_are_purged_only_past_the_horizon() -> None:
    replica = GuardedMemoryReplica()
    plans, _ = plan_batch([ev(DELETE, ("a", 1), 20)])
    replica.apply(plans["t"], now=100.0)
    assert replica.purge(now=150.0, horizon_seconds=60.0) == 0
    late, _ = plan_batch([ev(UPSERT, ("a", 1), 15, v=2)])
    assert replica.apply(late["t"], now=150.0).stale == 1
    assert replica.purge(now=161.0, horizon_seconds=60.0) == 1
    replica.apply(late["t"], now=161.0)  # past the horizon the guard has forgotten the delete
    assert ("a", 1) in replica.live()


def test_a_snapshot_read_never_overwrites_a_streamed_change() -> None:
    replica = replay([[ev(UPSERT, ("a", 1), 50, v="streamed")], [ev(UPSERT, ("a", 1), 9999, SNAPSHOT, v="snap")]])
    assert replica.live()[("a", 1)]["v"] == "streamed"


def test_a_truncate_leaves_a_floor_for_late_changes() -> None:
    replica = replay([[ev(UPSERT, ("a", 1), 10, v=1), ev(UPSERT, ("a", 2), 40, v=2)], [ev(TRUNCATE, (), 30)],
                      [ev(UPSERT, ("a", 3), 20, v=3)]])
    assert replica.live() == {("a", 2): {"tenant": "a", "id": 2, "v": 2}}


def test_batch_plan_counts_duplicates_and_superseded_changes() -> None:
    a = ev(UPSERT, ("a", 1), 10, v=1)
    b = ev(UPSERT, ("a", 1), 11, v=2)
    plans, _ = plan_batch([b, a, a, b, ev(UPSERT, ("a", 2), 5)])
    plan = plans["t"]
    assert (plan.events, plan.duplicates, plan.superseded) == (5, 2, 1)
    assert {w.key: w.columns.get("v") for w in plan.winners} == {("a", 1): 2, ("a", 2): None}
    assert plan.column_names() == ("tenant", "id", "v")


def test_events_whose_key_columns_differ_from_the_table_are_refused() -> None:
    odd = ChangeEvent("t", UPSERT, (("id", 1),), Position(STREAM, 3), {"id": 1})
    plans, refused = plan_batch([ev(UPSERT, ("a", 1), 1), odd])
    assert [r[0] for r in refused] == [odd] and "key columns" in refused[0][1]
    assert len(plans["t"].winners) == 1


def test_equal_orders_are_settled_by_content_not_arrival() -> None:
    x, y = ev(UPSERT, ("a", 1), 10, v="x"), ev(UPSERT, ("a", 1), 10, v="y")
    assert plan_batch([x, y])[0]["t"].winners == plan_batch([y, x])[0]["t"].winners
