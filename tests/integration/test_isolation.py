"""A poisoned table goes degraded, retries with backoff and recovers; the others never stop."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration


def _commit_and_catch_up(pipeline, table: str, key: int) -> None:
    """One source commit, applied: the table keeps replicating."""
    pipeline.sql(table, f"INSERT INTO {{t}} VALUES ({key}, {key})")
    pipeline.wait_caught_up(table)


def test_poisoned_table_is_isolated_and_recovers(make_pipeline):
    """A failure of the whole write (not one row's value, which is dead-lettered instead: see
    test_feed_isolation.py) degrades only its table, which retries with a growing, jittered, capped
    backoff while the other table keeps replicating, and recovers by itself once the cause is gone."""
    policy = {"base_delay_seconds": 0.5, "max_delay_seconds": 4, "jitter": 0.3}
    pipeline = make_pipeline(restart=policy)
    pipeline.create("good", "id BIGINT NOT NULL, v INT")
    pipeline.create("bad", "id BIGINT NOT NULL, v INT")
    pipeline.sql("good", "INSERT INTO {t} VALUES (1, 1)")
    pipeline.sql("bad", "INSERT INTO {t} VALUES (1, 1)")
    pipeline.start()
    pipeline.wait_caught_up("good", "bad")

    # Every retry the supervisor schedules for the poisoned table, as its observer sees it.
    delays: dict[int, float] = {}
    observer = pipeline.app.supervisor.observer
    scheduled = observer.retry_scheduled

    def record(table, status):
        if table == "bad":
            delays[status.failures] = status.next_retry_at - status.since
        scheduled(table, status)

    observer.retry_scheduled = record

    # Someone makes the replica append-only: the next update of the source cannot be applied at all.
    replica = pipeline.replica("bad").sql
    pipeline.spark.sql(f"ALTER TABLE {replica} SET TBLPROPERTIES ('delta.appendOnly' = 'true')")
    pipeline.sql("bad", "UPDATE {t} SET v = 500 WHERE id = 1")
    pipeline.tick_until(lambda: pipeline.views()["bad"].state == "degraded", what="bad to degrade")
    assert "APPEND_ONLY" in pipeline.views()["bad"].last_error

    # While it fails again and again, the healthy table keeps replicating, and the poisoned one
    # waits longer after each failure (jittered, capped), visibly.
    key, deadline = 200, time.monotonic() + 240
    while 4 not in delays or key < 203:
        assert time.monotonic() < deadline, f"the poisoned table stopped retrying: {delays}, {pipeline.views()}"
        _commit_and_catch_up(pipeline, "good", key)
        key += 1
    for failures, delay in delays.items():
        expected = min(4.0, 0.5 * 2 ** (failures - 1))
        assert expected * 0.7 - 1e-6 <= delay <= expected + 1e-6, (failures, delay)
    firsts = [delays[f] for f in (2, 3, 4)]
    assert firsts == sorted(firsts), f"the delays must grow: {delays}"
    assert pipeline.views()["bad"].retry_delay_seconds in (None, delays[max(delays)])
    samples = {s.name: s.value for m in pipeline.app.metrics.registry.collect() for s in m.samples
               if s.labels.get("table", "").endswith("bad")}
    assert samples["lakemirror_retries_total"] >= 4
    assert samples["lakemirror_consecutive_failures"] >= 1

    # Fix the cause: the table recovers by itself and catches up exactly.
    pipeline.spark.sql(f"ALTER TABLE {replica} UNSET TBLPROPERTIES ('delta.appendOnly')")
    pipeline.wait_caught_up("bad")
    assert pipeline.views()["bad"].failures == 0
    pipeline.assert_replica_equals_source("bad")
    pipeline.assert_replica_equals_source("good")


def test_a_table_without_a_usable_key_is_refused_with_the_reason(pipeline):
    pipeline.create("nokey", "a STRING, b STRING")
    pipeline.sql("nokey", "INSERT INTO {t} VALUES ('x', 'y')")
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.views()["nokey"].state == "failed", what="nokey to fail")
    view = pipeline.views()["nokey"]
    assert "no usable primary key" in view.last_error and "lakemirror.primaryKey" in view.last_error
    assert (view.retries, view.next_retry_at) == (0, None), "a configuration error is not retried"
    from lakemirror import tables
    assert not tables.exists(pipeline.spark, pipeline.replica("nokey")), "nothing replicated wrongly"


def test_cdf_disabled_source_fails_at_once_saying_how_to_enable_it(pipeline):
    pipeline.create("nocdf", "id BIGINT NOT NULL", cdf=False)
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.views()["nocdf"].state == "failed", what="nocdf to fail")
    view = pipeline.views()["nocdf"]
    assert "delta.enableChangeDataFeed" in view.last_error and "enable_change_data_feed: true" in view.last_error
    assert (view.retries, view.next_retry_at) == (0, None), "a configuration error is not retried"


def test_enable_change_data_feed_turns_a_sources_feed_on_and_replicates_it(make_pipeline):
    pipeline = make_pipeline(tables=["optin"], enable_change_data_feed=True)
    pipeline.create("optin", "id BIGINT NOT NULL, v STRING", key="id", cdf=False)
    pipeline.sql("optin", "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    pipeline.start()
    pipeline.wait_caught_up("optin")
    pipeline.sql("optin", "UPDATE {t} SET v = 'changed' WHERE id = 1")
    pipeline.sql("optin", "DELETE FROM {t} WHERE id = 2")
    pipeline.wait_caught_up("optin")
    pipeline.assert_replica_equals_source("optin")
    props = pipeline.spark.sql(f"SHOW TBLPROPERTIES {pipeline.source('optin').sql}").collect()
    assert {r["key"]: r["value"] for r in props}.get("delta.enableChangeDataFeed") == "true"


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
