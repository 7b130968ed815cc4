"""The change stream through Delta's Kernel-based source (``kernel_change_feed``) against
``DeltaSource``: the same change rows, and one query checkpoint continued by either, back and
forth, with no change row lost or read twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sources import change_feed
from lakemirror.tables import TableLocation

pytestmark = pytest.mark.integration


def _changes(spark: Any, loc: TableLocation, checkpoint: Path, after: int, kernel: bool) -> tuple[list[Any], str]:
    """Every change row the stream serves from its checkpoint on (one ``availableNow`` run), and
    the source's description in the query's progress."""
    rows: list[Any] = []

    def collect(batch: Any, batch_id: int) -> None:
        if kernel:
            change_feed.leave_kernel_mode(batch.sparkSession)
        rows.extend(tuple(r) for r in batch.select("_commit_version", "_change_type", "id", "v").collect())

    query = (change_feed.change_stream(spark, loc, after, kernel=kernel).writeStream
             .option("checkpointLocation", str(checkpoint)).foreachBatch(collect)
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    progress = [p for p in query.recentProgress if p["sources"]]
    return rows, progress[-1]["sources"][0]["description"] if progress else ""


def _source(spark: Any, path: Path, rows: str) -> tuple[TableLocation, int]:
    """A source with the change feed on at ``path`` holding ``rows`` (a query), and its version."""
    loc = TableLocation(TableName("src", "s", path.name), str(path))
    spark.sql(f"CREATE TABLE {loc.sql} (id BIGINT, v STRING) USING delta "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"INSERT INTO {loc.sql} {rows}")
    return loc, int(tables.delta_table(spark, loc).history(1).collect()[0]["version"])


def test_one_checkpoint_continued_by_either_source_serves_every_change_once(spark, tmp_path):
    loc, after = _source(spark, tmp_path / "k", "SELECT id, 'a' FROM range(0, 50)")
    checkpoint = tmp_path / "checkpoint"
    served: list[Any] = []
    descriptions = {}
    for round_, kernel in enumerate([False, True, False, True]):
        # several versions per round, some with several files: an insert, an update, a delete
        spark.range(100 * round_, 100 * round_ + 30, numPartitions=3).selectExpr("id", "'i' AS v").write.format("delta") \
            .mode("append").save(loc.path)
        spark.sql(f"UPDATE {loc.sql} SET v = 'u{round_}' WHERE id % 7 = {round_}")
        spark.sql(f"DELETE FROM {loc.sql} WHERE id % 11 = {round_}")
        rows, descriptions[kernel] = _changes(spark, loc, checkpoint, after, kernel)
        assert rows, f"round {round_} served nothing"
        served += rows
    expected = [tuple(r) for r in tables.read(spark, loc, readChangeFeed="true", startingVersion=str(after + 1))
                .select("_commit_version", "_change_type", "id", "v").collect()]
    assert Counter(served) == Counter(expected), "every change row of every version once, whichever source read it"
    assert descriptions[False].startswith("DeltaSource"), descriptions
    assert not descriptions[True].startswith("DeltaSource"), f"the Kernel-based source: {descriptions}"


def test_the_kernel_mode_stays_in_the_streams_own_session(spark, tmp_path):
    loc, after = _source(spark, tmp_path / "m", "VALUES (1, 'a')")
    rows, _ = _changes(spark, loc, tmp_path / "checkpoint", after, kernel=True)
    assert rows == [] and spark.conf.get(change_feed.KERNEL_MODE, None) in (None, "NONE"), "the caller's session untouched"
    name = change_feed.feed_table(spark, loc.path)
    assert name == change_feed.feed_table(spark, loc.path), "registered once, under a name of its path"
    spark.sql(f"INSERT INTO {loc.sql} VALUES (2, 'b')")
    rows, _ = _changes(spark, loc, tmp_path / "checkpoint", after, kernel=True)
    assert [r[2:] for r in rows] == [(2, "b")]
