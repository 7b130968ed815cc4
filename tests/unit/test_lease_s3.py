"""The pipeline's lease on S3: generations created with a conditional put (``If-None-Match: *``),
against moto's in-process S3, which implements the header as S3 does; and the choice of stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakemirror.checkpoints.lease import Holder, LeaseHeld, LeasePolicy, record_for
from lakemirror.checkpoints.lease_s3 import ConditionalPutUnsupported, S3LeaseStore, check_conditional_put
from lakemirror.checkpoints.lease_store import FileLeaseStore
from lakemirror.checkpoints.pipeline_lease import PipelineLease
from lakemirror.daemon.lease import lease_stores
from lakemirror.daemon.settings import load_settings
from lakemirror.object_store import boto3_client_options

POLICY = LeasePolicy(30.0, 5.0)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Any:
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    for key, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="lake")
        yield client


def holder(name: str, host: str) -> Holder:
    return Holder(host=host, pid=1, token=name, since=0.0)


def test_a_generation_is_created_once_and_the_newest_is_read_back(s3: Any) -> None:
    store = S3LeaseStore(s3, "lake", "wh/.lakemirror/leases/p")
    first = record_for(holder("a", "h1"), 1, 1000.0, POLICY)
    assert store.create(first)
    assert not store.create(record_for(holder("b", "h2"), 1, 1000.0, POLICY))
    assert store.create(record_for(holder("b", "h2"), 2, 1000.0, POLICY))
    newest = store.newest()
    assert newest is not None and newest.generation == 2 and newest.record is not None
    assert newest.record.holder.token == "b"
    store.prune(2)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="lake", Prefix="wh/")["Contents"]]
    assert keys == ["wh/.lakemirror/leases/p/lease-000000000002.json"], "pruned, and no probe object left"


def test_a_second_machine_is_refused_by_the_object_store_copy(s3: Any) -> None:
    now = [1000.0]
    first = PipelineLease("p", [S3LeaseStore(s3, "lake", "leases/p")], holder("a", "h1"), POLICY,
                          lambda h: True, clock=lambda: now[0])
    first.acquire()
    second = PipelineLease("p", [S3LeaseStore(s3, "lake", "leases/p")], holder("b", "h2"), POLICY,
                           lambda h: True, clock=lambda: now[0])
    with pytest.raises(LeaseHeld, match="host h1.*s3://lake/leases/p"):
        second.acquire()
    first.release()
    second.acquire()
    assert second.held


def test_a_server_that_ignores_if_none_match_is_refused() -> None:
    class Careless:
        def put_object(self, **kw: Any) -> None:
            pass

        def delete_objects(self, **kw: Any) -> None:
            pass

    with pytest.raises(ConditionalPutUnsupported, match="does not support conditional writes"):
        check_conditional_put(Careless(), "lake", "leases/p")


def test_boto3_options_follow_the_s3a_settings() -> None:
    opts = boto3_client_options({
        "fs.s3a.endpoint": "127.0.0.1:9000", "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.endpoint.region": "eu-west-1", "fs.s3a.path.style.access": "true",
        "fs.s3a.access.key": "AK", "fs.s3a.secret.key": "SK"})
    assert opts == {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1", "aws_access_key_id": "AK",
                    "aws_secret_access_key": "SK", "addressing_style": "path"}
    assert boto3_client_options({}) == {}


def test_the_lease_lives_in_the_folder_and_beside_tables_on_s3(tmp_path: Path) -> None:
    base = {"pipeline_id": "orders", "source_catalog": "a", "destination_catalog": "b", "schema_name": "s",
            "checkpoint_volume": str(tmp_path / "ck")}
    local = load_settings(None, {**base, "runtime": {"warehouse": str(tmp_path / "wh")}})
    stores = lease_stores(local, tmp_path / "ck" / "orders")
    assert [type(s) for s in stores] == [FileLeaseStore]
    assert stores[0].where == str(tmp_path / "ck" / "orders" / "lease")
    made: list[dict[str, str]] = []
    on_s3 = load_settings(None, {**base, "runtime": {"warehouse": "s3a://lake/house", "spark_conf": {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000", "spark.hadoop.fs.s3a.path.style.access": "true"}}})
    stores = lease_stores(on_s3, tmp_path / "ck" / "orders", s3_client=lambda o: made.append(o) or object())
    assert [s.where for s in stores] == [str(tmp_path / "ck" / "orders" / "lease"),
                                         "s3://lake/house/.lakemirror/leases/orders"]
    assert made == [{"endpoint_url": "http://127.0.0.1:9000", "addressing_style": "path"}]


def test_lease_object_store_places_the_copy_on_s3_in_any_mode_or_nowhere(tmp_path: Path) -> None:
    """Daemons of one pipeline on two machines (Spark Connect pods with volumes of their own) meet at
    the bucket ``lease.object_store`` names; ``off`` keeps the folder's lease only, also beside tables on S3."""
    base = {"pipeline_id": "orders", "source_catalog": "a", "destination_catalog": "b", "schema_name": "s",
            "checkpoint_volume": str(tmp_path / "ck")}
    connect = {"mode": "connect", "spark_remote": "sc://spark:15002"}
    folder = str(tmp_path / "ck" / "orders" / "lease")

    def wheres(raw: dict[str, Any]) -> list[str]:
        return [s.where for s in lease_stores(load_settings(None, {**base, **raw}), tmp_path / "ck" / "orders",
                                              s3_client=lambda o: object())]

    assert wheres({"runtime": connect}) == [folder], "auto: the Connect server's warehouse is not the daemon's to know"
    assert wheres({"runtime": connect, "lease": {"object_store": "s3a://lake/locks/"}}) == [
        folder, "s3://lake/locks/.lakemirror/leases/orders"]
    assert wheres({"runtime": {"mode": "databricks"}, "lease": {"object_store": "s3://lake"}}) == [
        folder, "s3://lake/.lakemirror/leases/orders"]
    assert wheres({"runtime": {"warehouse": "s3a://lake/house"}, "lease": {"object_store": "off"}}) == [folder]


@pytest.mark.parametrize("value", ["/var/locks", "s3a://", "gs://lake/locks", "on"])
def test_lease_object_store_is_auto_off_or_a_bucket(tmp_path: Path, value: str) -> None:
    from lakemirror.errors import ConfigError

    with pytest.raises(ConfigError, match="lease.object_store must be auto, off or an s3a://bucket/prefix"):
        load_settings(None, {"pipeline_id": "orders", "source_catalog": "a", "destination_catalog": "b",
                             "schema_name": "s", "checkpoint_volume": str(tmp_path / "ck"),
                             "lease": {"object_store": value}})


def test_a_store_that_cannot_be_reached_refuses_the_start_naming_it_and_holds_nothing(tmp_path: Path) -> None:
    from lakemirror.checkpoints.lease import LeaseUnreachable

    class Unreachable:
        where = "s3://lake/leases/p"

        def newest(self) -> None:
            raise ConnectionError("Could not connect to the endpoint URL: http://127.0.0.1:1/lake")

    folder = FileLeaseStore(tmp_path / "lease")
    lease = PipelineLease("p", [folder, Unreachable()], holder("a", "h1"), POLICY,  # type: ignore[list-item]
                          lambda h: True, clock=lambda: 1000.0)
    with pytest.raises(LeaseUnreachable, match=r"pipeline p: its lease at s3://lake/leases/p could not be read or "
                                               r"written \(ConnectionError: Could not connect"):
        lease.acquire()
    assert not lease.held
    newest = folder.newest()
    assert newest is not None and newest.record is not None and newest.record.released, \
        "the folder's generation taken first is given back"
