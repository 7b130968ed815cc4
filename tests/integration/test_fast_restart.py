"""A restart reuses what it learned at the last start where the source says nothing changed since:
each table's description is read again only when its log shows a schema, property or feature
change, or that it is not the table described (recreated), and a relaunch always reads it again."""

from __future__ import annotations

import logging
import shutil
from typing import Any

import pytest

from lakemirror.sources.catalog import LocalCatalog

pytestmark = pytest.mark.integration


class CountingCatalog:
    """The pipeline's catalog, counting the tables it describes."""

    def __init__(self, inner: LocalCatalog) -> None:
        self.inner = inner
        self.described: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def describe(self, spark: Any, name: Any) -> Any:
        self.described.append(name.table)
        return self.inner.describe(spark, name)


def _restart(p: Any) -> CountingCatalog:
    """Stop the pipeline and start it as a new daemon would, its catalog counting descriptions."""
    p.stop()
    catalog = CountingCatalog(LocalCatalog(p.settings.runtime.warehouse))
    p.app = p._new_app().replace(catalog=catalog)  # noqa: SLF001 (a new daemon, as Pipeline.restart makes)
    p.start()
    return catalog


def _caught_up(p: Any, table: str) -> None:
    p.create(table, "id BIGINT NOT NULL, v STRING", key="id")
    p.sql(table, "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    p.start()
    p.wait_caught_up(table)


def _logged_batch(p: Any, table: str) -> None:
    """A change applied in a batch the table's checkpoint logs (the bootstrap's rows are not one)."""
    p.sql(table, "INSERT INTO {t} VALUES (9, 'logged')")
    p.wait_caught_up(table)


def test_a_restart_reuses_the_description_while_only_data_changed(pipeline: Any, caplog: Any) -> None:
    p = pipeline
    _caught_up(p, "t")
    caplog.set_level(logging.INFO, logger="lakemirror")
    catalog = _restart(p)
    p.sql("t", "UPDATE {t} SET v = 'b2' WHERE id = 2")  # data only: the description still holds
    p.wait_caught_up("t")
    assert catalog.described == [], "no commit since the last start changed the table's metadata"
    p.assert_replica_equals_source("t")
    said = [r.getMessage() for r in caplog.records]
    chosen = next(i for i, m in enumerate(said) if m.startswith("table src.sales.t: applies "))
    started = next(i for i, m in enumerate(said) if m.startswith("table src.sales.t: stream started "))
    assert chosen < started, "the apply path is chosen by the launch, before the stream starts"
    # A relaunch in the same process (here a pause and a resume) never reuses a description.
    p.app.supervisor.pause("t")
    p.tick_until(lambda: p.views()["t"].state == "paused", what="the pause")
    p.app.supervisor.resume("t")
    p.wait_caught_up("t")
    assert catalog.described == ["t"]


def test_a_restart_after_a_schema_change_describes_the_source_again(pipeline: Any) -> None:
    p = pipeline
    _caught_up(p, "t")
    _logged_batch(p, "t")
    p.stop()
    p.sql("t", "ALTER TABLE {t} ADD COLUMNS (note STRING)")
    p.sql("t", "INSERT INTO {t} VALUES (3, 'c', 'new column')")
    catalog = _restart(p)
    p.wait_caught_up("t")
    # The launch describes it again; the change stream, made at the batch Spark plans (the new
    # column's version), checks the columns once more.
    assert catalog.described == ["t", "t"], "a schema change since the last start: described again"
    p.assert_replica_equals_source("t")


def test_a_column_added_after_a_restart_reaches_the_replica_before_spark_reads_the_stream(pipeline: Any) -> None:
    """A restarted table applies its first batches from the commit files and makes its change stream
    only at the first batch Spark plans: here the version adding a column, committed after the launch.
    That stream would read the new schema from its start; the launch's plan has no such column, so
    the table relaunches with it instead of applying rows without it."""
    p = pipeline
    _caught_up(p, "t")
    _logged_batch(p, "t")
    catalog = _restart(p)
    p.sql("t", "UPDATE {t} SET v = 'b2' WHERE id = 2")  # from the commit files: no stream yet
    p.wait_caught_up("t")
    assert catalog.described == []
    turn_query = p.runner("t").turns.turn_query
    assert turn_query is not None and not turn_query.opened, "no batch Spark planned yet: no change stream"
    p.sql("t", "ALTER TABLE {t} ADD COLUMNS (note STRING)")
    p.sql("t", "INSERT INTO {t} VALUES (3, 'c', 'new column')")
    p.sql("t", "UPDATE {t} SET note = 'filled' WHERE id = 1")
    p.wait_caught_up("t")
    p.assert_replica_equals_source("t")  # every source column, "note" among them


def test_a_source_recreated_while_the_daemon_was_stopped_is_described_and_refused(pipeline: Any) -> None:
    p = pipeline
    _caught_up(p, "r")
    p.stop()
    # A new table under the same path with as many commits: the same version numbers, other files.
    shutil.rmtree(p.source("r").path)
    p.create("r", "id BIGINT NOT NULL, v STRING", key="id")
    p.sql("r", "INSERT INTO {t} VALUES (1, 'new'), (2, 'new')")
    catalog = _restart(p)
    p.tick_until(lambda: p.views()["r"].state == "failed", what="the recreated source to be refused")
    assert catalog.described == ["r"]
    assert "dropped and recreated" in (p.views()["r"].last_error or "")


def test_a_column_added_while_the_first_snapshot_is_copied_reaches_the_replica(pipeline: Any) -> None:
    """A new table's launch describes the source, copies its snapshot, then makes its change stream.
    A column added between the description and the stream (here: while the snapshot is copied, which
    takes hours for a large table) is in the stream's schema from its start, and Delta's streaming
    source does not stop at the version that added it; the launch's plan has no such column. The
    table relaunches with it instead of applying rows without it."""
    p = pipeline
    p.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    p.sql("t", "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    altered: list[str] = []

    def alter_during_the_copy(point: str) -> None:
        if point == "bootstrap_after_snapshot" and not altered:
            altered.append(point)
            p.sql("t", "ALTER TABLE {t} ADD COLUMNS (note STRING)")
            p.sql("t", "INSERT INTO {t} VALUES (3, 'c', 'added while the snapshot was copied')")
            p.sql("t", "UPDATE {t} SET note = 'filled' WHERE id = 1")

    p.app = p.app.replace(fault=alter_during_the_copy)
    p.start()
    p.wait_caught_up("t")
    assert altered, "the copy's fault point was reached"
    p.assert_replica_equals_source("t")  # every source column, "note" among them, and its values


class AlteringCatalog(CountingCatalog):
    """The pipeline's catalog; right after it first describes the source, a column is added and filled."""

    def __init__(self, inner: LocalCatalog, alter: Any) -> None:
        super().__init__(inner)
        self.alter = alter

    def describe(self, spark: Any, name: Any) -> Any:
        info = super().describe(spark, name)
        if name.catalog == "src" and len(self.described) == 1:
            self.alter()
        return info


def test_a_column_added_between_the_description_and_the_snapshot_is_copied_with_its_values(pipeline: Any) -> None:
    """A new table's launch describes the source, then pins a version and copies the snapshot at it.
    A column added in between is in the snapshot but not in the launch's plan: a copy of the planned
    columns would leave the column's copied values behind (the stream then adds the column, empty).
    The bootstrap sees the column once the copy is done, pins anew and the relaunch copies it."""
    p = pipeline
    p.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    p.sql("t", "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")

    def alter() -> None:
        p.sql("t", "ALTER TABLE {t} ADD COLUMNS (note STRING)")
        p.sql("t", "INSERT INTO {t} VALUES (3, 'c', 'added before the pin')")
        p.sql("t", "UPDATE {t} SET note = 'filled' WHERE id = 1")

    catalog = AlteringCatalog(LocalCatalog(p.settings.runtime.warehouse), alter)
    p.app = p.app.replace(catalog=catalog)
    p.start()
    p.wait_caught_up("t")
    p.assert_replica_equals_source("t")  # "note" among the columns, with the values the copy read
    assert p.runner("t").ctx.states.load(p.runner("t").slug).epoch == 2, "the epoch was pinned anew"
