"""The Spark-only path (Unity Catalog replicas, ``driver_apply: false``) as lean as Spark allows.

- A steady batch runs Delta's own jobs and nothing else: the MERGE's (or the small replica's
  rewrite's) and the snapshot Delta rebuilds after its commit. No statistics pass, no history read,
  no Spark write of a checkpoint row for a table the driver reaches, and nothing on the daemon's
  other threads (lag probe, turns). Counted with Spark's status tracker: a streaming query runs
  every job of its thread under its run id as the job group, the test's own writes and reads run
  under a group of their own, and the daemon's other threads under none.
- The replicas lakemirror creates carry the maintenance properties, and the scheduled VACUUM
  cleans a replica at its own retention and refuses a table that is not one of its replicas.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from lakemirror.identifiers import TableName
from tests.integration.conftest import Pipeline

pytestmark = pytest.mark.integration

#: A job a caller runs by an action of its own (a statistics pass, a history read, a row count),
#: as Spark names it (the call site): none of these may run in a steady batch.
OWN_ACTION = re.compile(r"\((collect|count|first|take|head|toPandas|toLocalIterator|showString|getHistory) at ")
TEST_GROUP = "lakemirror-test-writer"


class JobCounter:
    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.tracker = spark.sparkContext.statusTracker()
        self.store = spark.sparkContext._jsc.sc().statusStore()  # noqa: SLF001 (job descriptions, test only)

    def jobs(self, group: str | None) -> set[int]:
        return set(self.tracker.getJobIdsForGroup(group))

    def describe(self, job: int) -> str:
        data = self.store.job(job)
        desc = data.description()
        last = (desc.get() if desc.isDefined() else "").splitlines()[-1:] or [""]
        return f"{last[0]} ({data.name()})"


def as_test(spark: Any, action: Any) -> Any:
    """Run the test's own Spark work under a job group of its own."""
    sc = spark.sparkContext
    sc.setJobGroup(TEST_GROUP, "the test's writes and reads")
    try:
        return action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)


def steady_batches(p: Pipeline, counter: JobCounter, batches: int) -> tuple[list[str], list[str]]:
    """Apply ``batches`` one-commit batches; the descriptions of the jobs the table's query ran for
    them, and of the jobs run meanwhile outside any job group (the daemon's other threads)."""
    runner = p.runner("t")
    group = str(runner.live.query.runId)
    before, outside = counter.jobs(group), counter.jobs(None)
    for i in range(batches):
        as_test(p.spark, lambda: p.sql("t", f"UPDATE {{t}} SET v = v + 1 WHERE id % 50 = {i}"))
        target = as_test(p.spark, lambda: p.latest_version("t"))
        p.tick_until(lambda: (runner.applied_through or -1) >= target, timeout=240, what="the batch")
    return ([counter.describe(j) for j in sorted(counter.jobs(group) - before)],
            [counter.describe(j) for j in sorted(counter.jobs(None) - outside)])


@pytest.mark.parametrize("apply_settings, most", [({"rewrite_below_bytes": 0}, 5), ({}, 5)], ids=["merge", "rewrite"])
def test_a_steady_batch_runs_deltas_jobs_and_none_of_its_own(spark: Any, tmp_path: Path, apply_settings: dict[str, Any],
                                                             most: int) -> None:
    p = Pipeline(spark, tmp_path, driver_apply=False, replica_maintenance={"checkpoint_interval": 7}, **apply_settings)
    try:
        as_test(spark, lambda: p.create("t", "id BIGINT NOT NULL, v BIGINT, s STRING", key="id"))
        as_test(spark, lambda: p.sql("t", "INSERT INTO {t} SELECT id, id, 'x' FROM range(500)"))
        p.start()
        p.wait_caught_up("t", timeout=240)
        counter = JobCounter(spark)
        steady_batches(p, counter, 1)  # the first batch chooses the apply path (two jobs on the replica)
        jobs, outside = steady_batches(p, counter, 1)
        assert len(jobs) <= most, jobs
        assert not [j for j in jobs if OWN_ACTION.search(j)], jobs
        assert outside == [], f"the daemon ran Spark jobs outside the table's query: {outside}"
        # The replica was created with the maintenance block's properties.
        props = dict(spark.sql(f"DESCRIBE DETAIL {p.replica('t').sql}").collect()[0]["properties"])
        assert {k: props.get(k) for k in ("delta.deletedFileRetentionDuration", "delta.logRetentionDuration",
                                          "delta.checkpointInterval")} == {
            "delta.deletedFileRetentionDuration": "interval 24 hours",
            "delta.logRetentionDuration": "interval 168 hours", "delta.checkpointInterval": "7"}
    finally:
        p.stop()


def test_a_replica_is_vacuumed_at_its_own_retention_and_nothing_else_is(spark: Any, tmp_path: Path) -> None:
    from lakemirror.sinks.batch.operations import SparkOperations
    from lakemirror.sinks.batch.vacuum import NotOurReplica, vacuum_replica
    from lakemirror.sources.catalog import LocalCatalog

    catalog = LocalCatalog(str(tmp_path / "lakehouse"))
    replica, other = (catalog.locate(TableName("dst", "sales", name)) for name in ("t", "other"))
    for loc, owner in ((replica, "test"), (other, None)):
        props = "'delta.deletedFileRetentionDuration' = 'interval 1 hours'" + (
            f", 'lakemirror.pipelineId' = '{owner}'" if owner else "")
        spark.sql(f"CREATE TABLE {loc.sql} (id BIGINT, v BIGINT) USING DELTA TBLPROPERTIES ({props})")
        spark.sql(f"INSERT INTO {loc.sql} SELECT id, id FROM range(100)")
        spark.sql(f"UPDATE {loc.sql} SET v = -v WHERE id < 10")  # replaces the file written above
    files_before = {f.name for f in Path(str(replica.path)).glob("*.parquet")}
    done = vacuum_replica(spark, replica, "test")
    assert done["vacuumed"] is True and done["retention"] == "interval 1 hours", done
    # The file the UPDATE replaced a moment ago is within the retention: kept, as is the data.
    assert {f.name for f in Path(str(replica.path)).glob("*.parquet")} == files_before
    assert spark.sql(f"SELECT count(*) AS n FROM {replica.sql} WHERE v < 0").collect()[0]["n"] == 9
    # Through the batch runner's seam, as the sub-task runs it; never on a table the pipeline did not create.
    ops = SparkOperations(spark, catalog, results=None)
    assert ops.run("vacuum", _Job(TableName("dst", "sales", "t"), {"vacuum": {"pipeline_id": "test"}}),
                   "vacuum-1")["vacuumed"] is True
    with pytest.raises(NotOurReplica, match="it is not a lakemirror replica"):
        vacuum_replica(spark, other, "test")
    with pytest.raises(NotOurReplica, match="replica of 'test'"):
        vacuum_replica(spark, replica, "another-pipeline")
    assert ops.run("vacuum", _Job(TableName("dst", "sales", "missing"), {"vacuum": {"pipeline_id": "test"}}),
                   "vacuum-2") == {"vacuumed": False, "reason": "the replica does not exist yet"}


class _Job:
    def __init__(self, target: TableName, options: dict[str, Any]) -> None:
        self.source = target
        self.target = target
        self.settings = _JobSettings(options)


class _JobSettings:
    def __init__(self, options: dict[str, Any]) -> None:
        self.keys: tuple[str, ...] = ()
        self.options = options
