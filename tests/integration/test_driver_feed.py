"""The driver path's delta-rs read of a batch holds exactly the rows Spark planned for it."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.identifiers import TableName

pytestmark = pytest.mark.integration

COLUMNS = ["id", "v", "p", "ts", "d", "_change_type", "_commit_version", "_commit_timestamp"]


def _rows(table: Any) -> list[tuple]:
    """Comparable rows of an Arrow table: the change rows, commit times to the second."""
    data = table.select(COLUMNS).to_pylist()
    return sorted(((r["id"], r["v"], r["p"], r["ts"], r["d"], r["_change_type"], r["_commit_version"])
                   for r in data), key=repr)


def _history(spark, source) -> None:
    """Commits of every kind the change feed serves: multi-file appends, updates, a whole-partition
    delete, a compaction, a MERGE, a property change and a one-row delete."""
    t = source.sql
    row = "CAST(id % 3 AS INT) p, current_timestamp() ts, CAST(id / 4 AS DECIMAL(10,2)) d"
    spark.sql(f"INSERT INTO {t} SELECT id, 'a' v, {row} FROM range(30)")
    spark.sql(f"UPDATE {t} SET v = 'b' WHERE id < 5")
    spark.sql(f"DELETE FROM {t} WHERE p = 2")
    spark.sql(f"OPTIMIZE {t}")
    spark.range(100, 160).selectExpr("id", "'c' v", *row.split(", ")).repartition(6) \
        .write.format("delta").mode("append").save(source.path)
    spark.sql(f"MERGE INTO {t} t USING (SELECT id, 'm' v FROM range(0, 200, 7)) s ON t.id = s.id "
              "WHEN MATCHED AND s.id % 2 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET v = s.v "
              "WHEN NOT MATCHED THEN INSERT (id, v, p) VALUES (s.id, s.v, 1)")
    spark.sql(f"ALTER TABLE {t} SET TBLPROPERTIES ('lakemirror.test' = 'x')")
    spark.sql(f"DELETE FROM {t} WHERE id = 101")
    spark.sql(f"UPDATE {t} SET v = 'e' WHERE id > 150")


@pytest.mark.parametrize("max_files", [None, 2])
def test_every_batch_read_by_delta_rs_holds_exactly_sparks_rows(spark, tmp_path, max_files):
    """A stream over every kind of commit, with and without a rate limit that splits appends:
    each batch the feed reads equals the batch Spark planned, row for row; the batches it leaves
    to Spark are the ones with part of a version or a metadata change, and no others."""
    from lakemirror.sinks.merge.planner import UPDATE_PRE
    from lakemirror.sources import change_feed
    from lakemirror.sinks.accelerator.batch_feed import BatchFeed
    from lakemirror.tables import TableLocation

    source = TableLocation(TableName("src", "s", "feed"), str(tmp_path / "source"))
    spark.sql(f"CREATE TABLE {source.sql} (id BIGINT, v STRING, p INT, ts TIMESTAMP, d DECIMAL(10,2)) USING DELTA "
              "PARTITIONED BY (p) TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    _history(spark, source)
    checkpoint = str(tmp_path / "checkpoint")
    after = 0
    feed = BatchFeed.for_stream(checkpoint, source, after)
    assert feed is not None
    options = {"maxFilesPerTrigger": max_files} if max_files else {}
    outcomes: dict[int, tuple[list[tuple], list[tuple] | None]] = {}

    def each(batch, batch_id: int) -> None:
        planned = batch.where(f"_change_type != '{UPDATE_PRE}'").select(*COLUMNS).toArrow()
        read = feed.read(batch_id, COLUMNS, 10_000)
        outcomes[batch_id] = (_rows(planned), None if read is None else _rows(read))
        if read is not None:
            assert read.schema.field("_commit_version").type == planned.schema.field("_commit_version").type
            times = zip(sorted(read["_commit_timestamp"].to_pylist()), sorted(planned["_commit_timestamp"].to_pylist()))
            assert all(abs((a - b).total_seconds()) < 1.0 for a, b in times), "commit times agree within a second"

    query = (change_feed.change_stream(spark, source, after, options).writeStream
             .option("checkpointLocation", checkpoint).foreachBatch(each).trigger(availableNow=True).start())
    query.awaitTermination()
    by_delta_rs = [b for b, (_, read) in outcomes.items() if read is not None]
    for batch_id, (planned, read) in outcomes.items():
        if read is not None:
            assert read == planned, f"batch {batch_id}"
    assert sum(len(p) for p, _ in outcomes.values()) > 100
    if max_files is None:
        # One batch holds every version, the property change among them: Spark reads it.
        assert by_delta_rs == []
    else:
        # The appends are split; the UPDATE, the whole-partition delete, the MERGE's batch and
        # the last two (after the property change) are whole versions.
        assert len(by_delta_rs) >= 4, outcomes.keys()
        assert len(by_delta_rs) < len(outcomes)


def test_a_stream_after_a_property_change_reads_its_whole_versions_with_delta_rs(spark, tmp_path):
    """Started after the history (as a restarted table's query is), its batches hold only data
    commits: delta-rs reads each, and they equal Spark's."""
    from lakemirror.sinks.merge.planner import UPDATE_PRE
    from lakemirror.sources import change_feed
    from lakemirror.sinks.accelerator.batch_feed import BatchFeed
    from lakemirror.tables import TableLocation

    source = TableLocation(TableName("src", "s", "feed2"), str(tmp_path / "source"))
    spark.sql(f"CREATE TABLE {source.sql} (id BIGINT, v STRING, p INT, ts TIMESTAMP, d DECIMAL(10,2)) USING DELTA "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    _history(spark, source)
    after = 7  # the property change
    checkpoint = str(tmp_path / "checkpoint")
    feed = BatchFeed.for_stream(checkpoint, source, after)
    assert feed is not None
    results: list[tuple[list[tuple], list[tuple] | None]] = []

    def each(batch, batch_id: int) -> None:
        planned = batch.where(f"_change_type != '{UPDATE_PRE}'").select(*COLUMNS).toArrow()
        read = feed.read(batch_id, COLUMNS, 10_000)
        results.append((_rows(planned), None if read is None else _rows(read)))

    query = (change_feed.change_stream(spark, source, after).writeStream
             .option("checkpointLocation", checkpoint).foreachBatch(each).trigger(availableNow=True).start())
    query.awaitTermination()
    assert len(results) == 1 and results[0][1] is not None
    assert results[0][1] == results[0][0] and len(results[0][0]) > 5
    spark.sql(f"UPDATE {source.sql} SET v = 'f' WHERE id < 20")
    spark.sql(f"INSERT INTO {source.sql} VALUES (500, 'n', 1, current_timestamp(), 1.25)")
    query = (change_feed.change_stream(spark, source, after).writeStream
             .option("checkpointLocation", checkpoint).foreachBatch(each).trigger(availableNow=True).start())
    query.awaitTermination()
    assert len(results) == 2 and results[1][1] is not None and results[1][1] == results[1][0]
    assert {r[6] for r in results[1][0]} == {10, 11}
    assert feed.read(99, COLUMNS, 10_000) is None, "a batch whose offsets are not written is Spark's to read"


def test_a_batch_larger_than_the_drivers_share_or_of_another_table_is_not_read(spark, tmp_path):
    from lakemirror.sources.driver_feed import DriverFeed, FeedTooLarge
    from lakemirror.delta_log.stream_offsets import VersionRange
    from lakemirror.tables import TableLocation

    source = TableLocation(TableName("src", "s", "feed3"), str(tmp_path / "source"))
    spark.sql(f"CREATE TABLE {source.sql} (id BIGINT, v STRING, p INT, ts TIMESTAMP, d DECIMAL(10,2)) USING DELTA "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    _history(spark, source)
    reader = DriverFeed(source.path)
    assert reader.read(VersionRange(1, 1), COLUMNS, 30).num_rows == 30
    table_id = spark.sql(f"DESCRIBE DETAIL {source.sql}").collect()[0]["id"]
    assert reader.read(VersionRange(1, 1), COLUMNS, 30, table_id).num_rows == 30
    with pytest.raises(ValueError, match="is now"):
        reader.read(VersionRange(1, 1), COLUMNS, 30, "another-table-id")  # recreated since Spark planned
    with pytest.raises(FeedTooLarge):
        reader.read(VersionRange(1, 1), COLUMNS, 29)
    assert reader.read(VersionRange(5, 4), COLUMNS, 10).num_rows == 0


def test_a_source_with_column_mapping_is_read_by_spark_even_when_turned_on_mid_stream(spark, tmp_path):
    from lakemirror.sources.driver_feed import DriverFeed, FeedUnfit
    from lakemirror.delta_log.stream_offsets import VersionRange
    from lakemirror.tables import TableLocation

    mapped = TableLocation(TableName("src", "s", "feed4"), str(tmp_path / "mapped"))
    spark.sql(f"CREATE TABLE {mapped.sql} (id BIGINT, v STRING) USING DELTA TBLPROPERTIES ("
              "'delta.enableChangeDataFeed' = 'true', 'delta.columnMapping.mode' = 'name', "
              "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
    assert "column mapping" in (DriverFeed(mapped.path).unfit() or "")

    source = TableLocation(TableName("src", "s", "feed5"), str(tmp_path / "source"))
    spark.sql(f"CREATE TABLE {source.sql} (id BIGINT, v STRING) USING DELTA "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"INSERT INTO {source.sql} VALUES (1, 'a')")                                       # v1
    reader = DriverFeed(source.path)
    columns = ["id", "v", "_change_type", "_commit_version", "_commit_timestamp"]
    assert reader.read(VersionRange(1, 1), columns, 10).num_rows == 1
    spark.sql(f"ALTER TABLE {source.sql} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
              "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")                # v2
    spark.sql(f"INSERT INTO {source.sql} VALUES (2, 'b')")                                       # v3
    with pytest.raises(FeedUnfit, match="column mapping"):
        reader.read(VersionRange(3, 3), columns, 10)  # the same reader, its table brought up to date
