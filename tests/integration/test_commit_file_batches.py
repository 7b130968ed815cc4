"""Batches planned from the source's commit files on S3 (no DeltaSource snapshot), with Spark's
streaming source planning the others, keep the replica exact.

The source and replica live in the session's S3 bucket; each turn of the table plans its next batch
from the commit files in the bucket (:mod:`lakemirror.supervisor.change_feed.commit_file_batches`) and Spark plans the
epoch's first batch and a schema change. The replica equals the source row for row through inserts,
updates, deletes, re-inserts, NULLs in a composite-key table, several versions in one batch, and a
column added on the source; every batch has one transaction id and one checkpoint row, and the
stream's log, continued by the daemon, is the one Spark resumes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.checkpoints.stream_log import StreamLog
from lakemirror.sinks.txn import is_txn_tag
from lakemirror.supervisor.offline.replica_transactions import stream_checkpoint

pytestmark = pytest.mark.integration


def feed_counts(p: Any, table: str) -> Any:
    feed = p.runner(table).turns.feed
    assert feed is not None, "the table's batches are not planned from the commit files"
    return feed.counts


def batch_rows(p: Any, table: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in tables.read(p.spark, p.app.checkpoints.location).collect()
            if r["error"] is None and r["batch_id"] >= 0 and r["source_fqn"].endswith(f".{table}")]


#: In the slow tier: batches planned from the commit files are exercised in the default tier on local
#: disk (tests/integration/test_turns_pipeline.py, test_replication.py), and the commit files in the
#: bucket are read there by tests/integration/test_object_storage.py (head requests, lag, commit times).
@pytest.mark.slow
def test_batches_from_the_commit_files_in_s3_keep_the_replica_exact(s3_pipeline: Any) -> None:
    p = s3_pipeline()
    p.create("o", "id BIGINT NOT NULL, k STRING NOT NULL, v STRING, n INT", key="id,k")
    p.sql("o", "INSERT INTO {t} VALUES (1, 'a', 'x', 1), (2, 'b', NULL, 2), (3, 'c', 'z', NULL)")
    p.start()
    p.wait_caught_up("o")
    p.sql("o", "INSERT INTO {t} VALUES (4, 'd', 'w', 4), (4, 'e', NULL, NULL)")  # Spark: the epoch's first batch
    p.wait_caught_up("o")
    p.sql("o", "UPDATE {t} SET v = NULL, n = 20 WHERE id = 2")
    p.wait_caught_up("o")
    p.sql("o", "DELETE FROM {t} WHERE id = 1")
    p.wait_caught_up("o")
    p.assert_replica_equals_source("o")
    assert feed_counts(p, "o").from_commit_files >= 2, feed_counts(p, "o")

    # Several versions in one batch: committed while the daemon is stopped, planned from the commit
    # files when it starts again (a re-insert, an update of a NULL, a delete).
    p.stop()
    p.sql("o", "INSERT INTO {t} VALUES (1, 'a', 'again', 100)")
    p.sql("o", "UPDATE {t} SET v = 'filled' WHERE id = 3")
    p.sql("o", "DELETE FROM {t} WHERE id = 4 AND k = 'e'")
    p.app = p._new_app()  # noqa: SLF001 (a new daemon process on the same bucket and folders)
    p.start()
    p.wait_caught_up("o")
    p.assert_replica_equals_source("o")
    counts = feed_counts(p, "o")
    assert counts.from_commit_files >= 1 and counts.by_spark == 0, counts
    assert any(r["last_version"] - r["first_version"] >= 2 for r in batch_rows(p, "o")), batch_rows(p, "o")

    # A column added on the source: Spark plans that version (the stream follows the schema), then the
    # commit files again.
    p.sql("o", "ALTER TABLE {t} ADD COLUMNS (extra STRING)")
    p.sql("o", "INSERT INTO {t} VALUES (5, 'e', 'q', 5, 'new')")
    p.wait_caught_up("o")
    p.sql("o", "UPDATE {t} SET extra = 'u', v = NULL WHERE id = 3")
    p.wait_caught_up("o")
    p.assert_replica_equals_source("o")
    assert feed_counts(p, "o").from_commit_files >= 1

    history = tables.delta_table(p.spark, p.replica("o")).history().collect()
    tags = [h["userMetadata"] for h in history if is_txn_tag(h["userMetadata"])]
    assert len(tags) == len(set(tags)), f"a batch committed twice: {tags}"
    rows = batch_rows(p, "o")
    ids = sorted((r["epoch"], r["batch_id"]) for r in rows)
    assert len(ids) == len(set(ids)), f"a batch has two checkpoint rows: {ids}"
    spans = sorted((r["first_version"], r["last_version"]) for r in rows)
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), f"a version applied twice: {spans}"
    runner = p.runner("o")
    progress = p.app.states.load(runner.slug)
    spec = p.app.spec
    log = StreamLog(Path(stream_checkpoint(spec.checkpoint_root, spec.pipeline_id, runner.slug, progress.epoch)))
    assert log.latest_offsets() == log.latest_commit(), "every logged batch committed"
