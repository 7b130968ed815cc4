"""The Spark-free lag probe agrees with Delta's own history on a real table."""

from __future__ import annotations

import pytest

from lakemirror.identifiers import TableName

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("reader", ["local", "hadoop"])
def test_commit_files_give_the_same_head_and_commit_times_as_the_history(spark, tmp_path, reader):
    from lakemirror.sources.change_feed import source_head
    from lakemirror.delta_log.commit_times import HadoopCommitLog, LocalCommitLog, commit_log_for
    from lakemirror.sources.head_probe import probe_head
    from lakemirror.tables import TableLocation

    loc = TableLocation(TableName("src", "s", "log"), str(tmp_path / "log"))
    spark.sql(f"CREATE TABLE {loc.sql} (id BIGINT) USING DELTA")
    for i in range(5):
        spark.sql(f"INSERT INTO {loc.sql} VALUES ({i})")
    assert isinstance(commit_log_for(spark, loc), LocalCommitLog), "a table the driver sees is stat'ed in Python"
    log = LocalCommitLog.for_table(loc) if reader == "local" else HadoopCommitLog.for_table(spark, loc)
    assert log is not None
    assert log.has_commit(5) and not log.has_commit(6)
    assert log.commit_time(99) is None
    head = probe_head(log.commit_time, applied_through=1, known_latest=None, cache={})
    history = source_head(spark, loc, 1, window=32)
    assert head is not None and head.latest_version == history.latest_version == 5
    assert set(head.commit_times) == {2, 5}
    for version, when in head.commit_times.items():
        assert abs(when - history.commit_times[version]) < 0.002, (version, when, history.commit_times)
    by_name = TableLocation(TableName("src", "s", "log"))
    assert HadoopCommitLog.for_table(spark, by_name) is None, "a table known only by name uses the history"
    assert commit_log_for(spark, by_name) is None
