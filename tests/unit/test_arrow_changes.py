"""The driver path's winning change per key (Arrow, no Spark) gives the planner's answer: checked
against the in-memory twin on the random histories of the property test, composite NULL keys and
overwrites (a delete and a re-insert of one key in one version) included."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from lakemirror.schema import Column
from lakemirror.sinks.accelerator.arrow_changes import batch_stats, winning_changes
from lakemirror.sinks.memory import latest_per_key
from lakemirror.sinks.merge.planner import OP_COLUMN, plan_merge

from test_memory_replica_property import cut_into_batches, simulate

SCHEMA = pa.schema([("id", pa.int32()), ("part", pa.string()), ("name", pa.string()), ("score", pa.int32()),
                    ("_change_type", pa.string()), ("_commit_version", pa.int64()),
                    ("_commit_timestamp", pa.timestamp("us", tz="UTC"))])


def _arrow(rows: list[dict]) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in SCHEMA}
    cols["_commit_timestamp"] = [datetime.fromtimestamp(t, timezone.utc) for t in cols["_commit_timestamp"]]
    return pa.table(cols, schema=SCHEMA)


@pytest.mark.parametrize("seed", range(30))
def test_the_winning_change_per_key_is_the_planners(seed: int) -> None:
    rng = random.Random(seed)
    keys = ("id",) if seed % 2 == 0 else ("id", "part")
    columns = [Column("id", "int", nullable=False), Column("part", "string"), Column("name", "string"),
               Column("score", "int")]
    plan = plan_merge(columns, keys)
    versions, _ = simulate(rng, keys, commits=rng.randint(5, 40))
    for batch in cut_into_batches(rng, len(versions)):
        rows = [r for v in batch for r in versions[v - 1]]
        rows = [{"part": None, **r} for r in rows]
        rng.shuffle(rows)
        expected = {k: ({c: r.get(c) for c in plan.column_names}, r["_change_type"])
                    for k, r in latest_per_key(plan, rows).items()}
        got = winning_changes(_arrow(rows), plan.keys, plan.column_names).to_pylist()
        assert {tuple(r[k] for k in keys): ({c: r[c] for c in plan.column_names}, r[OP_COLUMN]) for r in got} \
            == expected, f"seed {seed}, versions {list(batch)}"
        assert len(got) == len(expected), "one row per key"


def test_a_delete_then_reinsert_in_one_version_leaves_the_insert_and_null_keys_group_together() -> None:
    rows = [
        {"id": 1, "part": None, "name": "new", "score": 2, "_change_type": "insert", "_commit_version": 7,
         "_commit_timestamp": 70.0},
        {"id": 1, "part": None, "name": "old", "score": 1, "_change_type": "delete", "_commit_version": 7,
         "_commit_timestamp": 70.0},
        {"id": 1, "part": "x", "name": "pre", "score": 0, "_change_type": "update_preimage", "_commit_version": 8,
         "_commit_timestamp": 80.0},
        {"id": 1, "part": "x", "name": "post", "score": 5, "_change_type": "update_postimage", "_commit_version": 8,
         "_commit_timestamp": 80.0},
    ]
    got = winning_changes(_arrow(rows), ("id", "part"), ("id", "part", "name", "score")).sort_by("name").to_pylist()
    assert got == [{"id": 1, "part": None, "name": "new", "score": 2, OP_COLUMN: "insert"},
                   {"id": 1, "part": "x", "name": "post", "score": 5, OP_COLUMN: "update_postimage"}]
    stats = batch_stats(_arrow(rows))
    assert (stats.rows_read, stats.first_version, stats.last_version, stats.max_commit_time) == (4, 7, 8, 80.0)
    assert stats.min_commit_time == 70.0  # the first version's commit time, for recovery points


def test_an_empty_batch_has_no_winners_and_no_versions() -> None:
    empty = _arrow([])
    assert winning_changes(empty, ("id",), ("id", "name")).num_rows == 0
    assert batch_stats(empty).rows_read == 0 and batch_stats(empty).first_version is None


@pytest.mark.parametrize("seed", range(10))
def test_a_batch_read_without_its_preimages_reports_the_change_feeds_own_statistics(seed: int) -> None:
    rng = random.Random(seed)
    versions, _ = simulate(rng, ("id",), commits=rng.randint(5, 30))
    rows = [{"part": None, **r} for v in versions for r in v]
    without = [r for r in rows if r["_change_type"] != "update_preimage"]
    assert len(without) < len(rows) or not any(r["_change_type"] == "update_postimage" for r in rows)
    assert batch_stats(_arrow(without), preimages_dropped=True) == batch_stats(_arrow(rows))
    assert winning_changes(_arrow(without), ("id",), ("id", "name")).sort_by("id").to_pylist() == \
        winning_changes(_arrow(rows), ("id",), ("id", "name")).sort_by("id").to_pylist()
