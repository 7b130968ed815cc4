"""lakemirror.sinks.memory: latest_per_key and the InMemoryReplica (the apply-semantics oracle)."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.schema import Column
from lakemirror.sinks.memory import ApplyCounts, InMemoryReplica, latest_per_key
from lakemirror.sinks.merge.planner import ColumnSelection, plan_merge

COLS = (Column("id", "int", False), Column("name", "string"), Column("score", "int"))
PLAN = plan_merge(COLS, ["id"])


def ch(op: str, version: int, **values: Any) -> dict[str, Any]:
    return {"_change_type": op, "_commit_version": version, "_commit_timestamp": 1000.0 + version, **values}


def replica_with(*rows: dict[str, Any]) -> InMemoryReplica:
    rep = InMemoryReplica(PLAN)
    rep.apply([ch("insert", 0, **r) for r in rows])
    return rep


def test_inserts() -> None:
    rep = InMemoryReplica(PLAN)
    counts = rep.apply([ch("insert", 1, id=1, name="a", score=10), ch("insert", 1, id=2, name="b", score=None)])
    assert counts == ApplyCounts(inserted=2)
    assert counts.total == 2
    assert rep.rows == {(1,): {"id": 1, "name": "a", "score": 10}, (2,): {"id": 2, "name": "b", "score": None}}


def test_update_applies_postimage_and_ignores_preimage() -> None:
    rep = replica_with({"id": 1, "name": "a", "score": 10})
    counts = rep.apply([ch("update_preimage", 2, id=1, name="a", score=10),
                        ch("update_postimage", 2, id=1, name="a2", score=None)])
    assert counts == ApplyCounts(updated=1)
    assert rep.rows == {(1,): {"id": 1, "name": "a2", "score": None}}


def test_update_preimage_alone_changes_nothing() -> None:
    rep = replica_with({"id": 1, "name": "a", "score": 10})
    # a preimage carrying different values (or an unknown key) must never be written
    counts = rep.apply([ch("update_preimage", 3, id=1, name="OLD", score=0),
                        ch("update_preimage", 3, id=9, name="ghost", score=0)])
    assert counts == ApplyCounts()
    assert rep.rows == {(1,): {"id": 1, "name": "a", "score": 10}}


def test_delete_existing_and_missing_key() -> None:
    rep = replica_with({"id": 1, "name": "a", "score": 10}, {"id": 2, "name": "b", "score": 20})
    counts = rep.apply([ch("delete", 2, id=1, name="a", score=10), ch("delete", 2, id=7, name="x", score=0)])
    assert counts == ApplyCounts(deleted=1)
    assert rep.rows == {(2,): {"id": 2, "name": "b", "score": 20}}


def test_delete_then_reinsert_across_versions_in_one_batch() -> None:
    rep = replica_with({"id": 1, "name": "a", "score": 10})
    counts = rep.apply([ch("insert", 4, id=1, name="again", score=2),   # rows arrive out of order
                        ch("delete", 3, id=1, name="a", score=10)])
    assert counts == ApplyCounts(updated=1)
    assert rep.rows == {(1,): {"id": 1, "name": "again", "score": 2}}


def test_insert_then_delete_across_versions_leaves_nothing() -> None:
    rep = InMemoryReplica(PLAN)
    counts = rep.apply([ch("delete", 6, id=5, name="n", score=1), ch("insert", 5, id=5, name="n", score=1)])
    assert counts == ApplyCounts()
    assert rep.rows == {}


@pytest.mark.parametrize("order", ["delete-first", "insert-first"])
def test_delete_and_insert_in_one_version_insert_wins(order: str) -> None:
    rep = replica_with({"id": 1, "name": "old", "score": 1})
    rows = [ch("delete", 7, id=1, name="old", score=1), ch("insert", 7, id=1, name="new", score=2)]
    if order == "insert-first":
        rows.reverse()
    assert rep.apply(rows) == ApplyCounts(updated=1)
    assert rep.rows == {(1,): {"id": 1, "name": "new", "score": 2}}


def test_several_versions_per_batch_highest_wins() -> None:
    rep = InMemoryReplica(PLAN)
    rows = [ch("insert", 1, id=1, name="v1", score=1),
            ch("update_preimage", 2, id=1, name="v1", score=1), ch("update_postimage", 2, id=1, name="v2", score=2),
            ch("update_preimage", 3, id=1, name="v2", score=2), ch("update_postimage", 3, id=1, name="v3", score=3),
            ch("insert", 2, id=2, name="x", score=0)]
    assert rep.apply(list(reversed(rows))) == ApplyCounts(inserted=2)
    assert rep.rows == {(1,): {"id": 1, "name": "v3", "score": 3}, (2,): {"id": 2, "name": "x", "score": 0}}


def test_composite_keys_with_a_null_part() -> None:
    plan = plan_merge((Column("a", "int", False), Column("b", "string"), Column("v", "int")), ["a", "b"])
    rep = InMemoryReplica(plan)
    rep.apply([ch("insert", 1, a=1, b="x", v=1), ch("insert", 1, a=1, b=None, v=2), ch("insert", 1, a=2, b="x", v=3)])
    rep.apply([ch("delete", 2, a=1, b=None, v=2), ch("update_postimage", 2, a=1, b="x", v=10)])
    assert rep.rows == {(1, "x"): {"a": 1, "b": "x", "v": 10}, (2, "x"): {"a": 2, "b": "x", "v": 3}}


def test_excluded_columns_and_cdf_metadata_are_not_stored() -> None:
    plan = plan_merge(COLS, ["id"], ColumnSelection(exclude=("score",)))
    rep = InMemoryReplica(plan)
    rep.apply([ch("insert", 1, id=1, name="a", score=99)])
    assert rep.rows == {(1,): {"id": 1, "name": "a"}}


def test_latest_per_key_picks_winners() -> None:
    rows = [ch("insert", 1, id=1, name="a", score=1), ch("delete", 2, id=1, name="a", score=1),
            ch("update_preimage", 3, id=2, name="p", score=0), ch("update_postimage", 3, id=2, name="q", score=0)]
    winners = latest_per_key(PLAN, rows)
    assert winners == {(1,): rows[1], (2,): rows[3]}


def test_unknown_change_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown change type 'upsert'"):
        latest_per_key(PLAN, [ch("upsert", 1, id=1, name="a", score=1)])


# -- replay (Delta transaction ids) ---------------------------------------------------------------

def test_replayed_batch_is_skipped() -> None:
    rep = InMemoryReplica(PLAN)
    assert rep.apply([ch("insert", 1, id=1, name="a", score=1)], app_id="app", batch_id=0) == ApplyCounts(inserted=1)
    assert rep.apply([ch("insert", 2, id=2, name="b", score=1)], app_id="app", batch_id=1) == ApplyCounts(inserted=1)
    # replaying batch 1 and an older batch 0 with different content: both skipped
    assert rep.apply([ch("delete", 2, id=2, name="b", score=1)], app_id="app", batch_id=1) == ApplyCounts()
    assert rep.apply([ch("delete", 1, id=1, name="a", score=1)], app_id="app", batch_id=0) == ApplyCounts()
    assert set(rep.rows) == {(1,), (2,)}
    assert rep.txn_versions == {"app": 1}


def test_new_app_id_starts_from_batch_zero() -> None:
    rep = InMemoryReplica(PLAN)
    rep.apply([ch("insert", 1, id=1, name="a", score=1)], app_id="pipe/t/e1", batch_id=5)
    counts = rep.apply([ch("insert", 9, id=2, name="b", score=2)], app_id="pipe/t/e2", batch_id=0)
    assert counts == ApplyCounts(inserted=1)
    assert rep.txn_versions == {"pipe/t/e1": 5, "pipe/t/e2": 0}


def test_without_a_txn_id_nothing_is_skipped() -> None:
    rep = InMemoryReplica(PLAN)
    rep.apply([ch("insert", 1, id=1, name="a", score=1)])
    assert rep.apply([ch("delete", 2, id=1, name="a", score=1)]) == ApplyCounts(deleted=1)
    assert rep.txn_versions == {}


def test_failed_batch_is_not_recorded_as_applied() -> None:
    rep = InMemoryReplica(PLAN)
    with pytest.raises(ValueError):
        rep.apply([ch("bogus", 1, id=1, name="a", score=1)], app_id="app", batch_id=0)
    assert rep.apply([ch("insert", 1, id=1, name="a", score=1)], app_id="app", batch_id=0) == ApplyCounts(inserted=1)
