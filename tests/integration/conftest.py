"""Integration fixtures: ONE small local Spark with Delta for the whole session, and a harness
that runs a real pipeline (supervisor, runners, streaming queries) against a temp lakehouse."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry

from lakemirror import tables
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.metrics import Metrics
from lakemirror.delta_log.commit_files import local_log_dir
from lakemirror.delta_log.layout import newest_commit
from lakemirror.identifiers import TableName, quote
from tests.integration.postgres_server import postgres  # noqa: F401 (the session's PostgreSQL, for the Postgres sink)

pytestmark = pytest.mark.integration


class Pipeline:
    """A real pipeline on a temp lakehouse, driven tick by tick from the test."""

    def __init__(self, spark: Any, root: Path, **settings: Any) -> None:
        self.spark = spark
        self.root = root
        base: dict[str, Any] = {
            "pipeline_id": "test", "source_catalog": "src", "destination_catalog": "dst",
            "schema_name": "sales", "checkpoint_volume": str(root / "checkpoints"),
            "trigger_interval_seconds": 0.5, "lag_interval_seconds": 0.5,
            "runtime": {"mode": "local", "warehouse": str(root / "lakehouse")},
            "http": {"port": 0},
            "restart": {"base_delay_seconds": 0.5, "max_delay_seconds": 2, "jitter": 0.0},
        }
        base.update(settings)
        self.settings = load_settings(None, base)
        self.app = self._new_app()

    def _new_app(self) -> DaemonContext:
        return DaemonContext(self.settings).replace(
            spark=self.spark, metrics=Metrics("test", CollectorRegistry()))

    # -- sources --------------------------------------------------------------------------------

    def source(self, table: str) -> tables.TableLocation:
        return self.app.catalog.locate(TableName("src", "sales", table))

    def replica(self, table: str) -> tables.TableLocation:
        return self.app.catalog.locate(TableName("dst", "sales", table))

    def create(self, table: str, ddl: str, key: str | None = None, cdf: bool = True) -> None:
        loc = self.source(table)
        props = [f"'delta.enableChangeDataFeed' = '{'true' if cdf else 'false'}'"]
        if key:
            props.append(f"'lakemirror.primaryKey' = '{key}'")
        self.spark.sql(f"CREATE TABLE {loc.sql} ({ddl}) USING DELTA TBLPROPERTIES ({', '.join(props)})")

    def sql(self, table: str, statement: str) -> None:
        """Run ``statement`` with ``{t}`` replaced by the source table's SQL name."""
        self.spark.sql(statement.format(t=self.source(table).sql))

    def latest_version(self, table: str) -> int:
        local = self.local_latest_version(table)
        if local is not None:
            return local
        return int(tables.delta_table(self.spark, self.source(table)).history(1).collect()[0]["version"])

    def local_latest_version(self, table: str) -> int | None:
        """A local source's newest version: the highest commit file of its log, read without a Spark
        job (tests poll it while they wait, beside the streams they wait for); None elsewhere."""
        log_dir = local_log_dir(self.source(table))
        return None if log_dir is None else newest_commit(log_dir)

    # -- the daemon -----------------------------------------------------------------------------

    def start(self) -> None:
        self.app.supervisor.start()

    def tick_until(self, predicate: Any, timeout: float = 90.0, what: str = "condition") -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.app.supervisor.tick()
            if predicate():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; views: {self.views()}")

    def views(self) -> dict[str, Any]:
        return {v.table: v for v in self.app.supervisor.views()}

    def runner(self, table: str) -> Any:
        return self.app.supervisor._tables[table].runner  # noqa: SLF001 (test introspection)

    def caught_up(self, *names: str) -> bool:
        views = self.views()
        for name in names:
            v = views.get(name)
            if v is None or v.state != "running":
                return False
            through = self.runner(name).applied_through
            if through is None or through < self.latest_version(name):
                return False
        return True

    def wait_caught_up(self, *names: str, timeout: float = 120.0) -> None:
        self.tick_until(lambda: self.caught_up(*names), timeout, f"{names} to catch up")

    def stop(self) -> None:
        self.app.supervisor.shutdown()

    def restart(self) -> None:
        """A new daemon process, as far as lakemirror's state goes: fresh app, same folders."""
        self.stop()
        self.app = self._new_app()
        self.start()

    # -- checks ---------------------------------------------------------------------------------

    def rows(self, loc: tables.TableLocation, columns: list[str] | None = None) -> list[tuple[Any, ...]]:
        df = tables.read(self.spark, loc)
        if columns:
            df = df.select(*[quote(c) for c in columns])
        return sorted((tuple(r) for r in df.collect()), key=repr)

    def assert_replica_equals_source(self, table: str) -> None:
        src = tables.read(self.spark, self.source(table))
        want = self.rows(self.source(table))
        got = self.rows(self.replica(table), src.columns)
        assert got == want, f"{table}: replica differs from source:\n missing {set(want) - set(got)}\n extra {set(got) - set(want)}"
        assert len(got) == len(set(got)), f"{table}: duplicate rows in replica"


@pytest.fixture
def pipeline(spark: Any, tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(spark, tmp_path)
    yield p
    p.stop()


@pytest.fixture
def make_pipeline(spark: Any, tmp_path: Path) -> Iterator[Any]:
    made: list[Pipeline] = []

    def make(**settings: Any) -> Pipeline:
        p = Pipeline(spark, tmp_path / f"p{len(made)}", **settings)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server on loopback, started by the project's own script (Delta's jars and SQL
    extension, no Delta Connect plugin) and stopped at the end; yields its ``sc://`` address. Started
    only by the tests that ask for it (a second JVM, about 20 s)."""
    import socket
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts" / "connect-server.sh"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    logs = tmp_path_factory.mktemp("connect-server")
    started = subprocess.run([str(script), "start", port, str(logs)], capture_output=True, text=True, check=False)
    if started.returncode != 0:
        raise RuntimeError(f"scripts/connect-server.sh start failed: {started.stderr.strip()[-2000:]}")
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        subprocess.run([str(script), "stop", port, str(logs)], capture_output=True, text=True, check=False)


# -- object storage: a local S3-compatible server (moto), once per session ---------------------

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class S3Bucket:
    """A bucket on the session's local S3 server; the Spark session's Hadoop conf points at it."""

    endpoint: str
    bucket: str
    hadoop_conf: dict[str, str]

    def uri(self, *parts: str) -> str:
        """``s3a://<bucket>/<parts>``."""
        return "/".join((f"s3a://{self.bucket}", *parts))

    def fresh(self, name: str) -> str:
        """A new, unused prefix of the bucket (one per test), as an ``s3a://`` URI."""
        return self.uri(f"{name}-{uuid.uuid4().hex[:8]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_bucket(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Bucket]:
    """scripts/s3-server.sh starts moto's S3 server on loopback; a bucket is created on it and the
    shared Spark session's Hadoop configuration is pointed at it (s3a confs can be set at run
    time; hadoop-aws itself must have been loaded at start, which tests/conftest.py does when
    `make setup` cached it)."""
    import boto3

    if not spark._jvm.org.apache.spark.util.Utils.classIsLoadable("org.apache.hadoop.fs.s3a.S3AFileSystem"):
        pytest.fail("hadoop-aws is not in the test session: run `make setup` (it caches the s3 jars)")
    port = _free_port()
    env = {"LAKEMIRROR_S3_RUN_DIR": str(tmp_path_factory.mktemp("s3-server"))}
    script = str(REPO / "scripts" / "s3-server.sh")
    started = subprocess.run([script, "start", str(port)], env={**os.environ, **env},
                             capture_output=True, text=True, check=False)
    if started.returncode != 0:
        pytest.fail(f"scripts/s3-server.sh could not start: {started.stderr.strip()}")
    endpoint = started.stdout.strip()
    bucket = "lakemirror-tests"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=bucket)
    conf = {
        "fs.s3a.endpoint": endpoint, "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.path.style.access": "true", "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "fs.s3a.access.key": "test", "fs.s3a.secret.key": "test",
    }
    hadoop = spark._jsc.hadoopConfiguration()
    for k, v in conf.items():
        hadoop.set(k, v)
    try:
        yield S3Bucket(endpoint, bucket, conf)
    finally:
        for k in conf:
            hadoop.unset(k)
        subprocess.run([script, "stop", str(port)], env={**os.environ, **env}, check=False)


@pytest.fixture
def s3_pipeline(spark: Any, s3_bucket: S3Bucket, tmp_path: Path) -> Iterator[Any]:
    """Makes pipelines whose lakehouse is a fresh prefix of the S3 bucket (the local
    ``checkpoint_volume`` stays under ``tmp_path``)."""
    made: list[Pipeline] = []

    def make(**settings: Any) -> Pipeline:
        warehouse = s3_bucket.fresh("lakehouse")
        p = Pipeline(spark, tmp_path / f"p{len(made)}",
                     runtime={"mode": "local", "warehouse": warehouse}, **settings)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


def vacuum_everything(pipeline: Any, table: str) -> None:
    """VACUUM a source table with no retention, as an expired change window leaves it."""
    spark = pipeline.spark
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        pipeline.sql(table, "VACUUM {t} RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")


def age_commits(pipeline: Any, table: str, seconds: float) -> None:
    """Make every commit of a source table ``seconds`` old, instead of waiting that long: Delta and
    lakemirror take a commit's time from its log file's modification time (tables without in-commit
    timestamps), so Delta's retention check and the change window see the commits as that old."""
    old = time.time() - seconds
    for f in (Path(pipeline.source(table).path) / "_delta_log").glob("*.json"):
        os.utime(f, (old, old))
