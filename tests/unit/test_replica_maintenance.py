"""replica_maintenance: the retention, checkpoint interval and scheduled VACUUM of the replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.settings.maintenance import VACUUM_TASK, hours_interval
from lakemirror.daemon.settings.runtime_spec import jobs_for, maintenance_subtasks, pipeline_spec
from lakemirror.errors import ConfigError
from lakemirror.supervisor.subtasks.scheduler import DailyAt, Every
from tests.unit.test_config import write

POSTGRES = {"kind": "postgres", "host": "db", "database": "d", "user": "u"}


def settings(tmp_path: Path, **changes: Any) -> Any:
    return load_settings(write(tmp_path, changes))


def test_replicas_get_a_short_retention_a_longer_log_and_a_checkpoint_interval_by_default(tmp_path: Path) -> None:
    spec = pipeline_spec(settings(tmp_path))
    assert spec.replica_properties == {"delta.deletedFileRetentionDuration": "interval 24 hours",
                                       "delta.logRetentionDuration": "interval 168 hours",
                                       "delta.checkpointInterval": "10"}


def test_replica_properties_win_and_null_keeps_deltas_default(tmp_path: Path) -> None:
    spec = pipeline_spec(settings(tmp_path, replica_properties={"delta.checkpointInterval": "50"},
                                  replica_maintenance={"log_retention_hours": None, "deleted_file_retention_hours": 1.5}))
    assert spec.replica_properties == {"delta.deletedFileRetentionDuration": "interval 90 minutes",
                                       "delta.checkpointInterval": "50"}
    assert hours_interval(36) == "interval 36 hours"


@pytest.mark.parametrize("changes, needle", [
    ({"replica_maintenance": {"deleted_file_retention_hours": 48, "log_retention_hours": 24}},
     "make log_retention_hours at least 48"),
    ({"replica_maintenance": {"deleted_file_retention_hours": 0.5}}, "greater than or equal to 1"),
    ({"replica_properties": {"delta.setTransactionRetentionDuration": "interval 1 day"}},
     "forget the transaction ids"),
    ({"schedules": [{"name": VACUUM_TASK, "operations": ["reconcile"], "every_seconds": 60}]}, "rename it"),
    ({"replica_maintenance": {"vacuum_retain_hours": 1}}, "vacuum_retain_hours"),
])
def test_unsafe_or_unclear_maintenance_is_refused(tmp_path: Path, changes: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(tmp_path, **changes)
    assert needle in str(err.value)


def test_the_vacuum_runs_on_its_schedule_over_the_pipelines_replicas(tmp_path: Path) -> None:
    s = settings(tmp_path)
    [task] = maintenance_subtasks(s)
    assert (task.name, task.trigger, task.settings.operations, task.tables) == (VACUUM_TASK, Every(21600.0),
                                                                                ("vacuum",), None)
    jobs = jobs_for(task, pipeline_spec(s), lambda: ["orders"])
    assert [(str(j.source), str(j.target)) for j in jobs] == [("src.sales.orders", "dst.sales.orders")]
    assert jobs[0].settings.options["vacuum"] == {"pipeline_id": s.effective_pipeline_id}
    daily = settings(tmp_path, replica_maintenance={"vacuum_daily_at": "03:30"})
    assert maintenance_subtasks(daily)[0].trigger == DailyAt(3, 30)


@pytest.mark.parametrize("changes", [
    {"replica_maintenance": {"vacuum_every_seconds": None}},
    {"destination": POSTGRES, "destination_catalog": "pg"},
])
def test_no_vacuum_when_turned_off_or_the_replicas_are_not_delta(tmp_path: Path, changes: dict[str, Any]) -> None:
    assert maintenance_subtasks(settings(tmp_path, **changes)) == []


def test_a_schedule_may_vacuum_too(tmp_path: Path) -> None:
    from lakemirror.daemon.settings.runtime_spec import subtask_of

    s = settings(tmp_path, schedules=[{"name": "nightly", "operations": ["reconcile", "vacuum"], "daily_at": "02:00"}])
    task = subtask_of(s.schedules[0], s.effective_pipeline_id)
    assert task.settings.operations == ("reconcile", "vacuum")
    assert task.settings.options["vacuum"] == {"pipeline_id": s.effective_pipeline_id}
