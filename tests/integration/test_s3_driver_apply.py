"""Change-feed replicas on S3 applied by the driver's delta-rs MERGE: a crash between its commit and
the batch's checkpoint row loses nothing and applies nothing twice.

The crash point ``after_driver_commit`` (``supervisor/change_feed/table_runner.py``, ``FAULT_POINTS``) fires once the
delta-rs commit of a batch is durable in the bucket, before anything records it. Here it raises
in-process (the slow tier's torture kills a daemon there, ``tests/e2e/test_torture_s3.py``): the table
fails, restarts, Spark hands it the same batch again, and the replica's Delta transaction id (read by
delta-rs through the session's s3a settings) makes the replay a no-op. A second restart after Spark's
commit of that batch is removed (a stop between the checkpoint row and Spark's commit log) skips the
replay without reading it, from the replica's own record.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.sinks.txn import is_txn_tag
from lakemirror.supervisor.offline.replica_transactions import remote_target

from tests.integration.test_honest_restart import uncommit_last_batch

pytestmark = pytest.mark.integration


class CrashOnce(Exception):
    """Raised at the armed crash point, once."""


def crash_once_at(point: str) -> Any:
    armed = [True]

    def fault(reached: str) -> None:
        if reached == point and armed[0]:
            armed[0] = False
            raise CrashOnce(f"crash at {point}")
    fault.armed = armed  # type: ignore[attr-defined]
    return fault


def batch_rows(p: Any, table: str) -> list[dict[str, Any]]:
    loc = p.app.checkpoints.location
    return [r.asDict() for r in tables.read(p.spark, loc).collect()
            if r["error"] is None and r["batch_id"] >= 0 and r["source_fqn"].endswith(f".{table}")]


def test_a_crash_after_the_driver_commit_on_s3_is_replayed_and_skipped_by_its_transaction_id(
        s3_pipeline: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lakemirror.supervisor.change_feed.batch_apply")
    p = s3_pipeline()
    fault = crash_once_at("after_driver_commit")
    p.app = p.app.replace(fault=fault)
    p.create("o", "id BIGINT NOT NULL, k STRING NOT NULL, v STRING", key="id,k")
    p.sql("o", "INSERT INTO {t} VALUES (1, 'a', 'x'), (2, 'b', NULL)")
    p.start()
    p.wait_caught_up("o")
    p.sql("o", "INSERT INTO {t} VALUES (3, 'c', 'y')")
    p.sql("o", "UPDATE {t} SET v = 'z' WHERE id = 2")
    p.sql("o", "DELETE FROM {t} WHERE id = 1")
    p.wait_caught_up("o")
    assert not fault.armed[0], "the driver path was never taken on S3"
    p.assert_replica_equals_source("o")
    replayed = [r.getMessage() for r in caplog.records if "was already committed to the replica" in r.getMessage()]
    assert replayed, "the crashed batch was not replayed"

    history = tables.delta_table(p.spark, p.replica("o")).history().collect()
    tags = [h["userMetadata"] for h in history if is_txn_tag(h["userMetadata"])]
    assert tags and len(tags) == len(set(tags)), f"a batch committed twice: {tags}"
    merges = [h for h in history if h["operation"] == "MERGE"]
    assert merges and all("delta-rs" in str(h["engineInfo"]) for h in merges), [(h["operation"], h["engineInfo"])
                                                                               for h in history]
    rows = batch_rows(p, "o")
    ids = [(r["epoch"], r["batch_id"]) for r in rows]
    assert len(ids) == len(set(ids)), f"a batch has two checkpoint rows: {ids}"
    assert max(r["last_version"] for r in rows) == p.latest_version("o")

    # A stop after the checkpoint row, before Spark's commit log: the next run finds the batch in the
    # replica's record on S3 and skips it without reading it.
    applied = p.runner("o").applied_through
    p.stop()
    last = uncommit_last_batch(p, "o")
    assert remote_target(p.spark, p.replica("o").path) is not None
    p.app = p._new_app()  # noqa: SLF001 (a new daemon process on the same bucket and folders)
    p.start()
    p.tick_until(lambda: getattr(p.runner("o").apply_batch.record, "txn_version", None) is not None,
                 what="the replica's record")
    record = p.runner("o").apply_batch.record
    assert record is not None and record.txn_version == last and p.runner("o").applied_through == applied
    p.sql("o", "INSERT INTO {t} VALUES (1, 'a', 'back')")
    p.wait_caught_up("o")
    p.assert_replica_equals_source("o")
    assert len(batch_rows(p, "o")) == len(rows) + 1, "one new batch, its replay recorded nothing twice"
