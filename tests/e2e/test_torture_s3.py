"""The crash torture with the lakehouse on S3 (the session's S3 server): the daemon, a subprocess,
is SIGKILLed at every named crash point, including ``after_driver_commit`` (the driver's delta-rs
commit of a batch is in the bucket, its checkpoint row is not), then the proof of
:mod:`tests.torture.harness`: each replica equals its source row for row, no transaction committed
twice, one checkpoint row per batch.

Slow tier (``make test-all``): it launches a daemon per kill. The default tier keeps the mechanism
under test in ``tests/integration/test_s3_driver_apply.py`` (a crash at the same point, in-process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.torture.harness import S3_POINTS, Torture

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_killed_at_every_crash_point_on_s3_the_replicas_stay_exact(spark: Any, tmp_path: Path,
                                                                    s3_bucket: Any) -> None:
    torture = Torture(spark, tmp_path, seed=23, warehouse=s3_bucket.fresh("torture"), hadoop_conf=s3_bucket.hadoop_conf)
    report = torture.run(kills=len(S3_POINTS), point_timeout=300.0)
    assert report.kill_count == len(S3_POINTS)
    not_reached = [k.point for k in report.kills if not k.reached]
    assert not not_reached, f"crash points never reached: {not_reached}"
    assert len(report.checks) == 6
    assert report.batches_replayed >= 1, "no kill left a committed batch to replay"
    merges = [detail for name, detail in report.checks.items() if "transaction id" in name]
    assert all("MERGE by delta-rs" in detail for detail in merges), report.checks
