"""A source version the replica still needs is vacuumed while the daemon is stopped.

It is never skipped silently: with ``change_window_policy: fail`` the table stops in ``failed``
and says what happened (the replica is left as it was); with ``resync`` it is bootstrapped again
under a new epoch, and a checkpoint row records the resync. A RESTORE of the source, on the other
hand, is an ordinary commit in the change feed and is followed exactly.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import vacuum_everything

pytestmark = pytest.mark.integration


def changes_then_vacuum_while_stopped(p: Any) -> None:
    p.create("w", "id BIGINT NOT NULL, v INT")
    p.sql("w", "INSERT INTO {t} VALUES (1, 1), (2, 2)")
    p.start()
    p.wait_caught_up("w")
    p.stop()
    p.sql("w", "UPDATE {t} SET v = 10 WHERE id = 1")
    p.sql("w", "UPDATE {t} SET v = 20 WHERE id = 1")
    p.sql("w", "DELETE FROM {t} WHERE id = 2")
    p.sql("w", "INSERT INTO {t} VALUES (3, 3)")
    vacuum_everything(p, "w")
    p.app = p._new_app()  # noqa: SLF001 (a new daemon process over the same folders)
    p.start()


#: In the slow tier: policy fail is exercised in the default tier on S3
#: (tests/integration/test_object_storage.py, a source version vacuumed).
@pytest.mark.slow
def test_expired_window_with_policy_fail_stops_the_table_and_says_why(make_pipeline: Any) -> None:
    p = make_pipeline(change_window_policy="fail")
    changes_then_vacuum_while_stopped(p)
    p.tick_until(lambda: p.views()["w"].state == "failed", what="the table to fail")
    error = p.views()["w"].last_error
    assert "change window expired" in error and "lakemirror resync" in error, error
    for _ in range(10):  # failed is final: no retry happens by itself
        p.app.supervisor.tick()
    assert p.views()["w"].state == "failed"
    assert p.rows(p.replica("w")) == [(1, 1), (2, 2)], "nothing half-applied"

    p.app.supervisor.resync("w")
    p.wait_caught_up("w")
    p.assert_replica_equals_source("w")
    assert p.app.states.load(p.runner("w").slug).epoch == 2


#: In the slow tier: policy resync is exercised in the default tier by
#: test_log_cleanup_past_the_needed_version_is_detected_and_resynced.
@pytest.mark.slow
def test_expired_window_with_policy_resync_rebuilds_under_a_new_epoch(make_pipeline: Any) -> None:
    p = make_pipeline(change_window_policy="resync")
    changes_then_vacuum_while_stopped(p)
    p.wait_caught_up("w")
    p.assert_replica_equals_source("w")
    assert p.app.states.load(p.runner("w").slug).epoch == 2
    from lakemirror import tables
    rows = tables.read(p.spark, p.app.checkpoints.location).where("error LIKE 'resync:%'")
    recorded = rows.collect()
    assert len(recorded) == 1 and "change window expired" in recorded[0]["error"]
    assert recorded[0]["epoch"] == 2
    # and it keeps streaming afterwards, in the new epoch
    p.sql("w", "UPDATE {t} SET v = v + 1")
    p.wait_caught_up("w")
    p.assert_replica_equals_source("w")


def test_restore_of_the_source_is_followed_exactly(pipeline: Any) -> None:
    pipeline.create("r", "id BIGINT NOT NULL, v STRING")
    pipeline.sql("r", "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    good = pipeline.latest_version("r")
    pipeline.start()
    pipeline.wait_caught_up("r")
    pipeline.sql("r", "UPDATE {t} SET v = 'changed' WHERE id = 1")
    pipeline.sql("r", "DELETE FROM {t} WHERE id = 2")
    pipeline.sql("r", "INSERT INTO {t} VALUES (3, 'c')")
    pipeline.wait_caught_up("r")
    pipeline.sql("r", f"RESTORE TABLE {{t}} TO VERSION AS OF {good}")
    pipeline.wait_caught_up("r")
    pipeline.assert_replica_equals_source("r")
    assert pipeline.rows(pipeline.replica("r")) == [(1, "a"), (2, "b")]


def test_a_source_dropped_and_recreated_under_its_name_is_never_followed_silently(make_pipeline: Any) -> None:
    import shutil

    p = make_pipeline(change_window_policy="resync")
    p.create("re", "id BIGINT NOT NULL, v STRING")
    p.sql("re", "INSERT INTO {t} VALUES (1, 'old'), (2, 'old')")
    p.start()
    p.wait_caught_up("re")
    old_id = p.app.states.load(p.runner("re").slug).source_table_id

    # Dropped and recreated while the daemon runs: a new table (new id, versions from 0 again)
    # whose version numbers the replica's checkpoint would otherwise mistake for its own.
    shutil.rmtree(p.source("re").path)
    p.create("re", "id BIGINT NOT NULL, v STRING")
    p.sql("re", "INSERT INTO {t} VALUES (2, 'new'), (3, 'new')")
    p.sql("re", "INSERT INTO {t} VALUES (4, 'new')")
    p.sql("re", "INSERT INTO {t} VALUES (5, 'new')")
    p.wait_caught_up("re", timeout=180)
    p.assert_replica_equals_source("re")
    progress = p.app.states.load(p.runner("re").slug)
    assert progress.epoch == 2 and progress.source_table_id not in (None, old_id)
    from lakemirror import tables
    recorded = tables.read(p.spark, p.app.checkpoints.location).where("error LIKE 'resync:%'").collect()
    assert len(recorded) == 1 and "dropped and recreated" in recorded[0]["error"], recorded


def test_log_cleanup_past_the_needed_version_is_detected_and_resynced(make_pipeline: Any) -> None:
    """The other way a change window closes: the source's log files for the versions the replica
    still needs are cleaned up (log retention at a checkpoint) while the daemon is stopped."""
    import os
    import time
    from pathlib import Path

    p = make_pipeline(change_window_policy="resync")
    p.create("lg", "id BIGINT NOT NULL, v INT")
    p.sql("lg", "ALTER TABLE {t} SET TBLPROPERTIES ('delta.checkpointInterval' = '2', "
                "'delta.logRetentionDuration' = 'interval 1 hours', 'delta.deletedFileRetentionDuration' = 'interval 1 hours')")
    p.sql("lg", "INSERT INTO {t} VALUES (1, 1), (2, 2)")
    p.start()
    p.wait_caught_up("lg")
    p.stop()
    needed = p.latest_version("lg") + 1
    for i in range(3):
        p.sql("lg", f"UPDATE {{t}} SET v = v + 1 WHERE id = {1 + i % 2}")
    # Age every log file by two days; the next checkpoint's cleanup then drops the expired ones.
    log_dir = Path(p.source("lg").path) / "_delta_log"
    old = time.time() - 2 * 86400
    for f in log_dir.iterdir():
        if f.is_file():
            os.utime(f, (old, old))
    p.sql("lg", "INSERT INTO {t} VALUES (3, 3)")
    p.sql("lg", "INSERT INTO {t} VALUES (4, 4)")
    assert not (log_dir / f"{needed:020d}.json").exists(), "the test needs the log of the next version gone"

    p.app = p._new_app()  # noqa: SLF001 (a new daemon process over the same folders)
    p.start()
    p.wait_caught_up("lg", timeout=180)
    p.assert_replica_equals_source("lg")
    assert p.app.states.load(p.runner("lg").slug).epoch == 2
    from lakemirror import tables
    recorded = tables.read(p.spark, p.app.checkpoints.location).where("error LIKE 'resync:%'").collect()
    assert len(recorded) == 1, recorded
