"""After a restart, a table reports what its replica holds, and a replay needs nothing vacuumed.

A drain (SIGTERM) or a kill can land after a batch is committed to the replica but before Spark
commits it to the stream checkpoint: the next run replays that batch. The replica's own Delta
transaction record (``txn``) says the batch is applied already, so the replay must not read the
batch's change files, which VACUUM may have deleted meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakemirror.supervisor.offline.replica_transactions import stream_checkpoint

from tests.integration.conftest import vacuum_everything

pytestmark = pytest.mark.integration


def uncommit_last_batch(pipeline: Any, table: str) -> int:
    """Remove Spark's commit of the table's last batch, as a stop between the replica's commit and
    Spark's leaves it; returns that batch's id."""
    runner = pipeline.runner(table)
    progress = pipeline.app.states.load(runner.slug)
    spec = pipeline.app.spec
    commits = Path(stream_checkpoint(spec.checkpoint_root, spec.pipeline_id, runner.slug, progress.epoch)) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    return last


#: In the slow tier: the default tier's crash-torture smoke replays a batch the replica holds (skipped
#: unread) and tests/unit/test_replayed_batch_row.py its checkpoint row.
@pytest.mark.slow
def test_a_replay_of_a_batch_the_replica_holds_needs_no_vacuumed_change_file(pipeline: Any) -> None:
    pipeline.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    pipeline.sql("t", "INSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    pipeline.start()
    pipeline.wait_caught_up("t")
    pipeline.sql("t", "UPDATE {t} SET v = 'B' WHERE id = 2")
    pipeline.sql("t", "DELETE FROM {t} WHERE id = 3")
    pipeline.wait_caught_up("t")
    applied = pipeline.runner("t").applied_through
    pipeline.stop()
    uncommit_last_batch(pipeline, "t")
    vacuum_everything(pipeline, "t")  # the replayed batch's _change_data files are gone

    pipeline.app = pipeline._new_app()  # noqa: SLF001 (a new daemon process on the same folders)
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.runner("t").applied_through is not None, what="t to start")
    # From its first reading the table reports what the replica holds, not its bootstrap version.
    assert pipeline.runner("t").applied_through == applied
    pipeline.sql("t", "INSERT INTO {t} VALUES (4, 'd')")
    pipeline.tick_until(lambda: pipeline.views()["t"].state == "failed" or pipeline.caught_up("t"),
                        what="t to catch up (or fail)")
    view = pipeline.views()["t"]
    assert view.state == "running", view.last_error
    pipeline.assert_replica_equals_source("t")


def test_while_a_restarted_table_starts_its_versions_behind_and_lag_follow_the_source(pipeline: Any) -> None:
    """Commits made while no daemon ran: from the restart's first view, versions behind and lag are
    the source's (read from its commit files, no stream needed), and they keep following it."""
    import time

    pipeline.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    pipeline.sql("t", "INSERT INTO {t} VALUES (1, 'a')")
    pipeline.start()
    pipeline.wait_caught_up("t")
    applied = pipeline.runner("t").applied_through
    pipeline.stop()
    for i in range(2, 5):
        pipeline.sql("t", f"INSERT INTO {{t}} VALUES ({i}, 'x')")
    log_dir = Path(pipeline.source("t").path) / "_delta_log"
    first_unapplied = (log_dir / f"{applied + 1:020d}.json").stat().st_mtime

    pipeline.app = pipeline._new_app()  # noqa: SLF001 (a new daemon process on the same folders)
    pipeline.app.supervisor.start()  # no tick yet: the table is starting, its runner has measured nothing
    before = time.time()
    view = pipeline.views()["t"]
    after = time.time()
    assert (view.state, view.applied_through, view.versions_behind) == ("starting", applied, 3)
    # the lag counts from the first unapplied commit, at the moment of the view
    assert before - first_unapplied - 0.5 <= view.lag_seconds <= after - first_unapplied + 0.5, view.lag_seconds
    pipeline.sql("t", "INSERT INTO {t} VALUES (5, 'y')")
    latest = applied + 4
    deadline = time.time() + 30
    while True:  # the view follows the new commit, whether the table's launch has applied anything yet
        view = pipeline.views()["t"]
        if view.applied_through is not None and view.versions_behind == latest - view.applied_through \
                and (view.versions_behind == 4 or view.applied_through == latest):
            break
        assert time.time() < deadline, f"versions behind never followed the source: {view}"
        time.sleep(0.1)
    pipeline.wait_caught_up("t")
    pipeline.assert_replica_equals_source("t")
