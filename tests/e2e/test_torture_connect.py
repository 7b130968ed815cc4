"""Crash torture over Spark Connect: the daemon SIGKILLed inside a round of batches the server applied.

The server applies each batch and writes its outcome file; the daemon reports it and appends the
round's checkpoint rows in one commit (supervisor/change_feed/server_batches.py, checkpoints/round_rows.py).
Killed before that commit, the next daemon records the rows from the files; killed after it,
the next daemon records none twice; killed at a random moment, the same. The proof is the
harness's: replicas equal to their sources, no transaction committed twice, one checkpoint row
per batch. Launches daemons and a Connect server: ``make test-all`` only; the replay itself is
tested without Spark in tests/unit/test_connect_rounds.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.torture.harness import Torture

pytestmark = [pytest.mark.e2e, pytest.mark.connect, pytest.mark.slow]

POINTS = ("connect_before_rows", "connect_after_rows", "connect_before_rows:3", "random")


def test_killed_inside_a_connect_round_no_row_is_lost_or_doubled(spark: Any, connect_server: str,
                                                                tmp_path: Path) -> None:
    report = Torture(spark, tmp_path, seed=13, runtime={"mode": "connect", "spark_remote": connect_server}).run(
        kills=len(POINTS), points=POINTS, point_timeout=300.0)
    not_reached = [k.point for k in report.kills if k.point != "random" and not k.reached]
    assert not not_reached, f"crash points never reached: {not_reached}"
    assert len(report.checks) == 6, report.checks
