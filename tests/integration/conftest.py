"""Integration fixtures: ONE small local Spark with Delta for the whole session, and a harness
that runs a real pipeline (supervisor, runners, streaming queries) against a temp lakehouse."""

from __future__ import annotations

import os
import time
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
from tests.services import S3Bucket

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
        for name in names:  # the checkpoint rows the pipeline's row writer holds, appended too
            rows = getattr(getattr(self.runner(name), "ctx", None), "round_rows", None)
            assert rows is None or rows.flush(timeout), f"{name}: the checkpoint rows were not appended"

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


def lose_commit_entry(commits: Path, batch: int | str, missing_ok: bool = False) -> None:
    """Remove ``batch``'s entry from a query's commit log (``commits``), as a crash after the batch's
    write and before Spark's commit entry leaves the log, with the checksum file the local file system
    keeps beside the entry (left behind, it refuses the entry's rewrite). ``missing_ok``: the entry
    may never have been written."""
    (commits / str(batch)).unlink(missing_ok=missing_ok)
    (commits / f".{batch}.crc").unlink(missing_ok=True)


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
