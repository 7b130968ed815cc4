"""A change-feed batch that one row poisons, on a real local Spark: the replica (with a CHECK constraint
an operator added) refuses the row, which goes to the dead-letter table; every other change of the
batch applies, and the batch replayed after a crash applies and records nothing twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sinks.merge.row_isolation import FeedDeadLetters, IsolatedOutcome, IsolatingMergeSink
from lakemirror.sinks.txn import TxnId
from lakemirror.tables import TableLocation

pytestmark = pytest.mark.integration


def test_a_row_the_replica_refuses_is_dead_lettered_and_the_rest_applies_once(spark: Any, tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    spark.sql(f"CREATE TABLE delta.`{src}` (id BIGINT, amount DECIMAL(10,2)) USING DELTA "
              f"TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"CREATE TABLE delta.`{dst}` (id BIGINT, amount DECIMAL(10,2)) USING DELTA")
    spark.sql(f"INSERT INTO delta.`{dst}` VALUES (1, 1.00), (2, 2.00)")
    spark.sql(f"ALTER TABLE delta.`{dst}` ADD CONSTRAINT positive CHECK (amount > 0)")
    spark.sql(f"INSERT INTO delta.`{src}` VALUES (1, 1.00), (2, 2.00)")
    spark.sql(f"UPDATE delta.`{src}` SET amount = -2.50 WHERE id = 2")          # refused by the replica
    spark.sql(f"INSERT INTO delta.`{src}` VALUES (3, 3.00)")
    batch = tables.read(spark, TableLocation(TableName("s", "s", "src"), src), readChangeFeed="true",
                        startingVersion="2")
    plan = plan_merge([Column("id", "bigint", False), Column("amount", "decimal(10,2)")], ["id"])
    letters = FeedDeadLetters(TableLocation(TableName("d", "s", "_lakemirror_dead_letters"), str(tmp_path / "dl")), "p")
    sink = IsolatingMergeSink(DeltaMergeSink(TableLocation(TableName("d", "s", "dst"), dst), plan, stable_source=True),
                              letters, "s.s.src", lambda: 1_000.0)
    txn = TxnId("lakemirror/p/s.s.src/0", 5)
    out = sink.apply(batch, txn)
    replica = {r["id"]: str(r["amount"]) for r in spark.read.format("delta").load(dst).collect()}
    assert replica == {1: "1.00", 2: "2.00", 3: "3.00"}          # 3 inserted, 2 left as it was
    assert isinstance(out, IsolatedOutcome) and out.dead_letters == 1 and out.counts.inserted == 1
    [letter] = spark.read.format("delta").load(str(tmp_path / "dl")).collect()
    assert (letter["table"], json.loads(letter["key"]), letter["commit_version"], letter["change_type"]) == \
        ("s.s.src", {"id": 2}, 2, "update_postimage")
    assert json.loads(letter["row"]) == {"id": 2, "amount": -2.5} and "CHECK" in letter["reason"]
    again = sink.apply(batch, txn)                                # the batch replayed after a crash
    assert {r["id"]: str(r["amount"]) for r in spark.read.format("delta").load(dst).collect()} == replica
    assert again.replayed and spark.read.format("delta").load(str(tmp_path / "dl")).count() == 1
