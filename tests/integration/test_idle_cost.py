"""What an idle table costs per trigger: no Spark job, whichever way its query runs.

A table whose source has no new commit is looked at by its query's trigger (Delta's streaming
source lists the source's log and finds nothing) and by the daemon (its lag probe and the turn
pool read the source's commit files). None of it may start a Spark job: on a 2-core driver, 64
idle tables each starting one a trigger would be the whole driver. Counted from Spark's own
status store, not timed."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _jobs(spark: Any) -> int:
    """The Spark jobs the session's JVM has started so far."""
    return int(spark.sparkContext._jsc.sc().statusStore().jobsList(None).size())  # noqa: SLF001


def _idle_for(p: Any, seconds: float) -> int:
    """Tick the pipeline for ``seconds`` with nothing committed to its sources; the Spark jobs started."""
    before = _jobs(p.spark)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        p.app.supervisor.tick()
        time.sleep(0.1)
    return _jobs(p.spark) - before


@pytest.mark.parametrize("apply_workers", [1, 0], ids=["turns", "always-on queries"])
def test_an_idle_table_starts_no_spark_job_in_many_triggers(make_pipeline: Any, apply_workers: int) -> None:
    p = make_pipeline(apply_workers=apply_workers, trigger_interval_seconds=0.5, lag_interval_seconds=0.5)
    p.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    p.sql("t", "INSERT INTO {t} VALUES (1, 'a')")
    p.start()
    p.wait_caught_up("t")
    p.sql("t", "UPDATE {t} SET v = 'b' WHERE id = 1")
    p.wait_caught_up("t")
    _idle_for(p, 2.0)  # the batch just applied settles (its commit, the next trigger's plan)
    started = _idle_for(p, 5.0)  # ten triggers, ten lag probes
    assert started == 0, f"{started} Spark jobs for an idle table in 5 s"
    runner = p.runner("t")
    assert runner.query_running, "the table's query stays up while idle"
    assert p.views()["t"].lag_seconds == 0.0
