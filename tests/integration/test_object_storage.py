"""Sources and replicas on S3 (``s3a://``), against a local S3-compatible server (moto's, started
by scripts/s3-server.sh): replication through bootstrap and the change feed, lag and retention
headroom, and an expired change window. The lakehouse (sources, replicas, the checkpoint table)
lives in the bucket; the daemon's own state and the stream checkpoints stay in a local directory
(``checkpoint_volume``, which the config requires to be local)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.object_store import delta_rs_target
from lakemirror.sinks.txn import is_txn_tag
from lakemirror.delta_log.commit_times import HadoopCommitLog, commit_log_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("settings, path", [
    ({}, "applies on the driver by a delta-rs MERGE on object storage, committed by conditional put"),
    # In the slow tier: Spark's rewrite of a small replica and Spark's MERGE of change-feed batches are
    # exercised in the default tier on local disk (tests/integration/test_replication.py), and Spark's
    # MERGE into an S3 replica by the event replica's Spark executor below.
    pytest.param({"driver_apply": False}, "applies by rewriting the replica with Spark (driver_apply is off)",
                 marks=pytest.mark.slow),
    pytest.param({"rewrite_below_bytes": 0}, "applies by MERGE", marks=pytest.mark.slow),
], ids=["driver: delta-rs MERGE", "small replica: Spark rewrite", "Spark MERGE"])
def test_a_source_and_replica_on_s3_replicate_every_kind_of_change(
        s3_pipeline: Any, caplog: pytest.LogCaptureFixture, settings: dict[str, Any], path: str) -> None:
    caplog.set_level(logging.INFO, logger="lakemirror.sinks.merge.delta_replica")
    p = s3_pipeline(**settings)
    assert p.source("o").path.startswith("s3a://") and p.replica("o").path.startswith("s3a://")
    p.create("o", "id BIGINT NOT NULL, v STRING, n INT", key="id")
    p.sql("o", "INSERT INTO {t} VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
    p.start()
    p.wait_caught_up("o")                                  # the bootstrap snapshot
    p.assert_replica_equals_source("o")
    p.sql("o", "INSERT INTO {t} VALUES (4, 'd', 4), (5, 'e', 5)")
    p.sql("o", "UPDATE {t} SET v = 'B', n = 20 WHERE id = 2")
    p.sql("o", "DELETE FROM {t} WHERE id IN (1, 4)")
    p.sql("o", "INSERT INTO {t} VALUES (1, 'again', 100)")  # re-inserted after its delete
    p.wait_caught_up("o")
    p.assert_replica_equals_source("o")
    assert p.rows(p.replica("o"), ["id", "v", "n"]) == [(1, "again", 100), (2, "B", 20), (3, "c", 3), (5, "e", 5)]

    assert any(path in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    history = tables.delta_table(p.spark, p.replica("o")).history().collect()
    by_delta_rs = [h for h in history if is_txn_tag(h["userMetadata"]) and "delta-rs" in str(h["engineInfo"])]
    assert bool(by_delta_rs) == (not settings), [(h["operation"], h["engineInfo"]) for h in history]
    tags = [h["userMetadata"] for h in history if is_txn_tag(h["userMetadata"])]
    assert len(tags) == len(set(tags)), "a batch committed twice"

    # lag and retention headroom, measured from the commit files in the bucket
    p.tick_until(lambda: p.runner("o").last_lag is not None, what="a lag reading")
    lag = p.runner("o").last_lag
    assert lag.lag_seconds is not None and lag.lag_seconds >= 0
    assert lag.retention_headroom_seconds is not None and lag.retention_headroom_seconds > 0
    log = commit_log_for(p.spark, p.source("o"))  # the probes' commit times: S3 objects' times, via Hadoop
    assert isinstance(log, HadoopCommitLog) and log.commit_time(0) is not None and log.commit_time(10**6) is None
    view = p.views()["o"]
    assert view.lag_seconds is not None and view.applied_through == p.latest_version("o")
    # the checkpoint table lives in the bucket too: appended by delta-rs (s3://, storage options from
    # the session's s3a settings), read by Spark
    store = p.app.checkpoints
    assert store.location.path.startswith("s3a://") and store._by_delta_rs is True  # noqa: SLF001
    assert tables.read(p.spark, store.location).where("error IS NULL").count() >= 2

    # delta-rs reads the replica Spark wrote, through the same settings
    from deltalake import DeltaTable

    uri, options = delta_rs_target(p.spark, p.replica("o").path)
    assert uri.startswith("s3://") and options["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    seen = DeltaTable(uri, storage_options=options).to_pyarrow_table(columns=["id", "v", "n"]).to_pylist()
    assert sorted(tuple(r.values()) for r in seen) == [(1, "again", 100), (2, "B", 20), (3, "c", 3), (5, "e", 5)]


#: In the slow tier: a needed version gone is detected and reported in the default tier on local disk
#: (tests/integration/test_change_window.py, log cleanup past the needed version); reading the change
#: files and commit times in the bucket by the replication test above.
@pytest.mark.slow
def test_a_source_version_vacuumed_on_s3_fails_the_table_under_policy_fail(s3_pipeline: Any) -> None:
    p = s3_pipeline(change_window_policy="fail")
    p.create("w", "id BIGINT NOT NULL, v INT", key="id")
    p.sql("w", "INSERT INTO {t} VALUES (1, 1), (2, 2)")
    p.start()
    p.wait_caught_up("w")
    p.stop()
    # while the daemon is stopped: changes, then every file they wrote vacuumed away in the bucket
    p.sql("w", "UPDATE {t} SET v = 10 WHERE id = 1")
    p.sql("w", "DELETE FROM {t} WHERE id = 2")
    p.sql("w", "INSERT INTO {t} VALUES (3, 3)")
    p.spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        p.sql("w", "VACUUM {t} RETAIN 0 HOURS")
    finally:
        p.spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    p.app = p._new_app()  # noqa: SLF001 (a new daemon process over the same bucket and folders)
    p.start()
    p.tick_until(lambda: p.views()["w"].state == "failed", what="the table to fail")
    error = p.views()["w"].last_error
    assert "change window expired" in error and "lakemirror resync" in error, error
    assert "s3a://" in error, "the missing file is named, in the bucket"
    assert p.rows(p.replica("w")) == [(1, 1), (2, 2)], "nothing half-applied"


@pytest.mark.parametrize("on_driver", [False, True], ids=["spark", "driver"])
def test_an_event_replica_in_s3_is_guarded_by_either_executor(spark: Any, s3_bucket: Any, on_driver: bool) -> None:
    """The sequence guard on S3: out of order, redelivered, a delete then a late older insert, a
    replayed batch. With ``driver_apply`` the replica and its tombstones are written by delta-rs
    (``s3://``, storage options from the session's s3a settings); without it, by Spark's MERGE."""
    from lakemirror.identifiers import TableName
    from lakemirror.sinks.events.guard_merge import GuardedDeltaSink
    from lakemirror.sources.change_event import DELETE, UPSERT
    from lakemirror.tables import TableLocation
    from tests.integration.test_guard_merge import KEYS, ev, expected, replica_rows, run

    sink = GuardedDeltaSink(TableLocation(TableName("dst", "s", "items"), s3_bucket.fresh("events")),
                            driver_apply=on_driver)
    events = [ev(UPSERT, ("a", 1), 10, v=1), ev(UPSERT, ("a", 2), 11, v=2), ev(UPSERT, ("a", 1), 30, v=3),
              ev(DELETE, ("a", 2), 40), ev(UPSERT, (None, 3), 50, v=None)]
    run(spark, sink, [[events[2], events[0], events[0]], [events[3], events[4]]])
    assert sink.applies_on_driver == on_driver
    late = run(spark, sink, [[ev(UPSERT, ("a", 2), 20, v=9), events[0]]], first=2)  # older: the delete, the row
    assert late[0].stale == 2 and late[0].counts.inserted == 0
    assert run(spark, sink, [[events[3], events[4]]], first=1)[0].replayed
    assert replica_rows(spark, sink.replica) == expected(events, [*KEYS, "v"])
    assert tables.read(spark, sink.tombstones).count() == 1


def test_commit_file_checks_on_s3_send_head_requests_only(spark: Any, s3_bucket: Any) -> None:
    """An idle table's checks find its next version missing, several times a second: on s3a that
    must be one HEAD each, not ``exists``' HEAD and directory LIST (S3 bills LISTs at the PUT rate)."""
    import boto3

    prefix = s3_bucket.fresh("commits")
    key = prefix.split("/", 3)[3] + f"/_delta_log/{0:020d}.json"
    boto3.client("s3", endpoint_url=s3_bucket.endpoint, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").put_object(Bucket=s3_bucket.bucket, Key=key, Body=b"{}\n")
    jvm = spark._jvm
    log_dir = jvm.org.apache.hadoop.fs.Path(prefix + "/_delta_log")
    # a file system instance of its own, so that its request counters are this test's alone
    fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(log_dir.toUri(), spark._jsparkSession.sessionState().newHadoopConf())
    try:
        log = HadoopCommitLog(fs, lambda v: jvm.org.apache.hadoop.fs.Path(log_dir, f"{v:020d}.json"))
        assert log.has_commit(0) and log.commit_time(0) is not None
        counters = fs.getIOStatistics().counters()
        before = {k: counters.get(k) for k in ("object_list_request", "object_metadata_request")}
        for _ in range(5):
            assert not log.has_commit(1) and log.commit_time(1) is None
        counters = fs.getIOStatistics().counters()
        assert counters.get("object_list_request") == before["object_list_request"]
        assert counters.get("object_metadata_request") == before["object_metadata_request"] + 10
    finally:
        fs.close()


def test_a_commit_time_on_s3_is_placed_within_the_stores_whole_second(spark: Any, s3_bucket: Any) -> None:
    """S3 reports an object's time in whole seconds (a lag up to a second high); the commit's own
    ``commitInfo`` time, read once from its first line, places it within that second."""
    import json

    import boto3

    from lakemirror.identifiers import TableName
    from lakemirror.tables import TableLocation

    client = boto3.client("s3", endpoint_url=s3_bucket.endpoint, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
    prefix = s3_bucket.fresh("commit_times")
    key = prefix.split("/", 3)[3] + "/_delta_log/{:020d}.json"
    stamped: dict[int, int] = {}
    for version in range(3):
        stamped[version] = int(time.time() * 1000)
        info = {"commitInfo": {"timestamp": stamped[version], "operation": "WRITE"}}
        client.put_object(Bucket=s3_bucket.bucket, Key=key.format(version),
                          Body=(json.dumps(info) + "\n" + json.dumps({"add": {"path": "x"}}) + "\n").encode())
        time.sleep(0.3)
    log = HadoopCommitLog.for_table(spark, TableLocation(TableName("src", "s", "t"), prefix))
    assert log is not None
    placed = 0
    for version, at_ms in stamped.items():
        stored = client.head_object(Bucket=s3_bucket.bucket, Key=key.format(version))["LastModified"].timestamp()
        assert stored == int(stored), "the store's time is whole seconds"
        found = log.commit_time(version)
        if int(stored) == at_ms // 1000:  # the put ended in the second it began (not across a second)
            assert found == at_ms / 1000.0
            placed += 1
        else:
            assert found == stored
    assert placed >= 1


def test_daemons_of_one_pipeline_on_two_machines_meet_at_the_lease_on_s3(s3_bucket: Any, tmp_path: Any) -> None:
    """Two Spark Connect daemons of one pipeline, each with a checkpoint volume of its own: their
    folder leases never meet, the copy at ``lease.object_store`` on the S3 server does (a put with
    ``If-None-Match: *``, which the server honours), so the second is refused naming the first."""
    from lakemirror.checkpoints.lease import LeaseHeld
    from lakemirror.daemon.lease import pipeline_lease
    from lakemirror.daemon.settings import load_settings

    locks = s3_bucket.fresh("locks")

    def machine(name: str) -> Any:
        settings = load_settings(None, {
            "pipeline_id": "orders", "source_catalog": "a", "destination_catalog": "b", "schema_name": "s",
            "checkpoint_volume": str(tmp_path / name), "lease": {"object_store": locks},
            "runtime": {"mode": "connect", "spark_remote": "sc://spark:15002",
                        "spark_conf": {f"spark.hadoop.{k}": v for k, v in s3_bucket.hadoop_conf.items()}}})
        return pipeline_lease(settings, tmp_path / name / "orders", config=f"/etc/{name}.yaml",
                              on_lost=lambda reason: None, clock=time.time)

    first, second = machine("pod-a"), machine("pod-b")
    first.acquire()
    try:
        with pytest.raises(LeaseHeld, match=r"config /etc/pod-a\.yaml.*\(lease s3://.*/\.lakemirror/leases/orders\)"):
            second.acquire()
        assert not second.held and first.held
    finally:
        first.release()
    second.acquire()  # released by the first: the second starts at once
    assert second.held
    second.release()
