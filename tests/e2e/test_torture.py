"""Crash torture of change-feed replicas: the daemon SIGKILLed at named crash points, then the proof.

``make test`` runs the smoke (one SIGKILL after a batch's MERGE committed and before Spark's commit
log: the replay that Delta's transaction id must skip); ``make test-all`` one SIGKILL at every named
point, with and without deletion vectors; ``make torture`` (more kills, at random moments too)
writes docs/RELIABILITY.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.torture.harness import NAMED_POINTS, SMOKE_WRITER_INTERVAL, Torture

pytestmark = pytest.mark.e2e


def test_killed_after_the_merge_the_replayed_batch_is_skipped_and_the_replica_stays_exact(
        spark: Any, tmp_path: Path) -> None:
    report = Torture(spark, tmp_path, seed=11, writer_interval=SMOKE_WRITER_INTERVAL).run(
        kills=1, points=("after_merge",), point_timeout=600)
    assert [(k.point, k.reached) for k in report.kills] == [("after_merge", True)]
    assert len(report.checks) == 6, report.checks
    assert report.batches_replayed >= 1


@pytest.mark.slow
@pytest.mark.parametrize("replica_properties", [None, {"delta.enableDeletionVectors": "true"}],
                         ids=["default", "deletion-vectors"])
def test_killed_at_every_crash_point_the_replica_stays_exact(spark: Any, tmp_path: Path,
                                                             replica_properties: dict[str, str] | None) -> None:
    """With deletion vectors on, the batches are applied by the driver's own Delta commits
    (sinks/accelerator/dv_merge.py): a kill between its files and its commit, or after the commit, loses and
    doubles nothing either."""
    report = Torture(spark, tmp_path, seed=11, replica_properties=replica_properties).run(kills=len(NAMED_POINTS))
    assert report.kill_count == len(NAMED_POINTS)
    not_reached = [k.point for k in report.kills if not k.reached]
    assert not not_reached, f"crash points never reached: {not_reached}"
    assert len(report.checks) == 6
    # The kills after the MERGE and before Spark's commit log left committed batches behind: the
    # restarted daemon replayed them and Delta skipped them, which is the window under test.
    assert report.batches_replayed >= 1
    if replica_properties:
        assert all("MERGE by lakemirror" in detail for name, detail in report.checks.items()
                   if "transaction id" in name), report.checks


def test_the_crash_hook_kills_at_the_nth_arrival_and_rejects_unknown_points() -> None:
    program = ("from lakemirror.daemon.context import crash_points_from_environment as c\n"
               "f = c()\nfor i in range(5):\n    print(i, flush=True); f('after_merge')\n")
    env = {"LAKEMIRROR_TEST_KILL_AT": "after_merge:3", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == -9 and done.stdout.split() == ["0", "1", "2"]
    env["LAKEMIRROR_TEST_KILL_AT"] = "after_lunch"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode != 0 and "unknown crash point 'after_lunch'" in done.stderr
