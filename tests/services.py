"""The services a test run shares, each started once per test process (per xdist worker) and only when
a test asks for it: a Kafka broker, a Spark Connect server and an S3 server (moto's) on loopback;
PostgreSQL's is in ``tests/integration/postgres_server.py``.

They are defined here and imported by ``tests/conftest.py`` only: a session fixture is one instance per
definition, so a test module that imported one of them again would start a second server. For the
S3 server that also points the shared Spark session's ``fs.s3a.*`` settings at the second server
mid-run, while Hadoop's cached s3a file system keeps writing to the first: delta-rs, which follows
the settings, then finds no table where Spark wrote one ("No files in log segment")."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """ONE single-node KRaft Kafka broker (scripts/kafka.sh) on loopback for the whole run: its
    ``host:port``. Each test makes topics of its own names."""
    pytest.importorskip("kafka", reason="kafka-python is in the test extras: pip install -e '.[test]'")
    fetched = subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "fetch"], capture_output=True, text=True)
    if fetched.returncode != 0:
        pytest.skip(f"the broker's jars could not be resolved (scripts/kafka.sh fetch): {fetched.stderr.strip()[-200:]}")
    folder = tmp_path_factory.mktemp("kafka")
    port = _free_port()
    subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "start", str(folder), str(port), str(_free_port())], check=True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "stop", str(folder)], check=False)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server on loopback, started by the project's own script (Delta's jars and SQL
    extension, no Delta Connect plugin) and stopped at the end; yields its ``sc://`` address. Started
    only by the tests that ask for it (a second JVM, about 20 s)."""
    script = ROOT / "scripts" / "connect-server.sh"
    port = str(_free_port())
    logs = tmp_path_factory.mktemp("connect-server")
    started = subprocess.run([str(script), "start", port, str(logs)], capture_output=True, text=True, check=False)
    if started.returncode != 0:
        raise RuntimeError(f"scripts/connect-server.sh start failed: {started.stderr.strip()[-2000:]}")
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        subprocess.run([str(script), "stop", port, str(logs)], capture_output=True, text=True, check=False)


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
    script = str(ROOT / "scripts" / "s3-server.sh")
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
