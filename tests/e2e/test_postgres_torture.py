"""Crash exactness of the PostgreSQL replica: the daemon SIGKILLed inside and after a batch's
transaction, restarted each time, then the proof of tests/torture/harness.py.

The named points: after the snapshot's load committed (bootstrap), after the COPY into staging and
after the guarded upsert and progress row but before COMMIT (both inside the one transaction),
after the COMMIT before the checkpoint row, after the checkpoint row before Spark's commit log, and
an additive schema change (``ALTER TABLE … ADD COLUMN`` on the replica).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.torture.harness import POSTGRES_POINTS, SMOKE_WRITER_INTERVAL, Torture

pytestmark = pytest.mark.e2e

PROGRESS_CHECKS = {"events: replica equals source", "events: each source version applied once",
                   "pairs: replica equals source", "pairs: each source version applied once",
                   "events: checkpoint rows consistent", "pairs: checkpoint rows consistent"}


def test_killed_after_the_postgres_commit_the_replayed_batch_is_a_no_op(
        spark: Any, tmp_path: Path, postgres: Any) -> None:
    """The smoke of ``make test``: one SIGKILL after a batch's transaction committed and before its
    checkpoint row; the progress row committed with the data makes Spark's replay a no-op."""
    destination = postgres.destination("torture_pg_smoke", retry_seconds=5)
    torture = Torture(spark, tmp_path, seed=13, postgres=destination, connect=postgres.connect,
                      writer_interval=SMOKE_WRITER_INTERVAL)
    report = torture.run(kills=1, point_timeout=600, points=("after_merge",))
    assert [(k.point, k.reached) for k in report.kills] == [("after_merge", True)]
    assert set(report.checks) == PROGRESS_CHECKS
    assert report.batches_replayed >= 1


@pytest.mark.slow

def test_killed_inside_and_after_the_postgres_transaction_the_replica_stays_exact(
        spark: Any, tmp_path: Path, postgres: Any) -> None:
    destination = postgres.destination("torture_pg", retry_seconds=5)
    torture = Torture(spark, tmp_path, seed=13, postgres=destination, connect=postgres.connect)
    # A daemon on a loaded 2-core machine takes minutes to start Spark: room to reach each point.
    report = torture.run(kills=len(POSTGRES_POINTS), point_timeout=600)
    not_reached = [k.point for k in report.kills if not k.reached]
    assert not not_reached, f"crash points never reached: {not_reached}"
    assert [k.point for k in report.kills] == list(POSTGRES_POINTS)
    assert set(report.checks) == PROGRESS_CHECKS
    # A kill after the COMMIT leaves a committed batch that Spark replays on restart: the progress
    # row, committed with the data, makes the replay a no-op.
    assert report.batches_replayed >= 1
    # The kills inside the transaction left nothing behind: no progress row without its data.
    rows = postgres.query("SELECT count(*) FROM torture_pg.lakemirror_progress WHERE rows_inserted IS NULL "
                          "AND batch_id >= 0")
    assert rows == [(0,)]
