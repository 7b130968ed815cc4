"""A recovery point across two continuously replicated tables on real Spark and Delta: a writer
commits each order, then its lines; the lines' replica is held back while orders go on. The latest
replica versions then show orders without their lines; the cut shows both tables exactly as the
sources were at one instant, with no order missing its lines and no lines missing their order, and
is pinned as shallow clones a failover can read."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror import tables
from lakemirror.daemon.recovery import cut_json, pin_cut
from lakemirror.identifiers import TableName

pytestmark = pytest.mark.integration


def step(p: Any, i: int) -> None:
    p.sql("orders", f"INSERT INTO {{t}} VALUES ({i}, {10 * i})")
    p.sql("lines", f"INSERT INTO {{t}} VALUES ({i}, 1, {i}), ({i}, 2, {i + 100})")


def source_as_of(p: Any, table: str, at: float) -> list[tuple[Any, ...]]:
    """The source's rows at the newest version committed at or before ``at``."""
    loc = p.source(table)
    history = tables.history(p.spark, loc).select("version", "timestamp").collect()
    version = max(int(r["version"]) for r in history if r["timestamp"].timestamp() <= at)
    df = p.spark.read.format("delta").option("versionAsOf", version).load(loc.path)
    return sorted(tuple(r) for r in df.collect())


def replica_at(p: Any, table: str, version: int) -> list[tuple[Any, ...]]:
    df = p.spark.read.format("delta").option("versionAsOf", version).load(p.replica(table).path)
    return sorted(tuple(r) for r in df.select("order_id", *[c for c in df.columns if c != "order_id"]).collect())


def orphans(orders: list[tuple[Any, ...]], lines: list[tuple[Any, ...]]) -> set[int]:
    return {o[0] for o in orders} ^ {ln[0] for ln in lines}


@pytest.mark.slow
def test_a_cut_across_orders_and_lines(pipeline: Any) -> None:
    p = pipeline
    p.create("orders", "order_id INT, total INT", key="order_id")
    p.create("lines", "order_id INT, line_no INT, qty INT", key="order_id,line_no")
    p.start()
    p.wait_caught_up("orders", "lines")
    for i in (1, 2, 3):
        step(p, i)  # committed before the streams apply them: batches of several versions each
    p.wait_caught_up("orders", "lines")
    assert p.app.supervisor.command("pause", "lines")
    p.tick_until(lambda: p.views()["lines"].state == "paused", what="lines paused")
    for i in (4, 5):
        step(p, i)
    p.wait_caught_up("orders")
    p.stop()  # the cut reads the checkpoint table and the histories; no stream needs to run for it

    # Failing over to the newest version of each replica would show orders 4 and 5 without lines.
    latest_orders = sorted(tuple(r) for r in tables.read(p.spark, p.replica("orders")).collect())
    latest_lines = sorted(tuple(r) for r in tables.read(p.spark, p.replica("lines")).collect())
    assert orphans(latest_orders, latest_lines) == {4, 5}

    for use_source in (True, False):
        cut = cut_json(p.app, None, "lines", None, use_source=use_source)
        versions = {t["table"]: t["replica_version"] for t in cut["tables"]}
        at = cut["as_of_epoch_seconds"]
        orders, lines = replica_at(p, "orders", versions["orders"]), replica_at(p, "lines", versions["lines"])
        assert orphans(orders, lines) == set(), cut
        assert {o[0] for o in orders} == {1, 2, 3}
        assert orders == source_as_of(p, "orders", at) and lines == sorted(
            (r[0], r[1], r[2]) for r in source_as_of(p, "lines", at)), cut

    # Without an anchor the newest common instant may fall between an order and its lines: the cut
    # still shows each source exactly as it was then.
    free = cut_json(p.app, None, None, None)
    at = free["as_of_epoch_seconds"]
    for t in free["tables"]:
        got = replica_at(p, t["table"], t["replica_version"])
        want = source_as_of(p, t["table"], at)
        assert got == (want if t["table"] == "orders" else sorted((r[0], r[1], r[2]) for r in want))

    pinned = pin_cut(p.app, cut, "recovery")
    assert [x["status"] for x in pinned] == ["success", "success"], pinned
    for x in pinned:
        table = TableName.parse(x["pinned"]).table
        rows = sorted(tuple(r) for r in tables.read(p.spark, p.app.catalog.locate(TableName.parse(x["pinned"])))
                      .select("order_id", *[c for c in ("total", "line_no", "qty")
                                            if c in tables.read(p.spark, p.replica(table)).columns]).collect())
        assert rows == replica_at(p, table, x["version"])


def test_inputs_read_from_real_tables_and_an_older_checkpoint_table(spark: Any, tmp_path: Any) -> None:
    """The mechanism without streams (a few seconds): batch commits tagged as the apply paths tag them,
    checkpoint rows appended to a checkpoint table created before the commit-time columns existed (it
    gains them), and the cut read back from those tables and the sources' histories."""
    from datetime import datetime, timezone

    from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
    from lakemirror.checkpoints.records import CHECKPOINT_DDL, CheckpointRow
    from lakemirror.sinks.txn import TxnId, transaction
    from lakemirror.sources.catalog import LocalCatalog
    from lakemirror.supervisor.recovery.recovery_inputs import RecoveryPoints

    catalog = LocalCatalog(tmp_path / "lakehouse")
    loc = lambda fqn: catalog.locate(TableName.parse(fqn))  # noqa: E731
    old_ddl = CHECKPOINT_DDL.replace(", first_version_at TIMESTAMP, last_version_at TIMESTAMP", "")
    assert old_ddl != CHECKPOINT_DDL
    checkpoint = loc("dst.continuous_sync.checkpoints")
    now = datetime.now(timezone.utc)
    old_row = ("p", "src.s.orders", "dst.s.orders", 1, 99, "old-app", 1, 1, 1, 1, 1, 1, 0, 0, 0.0, None, False, now, now)
    tables.write(spark.createDataFrame([old_row], old_ddl), checkpoint, "append")
    store = DeltaCheckpointStore(spark, checkpoint)

    def commit_times(fqn: str) -> dict[int, float]:
        return {int(r["version"]): r["timestamp"].timestamp()
                for r in tables.history(spark, loc(fqn)).select("version", "timestamp").collect()}

    for name, ddl in (("orders", "order_id INT"), ("lines", "order_id INT, line_no INT")):
        spark.sql(f"CREATE TABLE {loc(f'src.s.{name}').sql} ({ddl}) USING DELTA")
        spark.sql(f"CREATE TABLE {loc(f'dst.s.{name}').sql} ({ddl}) USING DELTA")
    for i in (1, 2, 3):  # version i of each source: step i
        spark.sql(f"INSERT INTO {loc('src.s.orders').sql} VALUES ({i})")
        spark.sql(f"INSERT INTO {loc('src.s.lines').sql} VALUES ({i}, 1)")
    # orders applied in batches (1..2), (3); lines in (1), (2..3) and nothing since
    for name, batches in (("orders", [(1, 2), (3, 3)]), ("lines", [(1, 1), (2, 3)])):
        times = commit_times(f"src.s.{name}")
        app = f"lakemirror/p/src__s__{name}/e1"
        for batch_id, (first, last) in enumerate(batches):
            with transaction(spark, TxnId(app, batch_id)):
                ids = ", ".join(f"({i}{', 1' if name == 'lines' else ''})" for i in range(first, last + 1))
                spark.sql(f"INSERT INTO {loc(f'dst.s.{name}').sql} VALUES {ids}")
            at = lambda v: datetime.fromtimestamp(times[v], timezone.utc)  # noqa: E731
            store.append(CheckpointRow("p", f"src.s.{name}", f"dst.s.{name}", 1, batch_id, app, first, last, last,
                                       last - first + 1, last - first + 1, last - first + 1, 0, 0, 0.0, None, False,
                                       now, now, at(first), at(last)), known_new=True)

    points = RecoveryPoints(spark, catalog.locate, checkpoint, "p")
    cut = points.cut(anchor="lines")
    lines_t, orders_t = commit_times("src.s.lines"), commit_times("src.s.orders")
    # lines' last batch (2..3) starts exact at its v3; orders' batch (3) is exact from its v3 on
    assert cut.point.as_of == lines_t[3] and lines_t[3] >= orders_t[3]
    assert {t.table: (t.source_version, t.replica_version) for t in cut.point.tables} == {
        "orders": (3, 2), "lines": (3, 2)}
    with pytest.raises(Exception, match="lines: that instant falls inside a batch"):
        points.cut(at=lines_t[2], use_source=False)
