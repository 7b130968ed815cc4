"""The Spark session factory, for the three places lakemirror runs.

- ``local`` (default): embedded Spark with Delta from the cached jars; small, UI off.
- ``connect``: a Spark Connect server (``sc://host:port``) with Delta's jars and SQL extension (no
  Delta Connect plugin: lakemirror speaks SQL and DataFrame calls to it).
- ``databricks``: the session the Databricks job runtime already has.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lakemirror.daemon.settings import RuntimeSettings
from lakemirror.daemon import spark_conf_rules
from lakemirror.daemon.jars import jar_paths
from lakemirror.daemon.java_check import check_java
from lakemirror.daemon.spark_secrets import secret_properties_file, split_secret_confs
from lakemirror.object_store import needs_s3a

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")

DELTA_CONFS = {
    "spark.sql.extensions": spark_conf_rules.DELTA_EXTENSION,
    "spark.sql.catalog.spark_catalog": spark_conf_rules.DELTA_CATALOG,
}


def spark_warehouse_dir(warehouse: str) -> str:
    """Spark's own warehouse folder (``spark.sql.warehouse.dir``), inside the configured lakehouse.

    Spark creates it when a session starts, by default as ``./spark-warehouse`` in whatever folder
    the daemon was started from; lakemirror writes nothing outside its configured paths. The dot
    keeps it from being read as a catalog (catalog names cannot contain '.')."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", warehouse):
        return warehouse.rstrip("/") + "/.spark-warehouse"
    return str(Path(warehouse).expanduser().absolute() / ".spark-warehouse")


def session_jars(rt: RuntimeSettings, s3a: bool | None = None) -> list[str]:
    """The jars a local session loads: Delta's (and Kafka's), plus hadoop-aws and the AWS SDK
    bundle when ``s3a`` (default: when the warehouse is ``s3a://`` or a conf sets
    ``spark.hadoop.fs.s3a.*``).

    Only then: the bundle is about 690 MB, and loading it lengthens every session's start
    (``scripts/measure-s3-costs.py start`` times a session's start with and without it)."""
    paths = jar_paths(rt.jars_dir)
    if s3a if s3a is not None else needs_s3a([rt.warehouse], rt.spark_conf):
        paths += jar_paths(rt.jars_dir, group="s3")
    return paths


def session_confs(rt: RuntimeSettings, s3a: bool | None = None) -> dict[str, str]:
    """Every conf of a local session: lakemirror's, then the user's ``spark_conf``, which win except
    for the lists and values the session depends on (:mod:`lakemirror.daemon.spark_conf_rules`)."""
    ours = {"spark.jars": ",".join(session_jars(rt, s3a)),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(rt.shuffle_partitions),
            "spark.default.parallelism": str(rt.shuffle_partitions),
            "spark.driver.memory": rt.driver_memory,
            "spark.sql.warehouse.dir": spark_warehouse_dir(rt.warehouse),
            "spark.sql.session.timeZone": "UTC",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.sql.streaming.stopTimeout": "120s",
            "spark.scheduler.mode": "FAIR",
            "spark.log.structuredLogging.enabled": "false",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            **DELTA_CONFS}
    return spark_conf_rules.merge(ours, rt.spark_conf)


def local_session(rt: RuntimeSettings, app_name: str = "lakemirror", s3a: bool | None = None,
                  python_workers_stop: bool = False, class_archive: bool = True) -> "SparkSession":
    """The embedded session. ``python_workers_stop``: queries whose tasks run in Python workers
    (Real-Time Mode's ``foreach`` writer) are stopped while they run; the JVM's standard error then
    leaves out PySpark's tracebacks of those workers' interrupted protocol (:mod:`.jvm_stderr`).
    ``class_archive``: the JVM maps the class archive recorded for it, where there is one
    (:mod:`.class_archive`)."""
    from pyspark.sql import SparkSession

    java_version = check_java()
    # Python workers run this interpreter (lakemirror installed), not the first python3 on PATH:
    # Real-Time Mode's foreach writer (sinks/postgres/foreach.py) runs lakemirror code there.
    # PySpark takes the workers' interpreter from PYSPARK_PYTHON only; one set by the user wins.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(rt.master).appName(app_name)
    confs = session_confs(rt, s3a)
    if class_archive:
        confs = with_class_archive(confs, java_version, jar_paths(rt.jars_dir))
    # Secret confs (s3a keys, passwords, tokens, a URL with a password) go through a 0600 file, not
    # the JVM's command line.
    public, secret = split_secret_confs(confs)
    for k, v in public.items():
        builder = builder.config(k, v)
    with secret_properties_file(secret):
        if python_workers_stop and _no_context():
            _start_context(rt.master, app_name, public)
        return builder.getOrCreate()


def with_class_archive(confs: dict[str, str], java_version: str, delta_jars: list[str]) -> dict[str, str]:
    """``confs`` with the driver's Java options led by those mapping the class archive of this JVM,
    Spark and Delta's jars, where one was recorded (:mod:`.class_archive`); the options after them
    (the user's) win."""
    from lakemirror.daemon.class_archive import archive_path, java_options

    sharing = java_options(archive_path(java_version, delta_jars))
    if not sharing:
        return confs
    rest = confs.get("spark.driver.extraJavaOptions", "")
    return {**confs, "spark.driver.extraJavaOptions": f"{sharing} {rest}".strip()}


def _no_context() -> bool:
    from pyspark import SparkContext

    return SparkContext._active_spark_context is None  # noqa: SLF001 (getOrCreate's own test)


def _start_context(master: str, app_name: str, options: dict[str, str]) -> None:
    """Start the JVM and the SparkContext (which ``getOrCreate`` then takes) with the JVM's standard
    error read through :func:`~.jvm_stderr.pump` instead of inherited."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    from lakemirror.daemon.jvm_stderr import pump

    conf = SparkConf().setAll([(k, str(v)) for k, v in options.items()]).setMaster(master).setAppName(app_name)
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})  # type: ignore[no-untyped-call]
    pump(iter(gateway.proc.stderr.readline, b""), sys.stderr)
    SparkContext(conf=conf, gateway=gateway)


def connect_session(rt: RuntimeSettings) -> "SparkSession":
    from pyspark.sql import SparkSession

    assert rt.spark_remote
    return SparkSession.builder.remote(rt.spark_remote).getOrCreate()


def databricks_session() -> "SparkSession":
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    return active if active is not None else SparkSession.builder.getOrCreate()


def create_session(rt: RuntimeSettings, python_workers_stop: bool = False) -> "SparkSession":
    """The session of ``rt``'s mode; how long it took to start is logged (a daemon's start waits for it)."""
    started = time.monotonic()
    if rt.mode == "local":
        session = local_session(rt, python_workers_stop=python_workers_stop)
    elif rt.mode == "connect":
        session = connect_session(rt)
    else:
        session = databricks_session()
    log.info("Spark session (%s mode) ready in %.1fs", rt.mode, time.monotonic() - started)
    return session
