"""Tables taking turns on the apply workers (the default), and the always-on queries (apply_workers: 0)."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror import tables
from lakemirror.checkpoints.stream_dir import FILE_MANAGER_CONF, FILE_SYSTEM_MANAGERS

pytestmark = pytest.mark.integration


def _caught_up(pipeline: Any, rows: str) -> None:
    """Table ``t`` (id, v) with ``rows`` (SQL after INSERT INTO), replicated and caught up."""
    pipeline.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    pipeline.sql("t", f"INSERT INTO {{t}} {rows}")
    pipeline.start()
    pipeline.wait_caught_up("t")


def _pause(pipeline: Any, table: str = "t") -> None:
    pipeline.app.supervisor.pause(table)
    pipeline.tick_until(lambda: pipeline.views()[table].state == "paused", what="the table to pause")


def _backlog_while_paused(pipeline: Any, first_id: int) -> None:
    """Pause the table, commit four one-file inserts and an update to its source, resume it."""
    _pause(pipeline)
    for i in range(first_id, first_id + 4):
        pipeline.sql("t", f"INSERT INTO {{t}} VALUES ({i}, 'c')")
    pipeline.sql("t", "UPDATE {t} SET v = 'd' WHERE id = 1")
    pipeline.app.supervisor.resume("t")


def _applied_batches(pipeline: Any) -> list[Any]:
    rows = tables.read(pipeline.spark, pipeline.app.checkpoints.location).where("rows_read > 0").collect()
    return sorted(rows, key=lambda r: r["started_at"])


def test_one_worker_applies_one_table_at_a_time_and_every_replica_stays_exact(make_pipeline: Any) -> None:
    pipeline = make_pipeline(apply_workers=1)
    names = ["a", "b", "c"]
    for name in names:
        pipeline.create(name, "id BIGINT NOT NULL, v STRING", key="id")
        pipeline.sql(name, "INSERT INTO {t} SELECT id, 'v0' FROM range(0, 20)")
    pipeline.start()
    pipeline.wait_caught_up(*names)
    for name in names:
        pipeline.sql(name, "UPDATE {t} SET v = 'v1' WHERE id % 3 = 0")
        pipeline.sql(name, "DELETE FROM {t} WHERE id < 4")
        pipeline.sql(name, "INSERT INTO {t} VALUES (0, 'back'), (99, 'new')")  # a re-insert and an insert
        pipeline.app.supervisor.tick()
    pipeline.wait_caught_up(*names)
    for name in names:
        pipeline.assert_replica_equals_source(name)
        # Each local checkpoint was written through Hadoop's FileSystem API (this Spark has the class).
        assert pipeline.runner(name).stream_session.conf.get(FILE_MANAGER_CONF) in FILE_SYSTEM_MANAGERS
        # A local replica on the driver path: the turn plans its batch from the source's commit files,
        # and no query stays up between turns (Spark planned the epoch's first batch in a turn's query).
        assert pipeline.runner(name).last_trigger == "commit files"
        assert not pipeline.runner(name).query_running

    batches = _applied_batches(pipeline)
    assert {r["source_fqn"] for r in batches} == {f"src.sales.{n}" for n in names}
    for earlier, later in zip(batches, batches[1:]):
        assert later["started_at"] >= earlier["ended_at"], (
            f"two MERGEs overlapped with one apply worker: {earlier['source_fqn']} batch {earlier['batch_id']} "
            f"and {later['source_fqn']} batch {later['batch_id']}")
    # Each table's batch ids count up with no gap and none twice: one batch per turn with work.
    for name in names:
        ids = [r["batch_id"] for r in batches if r["source_fqn"] == f"src.sales.{name}"]
        assert ids == sorted(set(ids))


def test_commits_made_while_a_table_waits_arrive_in_one_batch(make_pipeline: Any) -> None:
    pipeline = make_pipeline(apply_workers=1)
    _caught_up(pipeline, "SELECT id, 'a' FROM range(0, 10)")
    _pause(pipeline)
    for i in range(5):
        pipeline.sql("t", f"UPDATE {{t}} SET v = 'u{i}' WHERE id = {i}")
    pipeline.app.supervisor.resume("t")
    pipeline.wait_caught_up("t")
    pipeline.assert_replica_equals_source("t")
    last = _applied_batches(pipeline)[-1]
    assert last["last_version"] - last["first_version"] == 4, "the five waiting versions took one turn"


def test_always_on_queries_replicate_exactly_across_a_restart(make_pipeline: Any) -> None:
    pipeline = make_pipeline(apply_workers=0)
    pipeline.create("orders", "id BIGINT NOT NULL, status STRING", key="id")
    pipeline.sql("orders", "INSERT INTO {t} SELECT id, 'new' FROM range(0, 30)")
    pipeline.start()
    pipeline.wait_caught_up("orders")
    assert pipeline.runner("orders").query_running, "apply_workers: 0 keeps an always-on query per table"
    pipeline.sql("orders", "UPDATE {t} SET status = 'paid' WHERE id % 2 = 0")
    pipeline.sql("orders", "DELETE FROM {t} WHERE id % 7 = 0")
    pipeline.wait_caught_up("orders")
    pipeline.restart()
    pipeline.sql("orders", "INSERT INTO {t} VALUES (0, 'again'), (100, 'new')")
    pipeline.wait_caught_up("orders")
    pipeline.assert_replica_equals_source("orders")


def test_an_interrupted_first_offset_write_does_not_fail_the_table_forever(pipeline: Any) -> None:
    # A query stopped or killed while writing its first offset leaves Spark's temporary file in
    # offsets/; Spark 4 then refuses to start at batch 0 (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY).
    pipeline.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    pipeline.sql("t", "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    offsets = pipeline.root / "checkpoints" / "test" / "src__sales__t" / "e1" / "offsets"
    offsets.mkdir(parents=True)
    leftover = offsets / ".0.0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.tmp"
    leftover.write_text("v1\n")
    pipeline.sql("t", "UPDATE {t} SET v = 'a2' WHERE id = 1")
    pipeline.start()
    pipeline.wait_caught_up("t")
    pipeline.sql("t", "INSERT INTO {t} VALUES (3, 'c')")
    pipeline.wait_caught_up("t")
    pipeline.assert_replica_equals_source("t")
    assert not leftover.exists()
    assert pipeline.views()["t"].failures == 0


def test_a_turn_with_nothing_new_lets_the_query_look_for_commits_by_itself(make_pipeline: Any) -> None:
    """Spark's streaming source planning every batch (commit_file_batches: false): the table's query stays
    up, each batch waits for its turn in the batch function."""
    pipeline = make_pipeline(apply_workers=1, commit_file_batches=False)
    _caught_up(pipeline, "VALUES (0, 'a'), (1, 'b')")
    runner = pipeline.runner("t")
    pipeline.tick_until(lambda: runner.ready_for_turn() and runner.has_pending() is False,
                        what="the applied batch to hold the query")
    assert runner.last_trigger == "gated"
    runner.take_turn()  # what the turn pool does every IDLE_RECHECK_SECONDS: nothing is new
    assert not runner.ready_for_turn(), "the turn was withdrawn: the query looks for commits by itself"
    assert runner.query_running
    pipeline.sql("t", "UPDATE {t} SET v = 'c' WHERE id = 1")
    pipeline.sql("t", "INSERT INTO {t} VALUES (2, 'd')")
    pipeline.wait_caught_up("t")  # the batch Spark planned by itself waited for, and got, a turn
    pipeline.assert_replica_equals_source("t")
    assert pipeline.views()["t"].failures == 0


def test_a_gated_backlog_is_split_by_the_rate_limit_one_turn_per_batch(make_pipeline: Any) -> None:
    pipeline = make_pipeline(apply_workers=1, max_files_per_trigger=1)
    _caught_up(pipeline, "VALUES (0, 'a')")
    _backlog_while_paused(pipeline, first_id=1)
    pipeline.wait_caught_up("t")
    pipeline.assert_replica_equals_source("t")
    assert pipeline.runner("t").last_trigger == "gated"
    ids = [r["batch_id"] for r in _applied_batches(pipeline)]
    # One batch per version of the backlog (one file a batch), each applied in a turn of its own, none twice.
    assert len(ids) == 5 and ids == sorted(set(ids)), ids


def test_queries_started_per_turn_for_batches_spark_plans_split_a_backlog_and_stay_exact(
        make_pipeline: Any, monkeypatch: Any) -> None:
    """Where the daemon plans a table's batches from its source's commit files, a batch it cannot
    plan (a commit that changes the table's metadata) is Spark's: the turn starts the table's query,
    with a ``once`` trigger when the table is a few versions behind, ``availableNow`` for a backlog."""
    from lakemirror.supervisor.apply_workers import worker_pool

    monkeypatch.setattr(worker_pool, "ONE_BATCH_VERSIONS", 3)  # a backlog of 3 versions counts as long
    # ``last_trigger`` is the latest turn's: an idle recheck (a turn finding nothing new) in a slow
    # run would replace the trigger of the turn under test.
    monkeypatch.setattr(worker_pool, "IDLE_RECHECK_SECONDS", 3600.0)
    pipeline = make_pipeline(apply_workers=1)
    _caught_up(pipeline, "VALUES (0, 'a')")
    runner = pipeline.runner("t")
    # The launch's first turn is Spark's (it starts the query's checkpoint): it must have ended before the
    # insert, or its query, still running after its first batch, could take the insert in a batch of its
    # own and the daemon would never plan from the commit files.
    pipeline.tick_until(lambda: (runner.last_trigger is not None and runner.turns.wait_idle(0)
                                 and not runner.query_running and runner.has_pending() is False),
                        what="the launch's first turn to end")
    pipeline.sql("t", "INSERT INTO {t} VALUES (1, 'b')")  # a plain version: the daemon's own batch
    pipeline.wait_caught_up("t")
    assert runner.last_trigger == "commit files"
    pipeline.sql("t", "INSERT INTO {t} VALUES (2, 'b')")
    pipeline.sql("t", "ALTER TABLE {t} SET TBLPROPERTIES ('lakemirror.test.note' = 'one')")  # not plain
    pipeline.wait_caught_up("t")
    assert runner.last_trigger == "once", "two versions behind, one of them Spark's: one micro-batch"

    _pause(pipeline)
    for i in range(3, 7):
        pipeline.sql("t", f"INSERT INTO {{t}} VALUES ({i}, 'c')")
    pipeline.sql("t", "ALTER TABLE {t} SET TBLPROPERTIES ('lakemirror.test.note' = 'two')")
    pipeline.app.supervisor.resume("t")
    pipeline.wait_caught_up("t")
    assert runner.last_trigger == "availableNow", "five versions behind is a backlog here"
    pipeline.assert_replica_equals_source("t")
    ids = [r["batch_id"] for r in _applied_batches(pipeline)]
    assert ids == sorted(set(ids)), ids  # none twice
