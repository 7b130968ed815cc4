"""A replica empty at its first batch is applied on the driver, and its path is chosen again once
the batch has given it rows (delta-rs on the driver's disk, no Spark)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.apply_choice import ApplyChoice, choose_apply
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.local_replica import LocalReplica
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sinks.txn import TxnId, run_upkeep
from lakemirror.tables import TableLocation

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
CHANGES = pa.schema([("id", pa.int64()), ("v", pa.string()), ("_change_type", pa.string()),
                     ("_commit_version", pa.int64()), ("_commit_timestamp", pa.timestamp("us", tz="UTC"))])


def inserts(ids: list[int], version: int) -> pa.Table:
    return pa.table({"id": ids, "v": [f"v{i}" for i in ids], "_change_type": ["insert"] * len(ids),
                     "_commit_version": [version] * len(ids),
                     "_commit_timestamp": [datetime.fromtimestamp(version, timezone.utc)] * len(ids)}, schema=CHANGES)


def test_an_empty_replica_takes_the_drivers_merge_and_is_chosen_again_once_it_has_rows(tmp_path: Path) -> None:
    replica = tmp_path / "replica"
    write_deltalake(str(replica), pa.table({"id": pa.array([], pa.int64()), "v": pa.array([], pa.string())},
                                           schema=SCHEMA))
    plan = plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"])
    choices: list[ApplyChoice] = []

    def choose() -> tuple[ApplyChoice, int]:
        local = LocalReplica.open(str(replica))
        assert local is not None
        facts = local.facts(observable=True)
        assert facts is not None
        choices.append(choose_apply(facts, plan.column_names, 64 << 20, driver_apply=True, key_types=["bigint"]))
        return choices[-1], facts.rows

    sink = DeltaMergeSink(TableLocation(TableName("dst", "s", "t"), str(replica)), plan, stable_source=True,
                          choose=choose)
    outcome = sink.apply_changes(inserts([1, 2, 3], 1), TxnId("app", 1), lambda: ApplyCounts())
    assert outcome is not None and outcome.counts.inserted == 3, "the driver applied the first batch"
    run_upkeep(outcome)
    assert [c.provisional for c in choices] == [True, False], "chosen again once the replica had rows"
    assert sink.choice is not None and sink.choice.driver and sink.choice.bytes_per_row > 0
    outcome = sink.apply_changes(inserts([4], 2), TxnId("app", 2), lambda: ApplyCounts())
    assert outcome is not None and len(choices) == 2
    assert sorted(r["id"] for r in DeltaTable(str(replica)).to_pyarrow_table().to_pylist()) == [1, 2, 3, 4]
