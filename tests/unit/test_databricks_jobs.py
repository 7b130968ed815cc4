"""The Databricks job spec, and the exact requests the SDK sends for it to a local fake of the Jobs API."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from lakemirror.daemon.settings import Settings
from lakemirror.daemon.databricks_jobs import (JobTarget, Schedule, SyncKind, build_job_settings, get_run,
                                               lakemirror_jobs, resume_job, stop_job, submit_job)
from tests.unit.databricks_fake import FakeJobsApi

WHEEL = "/Volumes/ops/lakemirror/wheels/lakemirror-0.1.0-py3-none-any.whl"
CONFIG = "/Volumes/ops/lakemirror/config/prod-orders.yaml"


def settings(**kw: Any) -> Settings:
    base: dict[str, Any] = dict(source_catalog="prod", destination_catalog="prod_mirror", schema_name="orders",
                                checkpoint_volume="/Volumes/clone_audit/streaming/cs_checkpoints")
    return Settings(**{**base, **kw})


@pytest.fixture
def fake() -> Iterator[FakeJobsApi]:
    routes: dict[tuple[str, str], Any] = {
        ("POST", "/api/2.2/jobs/create"): {"job_id": 42},
        ("GET", "/api/2.2/jobs/runs/list"): {"runs": [{"job_id": 42, "run_id": 7,
                                                       "run_page_url": "https://ws/jobs/42/runs/7"}]},
        ("GET", "/api/2.2/jobs/runs/get"): {"job_id": 42, "run_id": 7, "state": {"life_cycle_state": "RUNNING"}},
        ("POST", "/api/2.2/jobs/update"): {},
        ("POST", "/api/2.2/jobs/runs/cancel-all"): {},
        ("POST", "/api/2.2/jobs/delete"): {},
    }
    with FakeJobsApi(routes) as api:
        yield api


EXPECTED_CREATE_BODY = {
    "name": "lakemirror prod.orders-to-prod_mirror",
    "description": "lakemirror continuous-sync of prod.orders into prod_mirror.orders",
    "tags": {"created_by": "lakemirror", "kind": "continuous-sync", "source": "prod.orders",
             "destination": "prod_mirror.orders", "pipeline_id": "prod.orders-to-prod_mirror"},
    "continuous": {"pause_status": "UNPAUSED"},
    "max_concurrent_runs": 1,
    "job_clusters": [{"job_cluster_key": "lakemirror_driver", "new_cluster": {
        "spark_version": "17.3.x-scala2.13", "node_type_id": "i3.xlarge", "num_workers": 1,
        "data_security_mode": "SINGLE_USER",
        "custom_tags": {"created_by": "lakemirror", "kind": "continuous-sync"}}}],
    "tasks": [{
        "task_key": "lakemirror",
        "description": "lakemirror 0.1.0: prod.orders -> prod_mirror.orders",
        "job_cluster_key": "lakemirror_driver",
        "libraries": [{"whl": WHEEL}],
        "python_wheel_task": {"package_name": "lakemirror", "entry_point": "lakemirror",
                              "parameters": ["run", CONFIG, "--set", "runtime.mode=databricks"]},
    }],
}


def test_the_spec_is_a_continuous_job_running_the_wheel_entry_point() -> None:
    spec = build_job_settings(settings(), JobTarget(wheel=WHEEL, config_path=CONFIG))
    assert spec.as_dict() == EXPECTED_CREATE_BODY
    assert build_job_settings(settings(), JobTarget(wheel=WHEEL, config_path=CONFIG)) == spec  # pure


def test_incremental_sync_is_a_scheduled_job_on_an_existing_cluster() -> None:
    target = JobTarget(wheel=WHEEL, config_path=CONFIG, kind=SyncKind.INCREMENTAL, existing_cluster_id="c-1",
                       schedule=Schedule("0 0/15 * * * ?", "Europe/Paris"), start_paused=True)
    body = build_job_settings(settings(destination_schema="orders_v2"), target).as_dict()
    assert "continuous" not in body and "job_clusters" not in body
    assert body["schedule"] == {"quartz_cron_expression": "0 0/15 * * * ?", "timezone_id": "Europe/Paris",
                                "pause_status": "PAUSED"}
    assert body["tags"]["kind"] == "incremental-sync"
    assert body["tags"]["destination"] == "prod_mirror.orders_v2"
    assert body["tasks"][0]["existing_cluster_id"] == "c-1"


@pytest.mark.parametrize("kw, message", [
    (dict(wheel="/Volumes/x/lakemirror.tar.gz"), "built .whl"),
    (dict(kind=SyncKind.INCREMENTAL), "needs a schedule"),
    (dict(schedule=Schedule("0 * * * * ?")), "has no schedule"),
])
def test_invalid_targets_are_refused(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobTarget(**{"wheel": WHEEL, "config_path": CONFIG, **kw})


def test_submit_creates_the_job_and_answers_the_active_run_url(fake: FakeJobsApi) -> None:
    spec = build_job_settings(settings(), JobTarget(wheel=WHEEL, config_path=CONFIG))
    submitted = submit_job(fake.client(), spec)
    assert submitted.job_id == 42 and submitted.run_url == "https://ws/jobs/42/runs/7"
    assert fake.calls() == [("POST", "/api/2.2/jobs/create"), ("GET", "/api/2.2/jobs/runs/list")]
    assert fake.requests[0][3] == EXPECTED_CREATE_BODY
    assert fake.requests[1][2] == {"job_id": ["42"], "active_only": ["true"], "limit": ["1"]}
    assert all(h.get("Authorization") == "Bearer x" for h in fake.headers)
    assert all(h.get("X-Databricks-Workspace-Id") == "1234" for h in fake.headers)


def test_submit_falls_back_to_the_job_page_before_the_run_is_listed(fake: FakeJobsApi) -> None:
    fake.routes[("GET", "/api/2.2/jobs/runs/list")] = {"runs": []}
    spec = build_job_settings(settings(), JobTarget(wheel=WHEEL, config_path=CONFIG))
    assert submit_job(fake.client(), spec).run_url == f"{fake.host}/jobs/42"


def test_stop_pauses_the_continuous_trigger_before_cancelling_then_deletes(fake: FakeJobsApi) -> None:
    spec = build_job_settings(settings(), JobTarget(wheel=WHEEL, config_path=CONFIG))
    fake.routes[("GET", "/api/2.2/jobs/get")] = {"job_id": 42, "settings": spec.as_dict()}
    stop_job(fake.client(), 42, delete=True)
    assert fake.calls() == [("GET", "/api/2.2/jobs/get"), ("POST", "/api/2.2/jobs/update"),
                            ("POST", "/api/2.2/jobs/runs/cancel-all"), ("POST", "/api/2.2/jobs/delete")]
    assert fake.requests[0][2] == {"job_id": ["42"]}
    assert fake.requests[1][3] == {"job_id": 42, "new_settings": {"continuous": {"pause_status": "PAUSED"}}}
    assert fake.requests[2][3] == {"job_id": 42}
    assert fake.requests[3][3] == {"job_id": 42}


def test_stop_pauses_the_schedule_of_an_incremental_job_and_keeps_it(fake: FakeJobsApi) -> None:
    target = JobTarget(wheel=WHEEL, config_path=CONFIG, kind=SyncKind.INCREMENTAL,
                       schedule=Schedule("0 0 * * * ?"))
    fake.routes[("GET", "/api/2.2/jobs/get")] = {"job_id": 9,
                                                 "settings": build_job_settings(settings(), target).as_dict()}
    stop_job(fake.client(), 9)
    assert fake.calls()[-1] == ("POST", "/api/2.2/jobs/runs/cancel-all")
    assert fake.requests[1][3] == {"job_id": 9, "new_settings": {"schedule": {
        "quartz_cron_expression": "0 0 * * * ?", "timezone_id": "UTC", "pause_status": "PAUSED"}}}


def test_resume_unpauses_the_continuous_trigger(fake: FakeJobsApi) -> None:
    resume_job(fake.client(), 42)
    assert fake.requests == [("POST", "/api/2.2/jobs/update", {},
                              {"job_id": 42, "new_settings": {"continuous": {"pause_status": "UNPAUSED"}}})]


def test_run_lookup_and_listing_only_lakemirror_jobs(fake: FakeJobsApi) -> None:
    run = get_run(fake.client(), 7)
    assert run.run_id == 7 and run.state is not None and run.state.life_cycle_state is not None
    assert fake.requests[-1][:3] == ("GET", "/api/2.2/jobs/runs/get", {"run_id": ["7"]})
    fake.routes[("GET", "/api/2.2/jobs/list")] = {"jobs": [
        {"job_id": 1, "settings": {"name": "other", "tags": {"created_by": "someone"}}},
        {"job_id": 42, "settings": {"name": "lakemirror p", "tags": {"created_by": "lakemirror"}}},
        {"job_id": 3, "settings": {"name": "untagged"}}]}
    assert [j.job_id for j in lakemirror_jobs(fake.client())] == [42]
    assert fake.calls()[-1] == ("GET", "/api/2.2/jobs/list")
