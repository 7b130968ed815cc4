"""``runtime.mode: connect`` end to end, through a Spark Connect server started by
scripts/connect-server.sh: no Delta Connect plugin, so every batch is applied on the server in SQL
(sinks/merge/connect_apply.py), a row the replica refuses is dead-lettered there, and each batch is
reported back through the checkpoint table.

One server and one pipeline for the whole module (a server start costs a second JVM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from lakemirror import tables
from lakemirror.daemon.settings.runtime_spec import pipeline_spec

from tests.integration.conftest import Pipeline, lose_commit_entry

pytestmark = [pytest.mark.integration, pytest.mark.connect]


class ConnectPipeline(Pipeline):
    def latest_version(self, table: str) -> int:
        local = self.local_latest_version(table)
        if local is not None:
            return local
        return int(tables.history(self.spark, self.source(table), 1).collect()[0]["version"])

    def checkpoint_rows(self, table: str) -> list[Any]:
        # The daemon appends the rows of the batches it reported a round at a time, off its tick.
        assert self.runner(table).ctx.round_rows.flush(120), "the checkpoint rows were not appended"
        loc = self.app.checkpoints.location
        return (tables.read(self.spark, loc).where(f"source_fqn = 'src.sales.{table}' AND error IS NULL")
                .orderBy("txn_app_id", "batch_id").collect())

    def merges(self, table: str) -> list[Any]:
        return (tables.history(self.spark, self.replica(table)).where("operation = 'MERGE'")
                .select("version", "userMetadata", "operationMetrics").collect())


@pytest.fixture(scope="module")
def remote(connect_server: str) -> Iterator[Any]:
    """A Connect session beside the suite's classic one. ``getOrCreate`` refuses while a classic
    session runs (SESSION_ALREADY_EXIST), so it is created outright; creating it marks the process
    as Connect-only (``SPARK_CONNECT_MODE_ENABLED``), which would make every later classic
    ``getOrCreate`` refuse too, so the mark is taken back when the module ends."""
    import os

    from pyspark.sql import SparkSession

    before = {k: os.environ.get(k) for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    session = SparkSession.builder.remote(connect_server).create()
    try:
        yield session
    finally:
        session.stop()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _pipeline(remote: Any, root: Path, url: str, **settings: Any) -> ConnectPipeline:
    return ConnectPipeline(remote, root, runtime={"mode": "connect", "spark_remote": url,
                                                  "warehouse": str(root / "lakehouse")},
                           restart={"base_delay_seconds": 0.5, "max_delay_seconds": 2, "jitter": 0.0}, **settings)


#: Over Connect tables take turns by default, the batch functions waiting at a gate of files beside
#: each query's checkpoint; apply_workers 0 runs always-on queries without turns.
#: The default (turns) in the default tier, under the end-to-end tier's time limit (a long scenario: a
#: server round trip for every step, a replay refused then written); always-on queries in the slow tier.
@pytest.mark.parametrize("apply_workers", [pytest.param(0, id="always-on", marks=pytest.mark.slow),
                                           pytest.param(None, id="turns", marks=pytest.mark.timeout(900))])
def test_connect_replicates_replays_and_isolates(remote: Any, connect_server: str, tmp_path: Path,
                                                 apply_workers: int | None, caplog: Any) -> None:
    assert not tables.has_own_jvm(remote)  # the daemon talks to the server, not to a JVM of its own
    p = _pipeline(remote, tmp_path, connect_server,
                  **({} if apply_workers is None else {"apply_workers": apply_workers}))
    assert pipeline_spec(p.settings).apply_workers == (1 if apply_workers is None else apply_workers)
    try:
        p.create("orders", "id BIGINT NOT NULL, v STRING, n INT", key="id")
        p.create("bad", "id BIGINT NOT NULL, v INT", key="id")
        p.sql("orders", "INSERT INTO {t} VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
        p.sql("bad", "INSERT INTO {t} VALUES (1, 1)")
        p.start()
        p.wait_caught_up("orders", "bad", timeout=240)
        p.assert_replica_equals_source("orders")  # the bootstrap

        # Inserts, updates, deletes and a delete followed by a re-insert of the same key.
        p.sql("orders", "INSERT INTO {t} VALUES (4, 'd', 4), (5, 'e', 5)")
        p.sql("orders", "UPDATE {t} SET v = 'B', n = 20 WHERE id = 2")
        p.sql("orders", "DELETE FROM {t} WHERE id IN (1, 3)")
        p.sql("orders", "INSERT INTO {t} VALUES (3, 'c again', 33)")
        p.sql("orders", "UPDATE {t} SET n = n + 100 WHERE id >= 4")
        p.wait_caught_up("orders", timeout=240)
        p.assert_replica_equals_source("orders")
        rows = p.checkpoint_rows("orders")
        assert rows, "no checkpoint row was recorded for the server's batches"
        # The batch function reported each batch by a file the daemon forgets once the batch's row is durable.
        outcomes = [d for d in (tmp_path / "checkpoints").rglob("lakemirror_outcomes") if "orders" in str(d)]
        assert outcomes and not [f for d in outcomes for f in d.glob("*.json")
                                 if int(f.stem) <= max(r["batch_id"] for r in rows)]
        # Each row keeps its versions' source commit times, from which recovery points are cut.
        assert all(r["first_version_at"] is not None and r["first_version_at"] <= r["last_version_at"] for r in rows)
        # Keys 4 and 5 are new and key 1 is gone (key 3's delete and re-insert may meet in one batch,
        # where its winner is the re-insert: an update of the bootstrapped row).
        assert sum(r["rows_deleted"] for r in rows) >= 1 and sum(r["rows_inserted"] for r in rows) >= 2
        merges = p.merges("orders")
        assert len(merges) == len(rows), (merges, rows)  # one MERGE commit per recorded batch
        tags = [json.loads(m["userMetadata"]) for m in merges]
        assert {(t["lakemirror_txn"], t["batch"]) for t in tags} == {(r["txn_app_id"], r["batch_id"]) for r in rows}

        # A restart that replays the last batch: its MERGE is committed but Spark's commit log lost
        # it (a crash between the two). Delta skips the replayed MERGE by its transaction id.
        p.stop()
        last = rows[-1]
        stream_dirs = [d for d in (tmp_path / "checkpoints").rglob("commits")
                       if "orders" in str(d) and d.parent.name == f"e{last['epoch']}"]
        assert len(stream_dirs) == 1, stream_dirs
        commits = stream_dirs[0]
        # (A stop that came between the batch's row and its commit file left the file unwritten: the
        # same replay, made by the stop itself.)
        lose_commit_entry(commits, last["batch_id"], missing_ok=True)
        p.sql("orders", "INSERT INTO {t} VALUES (6, 'f', 6)")
        caplog.clear()
        p.app = p._new_app()
        p.start()
        p.wait_caught_up("orders", timeout=240)
        p.assert_replica_equals_source("orders")
        # The replay is no failure. A query start whose foreachBatch worker the server could not
        # start (it did not connect back: seen on a loaded machine, both tables' workers at once) is
        # retried, and is no failure of the replay's either.
        worker_starts = [r for r in caplog.records if "orders failed to start: Python worker failed to connect back"
                         in r.getMessage()]
        assert p.views()["orders"].retries == len(worker_starts), (p.views()["orders"], caplog.text[-3000:])
        after = p.checkpoint_rows("orders")
        keys = [(r["txn_app_id"], r["batch_id"]) for r in after]
        assert len(keys) == len(set(keys)), f"a replayed batch was recorded twice: {keys}"
        assert (last["txn_app_id"], last["batch_id"]) in keys
        merges_after = p.merges("orders")
        replayed_tag = json.dumps({"lakemirror_txn": last["txn_app_id"], "batch": last["batch_id"]}, sort_keys=True)
        assert [m["userMetadata"] for m in merges_after].count(replayed_tag) == 1, "the replayed batch was applied twice"
        assert len(merges_after) == len(after) > len(rows)

        # A row the replica refuses (a CHECK constraint added to it) is isolated on the server as on the
        # local path: dead-lettered with table, key, version and reason, the rest of its batch applied
        # once, and the table keeps running; the other table is untouched.
        p.spark.sql(f"ALTER TABLE {p.replica('bad').sql} ADD CONSTRAINT small CHECK (v < 100)")
        p.sql("bad", "INSERT INTO {t} VALUES (2, 500), (3, 3), (4, 4)")
        poisoned_at = p.latest_version("bad")
        p.sql("orders", "INSERT INTO {t} VALUES (7, 'g', 7)")
        p.sql("orders", "DELETE FROM {t} WHERE id = 2")
        p.wait_caught_up("orders", "bad", timeout=240)
        p.assert_replica_equals_source("orders")
        assert p.rows(p.replica("bad")) == [(1, 1), (3, 3), (4, 4)]  # the source minus key 2
        assert p.views()["bad"].state == "running" and p.views()["bad"].failures == 0
        desk = p.app.feed_letters
        (letter,) = desk.dead_letters(table="bad", timeout=120)
        assert (letter["source"], json.loads(letter["key"]), letter["commit_version"], letter["status"]) == (
            "src.sales.bad", {"id": 2}, poisoned_at, "pending")
        assert "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES" in letter["reason"] and "small" in letter["reason"]
        p.tick_until(lambda: desk.pending().get("bad") == 1, timeout=60, what="the letter to be counted")
        bad_rows = p.checkpoint_rows("bad")
        assert bad_rows[-1]["last_version"] == poisoned_at and bad_rows[-1]["rows_inserted"] == 2
        # The same batch applied again (a crash before Spark committed it): the batch function's MERGE
        # is refused again and every attempt of the bisection is skipped by its transaction id, as is
        # the letters' write: nothing applied or dead-lettered twice.
        from lakemirror.sinks.merge.connect_apply import merge_batch
        from lakemirror.sinks.txn import TxnId

        poisoned = bad_rows[-1]
        merges_before = len(p.merges("bad"))
        batch = tables.read(remote, p.source("bad"), readChangeFeed="true",
                            startingVersion=str(poisoned["first_version"]), endingVersion=str(poisoned["last_version"]))
        again = merge_batch(p.runner("bad")._connect.job, batch, TxnId(poisoned["txn_app_id"], poisoned["batch_id"]))
        assert again.replayed and again.counts.total == 0 and [x.key for x in again.letters] == ['{"id": 2}']
        assert len(p.merges("bad")) == merges_before and p.rows(p.replica("bad")) == [(1, 1), (3, 3), (4, 4)]
        assert [x["id"] for x in desk.dead_letters(table="bad", timeout=120)] == [letter["id"]]

        if apply_workers == 0:
            # Without turns nothing in the daemon holds the server's batches off: the replay is
            # refused, saying why and what to do.
            (refused,) = desk.resolve_dead_letters("replay", [letter["id"]], timeout=300).resolutions
            assert refused.status == "pending" and "apply_workers" in refused.resolution, refused
        else:
            # A replay the replica still refuses leaves the letter pending with the new reason; once the
            # constraint is gone, the replay writes the key's row from the source (between two turns).
            report = desk.resolve_dead_letters("replay", [letter["id"]], timeout=300)
            assert [r.status for r in report.resolutions] == ["pending"], report
            p.spark.sql(f"ALTER TABLE {p.replica('bad').sql} DROP CONSTRAINT small")
            report = desk.resolve_dead_letters("replay", [letter["id"]], timeout=300)
            assert [r.status for r in report.resolutions] == ["replayed"], report
            p.assert_replica_equals_source("bad")
            # Skip: the operator leaves a refused row out of the replica; nothing is written.
            p.spark.sql(f"ALTER TABLE {p.replica('bad').sql} ADD CONSTRAINT not_600 CHECK (v <> 600)")
            p.sql("bad", "INSERT INTO {t} VALUES (5, 600)")
            p.wait_caught_up("bad", timeout=240)
            (skipped,) = desk.dead_letters(table="bad", status="pending", timeout=120)
            report = desk.resolve_dead_letters("skip", [skipped["id"]], timeout=120)
            assert [r.status for r in report.resolutions] == ["skipped"]
            assert p.rows(p.replica("bad")) == [(1, 1), (2, 500), (3, 3), (4, 4)]
            p.tick_until(lambda: not desk.pending().get("bad"), timeout=60, what="no letter to be pending")
        # The transaction confs set by the batch function never stay in the client's session.
        assert remote.conf.get("spark.databricks.delta.write.txnAppId", None) is None
    finally:
        p.stop()
