"""A poisoned table goes degraded, retries with backoff and recovers; the others never stop."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_poisoned_table_is_isolated_and_recovers(pipeline):
    pipeline.create("good", "id BIGINT NOT NULL, v INT")
    pipeline.create("bad", "id BIGINT NOT NULL, v INT")
    pipeline.sql("good", "INSERT INTO {t} VALUES (1, 1)")
    pipeline.sql("bad", "INSERT INTO {t} VALUES (1, 1)")
    pipeline.start()
    pipeline.wait_caught_up("good", "bad")

    # Someone adds a constraint to the replica that the next source change violates.
    replica = pipeline.replica("bad").sql
    pipeline.spark.sql(f"ALTER TABLE {replica} ADD CONSTRAINT small CHECK (v < 100)")
    pipeline.sql("bad", "INSERT INTO {t} VALUES (2, 500)")
    pipeline.tick_until(lambda: pipeline.views()["bad"].state == "degraded", what="bad to degrade")
    degraded = pipeline.views()["bad"]
    assert "small" in degraded.last_error or "CHECK" in degraded.last_error.upper()

    # The healthy table keeps replicating while the other one is degraded.
    for i in range(2, 5):
        pipeline.sql("good", f"INSERT INTO {{t}} VALUES ({i}, {i})")
        pipeline.wait_caught_up("good")
    assert pipeline.views()["bad"].state in ("degraded", "starting")
    assert pipeline.views()["bad"].retries >= 1

    # Fix the cause: the table recovers by itself and catches up exactly.
    pipeline.spark.sql(f"ALTER TABLE {replica} DROP CONSTRAINT small")
    pipeline.wait_caught_up("bad")
    pipeline.assert_replica_equals_source("bad")
    pipeline.assert_replica_equals_source("good")


def test_a_table_without_a_usable_key_is_refused_with_the_reason(pipeline):
    pipeline.create("nokey", "a STRING, b STRING")
    pipeline.sql("nokey", "INSERT INTO {t} VALUES ('x', 'y')")
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.views()["nokey"].state == "degraded", what="nokey to degrade")
    error = pipeline.views()["nokey"].last_error
    assert "no usable primary key" in error and "lakemirror.primaryKey" in error
    from lakemirror import tables
    assert not tables.exists(pipeline.spark, pipeline.replica("nokey")), "nothing replicated wrongly"


def test_cdf_disabled_source_says_how_to_enable_it(pipeline):
    pipeline.create("nocdf", "id BIGINT NOT NULL", cdf=False)
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.views()["nocdf"].state == "degraded", what="nocdf to degrade")
    assert "delta.enableChangeDataFeed" in pipeline.views()["nocdf"].last_error


def test_paused_table_stays_paused_across_restart(pipeline):
    pipeline.create("p", "id BIGINT NOT NULL")
    pipeline.sql("p", "INSERT INTO {t} VALUES (1)")
    pipeline.start()
    pipeline.wait_caught_up("p")
    pipeline.app.supervisor.pause("p")
    pipeline.tick_until(lambda: pipeline.views()["p"].state == "paused", what="pause")
    pipeline.restart()
    pipeline.app.supervisor.tick()
    assert pipeline.views()["p"].state == "paused"
    pipeline.sql("p", "INSERT INTO {t} VALUES (2)")
    pipeline.app.supervisor.resume("p")
    pipeline.wait_caught_up("p")
    pipeline.assert_replica_equals_source("p")
