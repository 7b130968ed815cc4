"""How a sweep whose batch function ran on a Spark Connect server learns its outcomes: the query's
progress matched with the replica's tagged commits (pure; no Spark)."""

from __future__ import annotations

import json
from typing import Any

from lakemirror.sinks.batch.sweep_batches import TaggedCommit, outcomes_from_log, progress_batches, tagged_commits
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId

APP = "lakemirror-incremental/p1/dst__s__t/e1-v3"


def commit(version: int, app: str, batch: int, inserted: int = 0, updated: int = 0, deleted: int = 0) -> dict[str, Any]:
    return {"version": version, "userMetadata": TxnId(app, batch).tag(),
            "operationMetrics": {"numTargetRowsInserted": str(inserted), "numTargetRowsUpdated": str(updated),
                                 "numTargetRowsDeleted": str(deleted),
                                 "numSourceRows": str(inserted + updated + deleted)}}


def test_only_commits_of_the_sweeps_own_transaction_count() -> None:
    history = [commit(9, APP, 2, inserted=1), commit(8, APP, 1, updated=2),
               commit(7, "lakemirror-incremental/p1/dst__s__t/e0-v0", 1, deleted=5),  # an older epoch
               {"version": 6, "userMetadata": None, "operationMetrics": {}},            # a commit of another writer
               {"version": 5, "userMetadata": "hand-written note", "operationMetrics": {}}]
    found = tagged_commits(history, APP)
    assert found == {2: TaggedCommit(9, ApplyCounts(1, 0, 0), 1), 1: TaggedCommit(8, ApplyCounts(0, 2, 0), 2)}


def test_fresh_batches_replays_and_idle_triggers_are_told_apart() -> None:
    commits = {4: TaggedCommit(20, ApplyCounts(0, 3, 0), 3), 5: TaggedCommit(22, ApplyCounts(2, 0, 1), 4)}
    # Batch 4 was committed before this sweep (a replay); 6 ran nothing.
    out = outcomes_from_log([4, 5, 6], commits, replica_version_before=21)
    assert [(b, o.replayed, o.stats.rows_read, o.counts) for b, o in out] == [
        (4, True, 3, ApplyCounts(0, 3, 0)), (5, False, 4, ApplyCounts(2, 0, 1))]


def test_a_batch_reported_twice_counts_once() -> None:
    commits = {1: TaggedCommit(3, ApplyCounts(1, 0, 0), 1)}
    out = outcomes_from_log([1, 1], commits, replica_version_before=2)
    assert len(out) == 1 and not out[0][1].replayed


class Progress:
    """A progress report as pyspark 4 hands it over Connect: its JSON is the reliable part."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.json = json.dumps(payload)


def test_progress_reports_give_batch_ids() -> None:
    reports = [Progress({"batchId": 0, "numInputRows": 0}), {"batchId": 1}]
    assert progress_batches(reports) == [0, 1]
