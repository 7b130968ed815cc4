"""A change-feed table's dead letters on a real local Spark: a CHECK constraint on the replica
dead-letters two changes (one of a key with a NULL part); one is skipped (nothing written), the other
replayed while the constraint still refuses it (it stays pending, with the new reason), then after the
operator fixed the constraint, by a run that crashes between the replica's commit and the letters'
update and a repeat that Delta skips; the skipped one is replayed too, and the replica equals its
source row for row. The state at the applied version derived from the change feed (when that version's
snapshot is gone) equals the snapshot's."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.events.dead_letters import PENDING, REPLAYED, SKIPPED
from lakemirror.sinks.merge import letter_replay as lr
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.feed_letters import FeedDeadLetters
from lakemirror.sinks.merge.feed_replay import ReplayTarget, key_frame, replay_keys, states_at
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sinks.merge.row_isolation import IsolatingMergeSink
from lakemirror.sinks.txn import TxnId
from lakemirror.supervisor.change_feed.dead_letters import FeedLetterDesk
from lakemirror.tables import TableLocation

pytestmark = pytest.mark.integration


class Orders:
    """The table as the desk sees it (what TableRunner.between_batches gives): its batch lock and the
    replay's target, applied through version 4."""

    letter_label = "s.sales.orders"

    def __init__(self, target: ReplayTarget) -> None:
        self.target = target
        self.lock = threading.Lock()

    @contextmanager
    def between_batches(self) -> Iterator[ReplayTarget]:
        with self.lock:
            yield self.target


def rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted(((r["region"], r["id"], str(r["amount"])) for r in spark.read.format("delta").load(path).collect()),
                  key=lambda t: (t[1], t[0] or ""))


def test_a_refused_change_is_skipped_or_replayed_exactly_once_and_the_replica_equals_its_source(
        spark: Any, tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    source, replica = TableLocation(TableName("s", "sales", "orders"), src), TableLocation(TableName("d", "sales", "orders"), dst)
    ddl = "region STRING, id BIGINT, amount DECIMAL(10,2)"
    spark.sql(f"CREATE TABLE delta.`{src}` ({ddl}) USING DELTA TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"CREATE TABLE delta.`{dst}` ({ddl}) USING DELTA")
    for path in (src, dst):                                                  # source v1, and the replica's bootstrap
        spark.sql(f"INSERT INTO delta.`{path}` VALUES ('eu', 1, 1.00), (NULL, 2, 2.00), ('us', 3, 3.00)")
    spark.sql(f"ALTER TABLE delta.`{dst}` ADD CONSTRAINT positive CHECK (amount > 0)")
    spark.sql(f"UPDATE delta.`{src}` SET amount = -2.50 WHERE id = 2")      # v2: refused by the replica
    spark.sql(f"UPDATE delta.`{src}` SET amount = -3.00 WHERE id = 3")      # v3: refused by the replica
    spark.sql(f"INSERT INTO delta.`{src}` VALUES ('eu', 4, 4.00)")          # v4

    plan = plan_merge([Column("region", "string"), Column("id", "bigint"), Column("amount", "decimal(10,2)")],
                      ["region", "id"])
    store = FeedDeadLetters(TableLocation(TableName("d", "sales", "_lakemirror_dead_letters"), str(tmp_path / "dl")), "p")
    target = ReplayTarget("s.sales.orders", source, replica, plan, 4, "lakemirror/p/orders/e0")
    orders = Orders(target)
    desk = FeedLetterDesk(store, lambda: {"orders": orders}, lambda: spark, clock=lambda: 2_000.0)
    sink = IsolatingMergeSink(DeltaMergeSink(replica, plan, stable_source=True), store, "s.sales.orders",
                              lambda: 1_000.0, on_letters=desk.recorded)
    sink.apply(tables.read(spark, source, readChangeFeed="true", startingVersion="2"), TxnId("lakemirror/p/orders/e0", 0))
    letters = {json.loads(x.key)["id"]: x for x in store.letters(spark)}
    assert json.loads(letters[2].key) == {"id": 2, "region": None} and desk.pending() == {"orders": 2}
    assert rows(spark, dst) == [("eu", 1, "1.00"), (None, 2, "2.00"), ("us", 3, "3.00"), ("eu", 4, "4.00")]

    # skip: the letter is marked, nothing is written
    before = tables.latest_version(spark, replica)
    [skipped] = desk.resolve_now("skip", [letters[3].id]).resolutions
    assert skipped.status == SKIPPED and tables.latest_version(spark, replica) == before

    # a replay the replica refuses again leaves the letter pending, with the new reason
    [refused] = desk.resolve_now("replay", [letters[2].id]).resolutions
    assert refused.status == PENDING and "CHECK" in (store.letters(spark, [letters[2].id])[0].reason)
    assert tables.latest_version(spark, replica) == before

    # the operator fixes the constraint; a replay writes the key, then "crashes" before the letters' update
    spark.sql(f"ALTER TABLE delta.`{dst}` DROP CONSTRAINT positive")
    spark.sql(f"ALTER TABLE delta.`{dst}` ADD CONSTRAINT above_floor CHECK (amount > -100)")
    replays = lr.keys_to_replay([letters[2]], store.letters(spark))
    [crashed] = replay_keys(spark, target, replays)
    assert crashed.status == REPLAYED and store.letters(spark, [letters[2].id])[0].status == PENDING
    [repeated] = desk.resolve_now("replay", [letters[2].id]).resolutions     # the same replay, after the restart
    assert repeated.status == REPLAYED and "Delta skipped the repeat" in repeated.resolution
    txn = lr.replay_txn(target.app_id, replays)
    assert len(tables.tagged_commits(spark, replica, txn.tag(), "version")) == 1   # written once

    # the skipped letter, replayed on the operator's word: the replica now equals its source
    [late] = desk.resolve_now("replay", [letters[3].id]).resolutions
    assert late.status == REPLAYED and "row of version 4 written" in late.resolution
    assert rows(spark, dst) == rows(spark, src)
    assert desk.pending() == {}
    assert {x.status for x in store.letters(spark)} == {REPLAYED}

    # the state at an applied version, derived from the change feed after it, is the snapshot's: key 1 has
    # no change after version 1 (its latest row), key 2 an update (its before-image), key 4 was inserted
    # after it (no row then: a delete)
    at_one = replace(target, applied_through=1)
    chosen = [lr.KeyReplay("s.sales.orders", text, ()) for text in
              ('{"id": 1, "region": "eu"}', '{"id": 2, "region": null}', '{"id": 4, "region": "eu"}')]
    keys, ready, _ = key_frame(spark, at_one, chosen)
    assert keys is not None and len(ready) == 3
    found, present, how = states_at(spark, at_one, keys, ready, snapshot=False)
    assert "derived from its change feed" in how and present == {chosen[0].key, chosen[1].key}
    assert sorted(((r["region"], r["id"], str(r["amount"]), r["_change_type"], r["_commit_version"])
                   for r in found.collect()), key=str) == sorted(
        [("eu", 1, "1.00", "insert", 1), (None, 2, "2.00", "insert", 1), ("eu", 4, "None", "delete", 1)], key=str)
    desk.close()


@pytest.mark.slow
def test_a_running_pipeline_counts_its_letters_across_a_restart_and_replays_them_through_its_routes(
        pipeline: Any) -> None:
    """The same mechanism as above, wired in the daemon (slow tier: a real pipeline, restarted): the
    streaming batch dead-letters the change, status and metrics count it, a restart reads the count
    back, and the replay through the HTTP routes runs between the table's batches."""
    from lakemirror.daemon import routes
    from lakemirror.daemon.dead_letter_api import DeadLetterApi

    p = pipeline
    p.create("orders", "id BIGINT NOT NULL, amount DECIMAL(10,2)", key="id")
    p.sql("orders", "INSERT INTO {t} VALUES (1, 1.00), (2, 2.00)")
    p.start()
    p.wait_caught_up("orders")
    p.spark.sql(f"ALTER TABLE {p.replica('orders').sql} ADD CONSTRAINT positive CHECK (amount > 0)")
    p.sql("orders", "UPDATE {t} SET amount = -2.50 WHERE id = 2")
    p.sql("orders", "INSERT INTO {t} VALUES (3, 3.00)")
    p.wait_caught_up("orders")

    def pending() -> Any:
        return (p.views()["orders"].detail or {}).get("dead_letters_pending")

    assert pending() == 1
    p.restart()
    p.wait_caught_up("orders")
    p.tick_until(lambda: pending() == 1, what="the restarted daemon to count the letter it holds")
    assert p.app.metrics.registry.get_sample_value(
        "lakemirror_feed_dead_letters_pending", {"pipeline": "test", "table": "orders"}) == 1

    api = DeadLetterApi(lambda name: None, feed=p.app.feed_letter_desk, timeout_seconds=120)

    def call(method: str, target: str, body: Any = None) -> tuple[int, Any]:
        m = routes.match(method, target)
        assert isinstance(m, routes.Match)
        return api.handle(m, body)

    code, listed = call("GET", "/api/change-feed/dead-letters?table=orders")
    assert code == 200 and [json.loads(x["key"]) for x in listed["letters"]] == [{"id": 2}]
    p.spark.sql(f"ALTER TABLE {p.replica('orders').sql} DROP CONSTRAINT positive")
    code, done = call("POST", "/api/change-feed/dead-letters/replay", {"all_pending": True, "table": "orders"})
    assert code == 200 and [x["status"] for x in done["letters"]] == [REPLAYED]
    p.assert_replica_equals_source("orders")
    p.tick_until(lambda: pending() is None, what="no letter to be pending")
