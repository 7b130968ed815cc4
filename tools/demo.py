"""`lakemirror demo`: a live replica of a changing schema on the embedded lakehouse.

Creates ``demo.shop`` with three CDF-enabled tables (one keyed by ``id``, one by a declared
composite key, one by its first NOT NULL column), a writer that keeps inserting, updating,
deleting and re-inserting rows, and the daemon replicating ``demo.shop`` into
``demo_mirror.shop``. Per-table state and lag refresh on screen until Ctrl-C (or ``--duration``);
then the writer stops, the daemon catches up and drains, and the replicas are compared with the
sources row for row.
"""

from __future__ import annotations

import random
import shutil
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from lakemirror.daemon.preflight import DEMO_PORT_SETTING
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.status import render_table
from lakemirror.identifiers import TableName
from lakemirror.sql_exec import run_sql
from lakemirror.tools.live_run import run_live, show, start_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.supervisor.control.loop import Supervisor, TableView

TABLES = {
    "customers": ("id BIGINT NOT NULL, name STRING, tier STRING, balance DOUBLE", None),
    "order_items": ("order_id BIGINT NOT NULL, line_no INT NOT NULL, sku STRING, qty INT, note STRING",
                    "order_id,line_no"),
    "inventory": ("sku STRING NOT NULL, warehouse STRING, on_hand INT", None),
}


def demo_config(workdir: Path, http_port: int) -> dict[str, object]:
    return {
        "pipeline_id": "demo", "source_catalog": "demo", "destination_catalog": "demo_mirror",
        "schema_name": "shop", "checkpoint_volume": str(workdir / "checkpoints"),
        "trigger_interval_seconds": 1, "allow_schema_evolution": True, "lag_interval_seconds": 1,
        "discover_interval_seconds": 10,
        "runtime": {"mode": "local", "warehouse": str(workdir / "lakehouse"), "master": "local[2]"},
        "http": {"host": "127.0.0.1", "port": http_port},
        "restart": {"base_delay_seconds": 1, "max_delay_seconds": 30},
    }


def create_sources(spark: "SparkSession", app: "DaemonContext") -> None:
    for table, (ddl, key) in TABLES.items():
        loc = app.catalog.locate(TableName("demo", "shop", table))
        assert loc.path is not None
        Path(loc.path).parent.mkdir(parents=True, exist_ok=True)
        props = "'delta.enableChangeDataFeed' = 'true'" + (f", 'lakemirror.primaryKey' = '{key}'" if key else "")
        run_sql(spark, f"CREATE TABLE {loc.sql} ({ddl}) USING DELTA TBLPROPERTIES ({props})")


class DemoWriter:
    """Commits a random mix of upserts, deletes and re-inserts to every demo table each second."""

    def __init__(self, spark: "SparkSession", app: "DaemonContext", seed: int = 7) -> None:
        self.spark = spark
        self.app = app
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.commits = 0
        self.thread = threading.Thread(target=self._loop, name="demo-writer", daemon=True)

    def _sql(self, table: str) -> str:
        loc = self.app.catalog.locate(TableName("demo", "shop", table))
        return loc.sql

    def _loop(self) -> None:
        while not self.stop.is_set():
            for table in TABLES:
                if self.stop.is_set():
                    break
                try:
                    self.write_once(table)
                except Exception as exc:  # keep writing: a demo writer must not die silently
                    print(f"demo writer: {table}: {str(exc).splitlines()[0]}", file=sys.stderr)
            self.stop.wait(1.0)

    def write_once(self, table: str) -> None:
        r, t = self.rng, self._sql(table)
        roll = r.random()
        if table == "customers":
            if roll < 0.75:
                # distinct ids: a MERGE inserts every unmatched source row, so a repeated id would
                # give the *source* two rows for one key, which no keyed replica can mirror
                rows = ", ".join(f"({key}, 'name-{r.randint(1, 9999)}', "
                                 f"'{r.choice(['gold', 'silver', 'bronze'])}', {r.uniform(0, 500):.2f})"
                                 for key in r.sample(range(1, 401), r.randint(1, 20)))
                run_sql(self.spark, f"MERGE INTO {t} AS t USING (SELECT * FROM VALUES {rows} AS v(id, name, tier, balance)) AS s "
                                    f"ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
            else:
                run_sql(self.spark, f"DELETE FROM {t} WHERE id % 23 = {r.randint(0, 22)}")
        elif table == "order_items":
            if roll < 0.8:
                order = r.randint(1, 120)
                rows = ", ".join(f"({order}, {line}, 'sku-{r.randint(1, 50)}', {r.randint(1, 9)}, "
                                 f"{'NULL' if r.random() < 0.3 else repr('gift')})"
                                 for line in range(1, r.randint(2, 6)))
                run_sql(self.spark, f"MERGE INTO {t} AS t USING (SELECT * FROM VALUES {rows} AS v(order_id, line_no, sku, qty, note)) AS s "
                                    f"ON t.order_id = s.order_id AND t.line_no = s.line_no "
                                    f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
            else:
                run_sql(self.spark, f"DELETE FROM {t} WHERE order_id = {r.randint(1, 120)}")
        else:
            sku = f"sku-{r.randint(1, 50)}"
            if roll < 0.85:
                run_sql(self.spark, f"MERGE INTO {t} AS t USING (SELECT '{sku}' AS sku, 'wh-{r.randint(1, 3)}' AS "
                                    f"warehouse, {r.randint(0, 100)} AS on_hand) AS s ON t.sku = s.sku "
                                    f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
            else:
                run_sql(self.spark, f"DELETE FROM {t} WHERE sku = '{sku}'")
        self.commits += 1


def compare(spark: "SparkSession", app: "DaemonContext") -> dict[str, tuple[int, int, int]]:
    """Per table: (source rows, replica rows, rows differing in either direction)."""
    from lakemirror import tables

    out = {}
    for table in TABLES:
        src = tables.read(spark, app.catalog.locate(TableName("demo", "shop", table)))
        dst = tables.read(spark, app.catalog.locate(TableName("demo_mirror", "shop", table)))
        dst = dst.select(*src.columns)
        diff = src.exceptAll(dst).count() + dst.exceptAll(src).count()
        out[table] = (src.count(), dst.count(), diff)
    return out


def run_demo(workdir: Path, duration: float | None, http_port: int) -> int:
    from lakemirror.daemon.context import DaemonContext

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    settings = load_settings(None, demo_config(workdir, http_port))
    app = DaemonContext(settings)
    spark = start_spark(app, DEMO_PORT_SETTING)
    create_sources(spark, app)
    writer = DemoWriter(spark.newSession(), app)

    def draw(views: "list[TableView]", tty: bool) -> None:
        header = (f"lakemirror demo: demo.shop -> demo_mirror.shop   writer commits: {writer.commits}   "
                  f"metrics: {app.server.url}/metrics")
        show(header + ("\n\n" if tty else "\n") + render_table([asdict(v) for v in views]), tty)

    def catch_up(sup: "Supervisor") -> None:
        deadline = time.time() + 180
        while time.time() < deadline:
            sup.tick()
            views = sup.views()
            if views and all(v.state == "running" and v.versions_behind == 0 for v in views):
                break
            time.sleep(0.5)

    run_live(app, writer, draw, duration, catch_up)
    result = compare(spark, app)
    ok = True
    for table, (n_src, n_dst, diff) in result.items():
        verdict = "EQUAL" if diff == 0 and n_src == n_dst else "DIFFERENT"
        ok &= verdict == "EQUAL"
        print(f"  demo.shop.{table:<12} source {n_src:>5} rows, replica {n_dst:>5} rows: {verdict}")
    print("replica == source for every table" if ok else "REPLICA DIFFERS FROM SOURCE")
    return 0 if ok else 1
