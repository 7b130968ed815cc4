"""The control API in databricks mode: the daemon's HTTP server, a real client, and the SDK pointed at a
local fake of the Jobs and Files APIs; the exact requests are checked."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path
from typing import Any, Iterator
from urllib.error import HTTPError

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lakemirror.daemon.api import ContinuousSyncApi
from lakemirror.daemon.settings import DatabricksSettings
from lakemirror.daemon.databricks_pipelines import DatabricksPipelines
from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.pipelines import PipelineRegistry
from lakemirror.daemon.worker import CommandWorker
from tests.unit.databricks_fake import FakeJobsApi

WHEEL = "/Volumes/ops/lakemirror/wheels/lakemirror-0.1.0-py3-none-any.whl"
CONFIG_DIR = "/Volumes/ops/lakemirror/config"
BODY = {"source_catalog": "prod", "destination_catalog": "prod_mirror", "schema_name": "orders",
        "tables": ["order_items"], "trigger_interval_seconds": 10,
        "checkpoint_volume": "/Volumes/clone_audit/streaming/cs_checkpoints", "allow_schema_evolution": True}
JOB_SETTINGS = {"name": "lakemirror prod.orders-to-prod_mirror", "continuous": {"pause_status": "UNPAUSED"},
                "tags": {"created_by": "lakemirror", "pipeline_id": "prod.orders-to-prod_mirror",
                         "source": "prod.orders", "destination": "prod_mirror.orders"}}


@pytest.fixture
def fake() -> Iterator[FakeJobsApi]:
    routes: dict[tuple[str, str], Any] = {
        ("PUT", f"/api/2.0/fs/files{CONFIG_DIR}/prod.orders-to-prod_mirror.yaml"): {},
        ("POST", "/api/2.2/jobs/create"): {"job_id": 42},
        ("GET", "/api/2.2/jobs/runs/list"): {"runs": [{"job_id": 42, "run_id": 7, "run_page_url": "https://ws/jobs/42/runs/7",
                                                       "state": {"life_cycle_state": "RUNNING"}}]},
        ("GET", "/api/2.2/jobs/get"): {"job_id": 42, "settings": JOB_SETTINGS},
        ("GET", "/api/2.2/jobs/list"): {"jobs": [{"job_id": 42, "settings": JOB_SETTINGS},
                                                 {"job_id": 5, "settings": {"name": "not ours"}}]},
        ("POST", "/api/2.2/jobs/update"): {},
        ("POST", "/api/2.2/jobs/runs/cancel-all"): {},
        ("POST", "/api/2.2/jobs/delete"): {},
    }
    with FakeJobsApi(routes) as api:
        yield api


@pytest.fixture
def url(fake: FakeJobsApi, tmp_path: Path) -> Iterator[str]:
    worker = CommandWorker()
    config = DatabricksSettings(wheel=WHEEL, config_dir=CONFIG_DIR)  # type: ignore[call-arg]

    def refuse(*args: Any) -> Any:
        raise AssertionError("databricks mode starts no local pipeline")

    api = ContinuousSyncApi(mode="databricks", registry=PipelineRegistry(), worker=worker, start_pipeline=refuse,
                            cdf_check=refuse, databricks=lambda: DatabricksPipelines(fake.client(), config))
    server = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [], {}, api=api)
    server.start()
    yield server.url
    server.close()
    worker.close()


def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method,
                                 headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_post_uploads_the_pipeline_file_and_creates_the_continuous_job(fake: FakeJobsApi, url: str) -> None:
    assert call("POST", f"{url}/api/continuous-sync", BODY) == (
        201, {"job_id": 42, "run_url": "https://ws/jobs/42/runs/7"})
    assert fake.calls() == [("PUT", f"/api/2.0/fs/files{CONFIG_DIR}/prod.orders-to-prod_mirror.yaml"),
                            ("POST", "/api/2.2/jobs/create"), ("GET", "/api/2.2/jobs/runs/list")]
    method, path, query, uploaded = fake.requests[0]
    assert query == {"overwrite": ["true"]}
    assert yaml.safe_load(uploaded) == BODY  # exactly what was posted: no daemon sections, no secrets
    create = fake.requests[1][3]
    assert create["tags"]["kind"] == "continuous-sync" and create["continuous"] == {"pause_status": "UNPAUSED"}
    assert create["tasks"][0]["python_wheel_task"]["parameters"] == [
        "run", f"{CONFIG_DIR}/prod.orders-to-prod_mirror.yaml", "--set", "runtime.mode=databricks"]
    assert create["tasks"][0]["libraries"] == [{"whl": WHEEL}]


def test_a_bad_body_never_reaches_the_workspace(fake: FakeJobsApi, url: str) -> None:
    code, answer = call("POST", f"{url}/api/continuous-sync", {**BODY, "trigger_interval_seconds": 0})
    assert code == 422 and answer["problems"][0]["field"] == "trigger_interval_seconds"
    assert fake.requests == []


def test_list_and_get_show_the_lakemirror_jobs_with_their_run(fake: FakeJobsApi, url: str) -> None:
    code, listed = call("GET", f"{url}/api/continuous-sync")
    assert code == 200 and [(p["job_id"], p["origin"], p["state"], p["run_url"]) for p in listed["pipelines"]] == [
        (42, "databricks", "running", "https://ws/jobs/42/runs/7")]
    code, one = call("GET", f"{url}/api/continuous-sync/42")
    assert code == 200 and one["source"] == "prod.orders" and one["pipeline_id"] == "prod.orders-to-prod_mirror"
    assert fake.requests[-2][:3] == ("GET", "/api/2.2/jobs/get", {"job_id": ["42"]})


def test_delete_pauses_cancels_and_deletes_the_job(fake: FakeJobsApi, url: str) -> None:
    code, answer = call("DELETE", f"{url}/api/continuous-sync/42")
    assert code == 200 and answer == {"job_id": 42, "stopped": True, "checkpoints_deleted": False}
    assert fake.calls() == [("GET", "/api/2.2/jobs/get"), ("GET", "/api/2.2/jobs/get"),
                            ("POST", "/api/2.2/jobs/update"), ("POST", "/api/2.2/jobs/runs/cancel-all"),
                            ("POST", "/api/2.2/jobs/delete")]
    assert fake.requests[2][3] == {"job_id": 42, "new_settings": {"continuous": {"pause_status": "PAUSED"}}}
    assert fake.requests[4][3] == {"job_id": 42}
    assert call("DELETE", f"{url}/api/continuous-sync/42?cleanup_checkpoints=true")[0] == 409


def test_pause_and_resume_move_the_continuous_trigger(fake: FakeJobsApi, url: str) -> None:
    assert call("POST", f"{url}/api/continuous-sync/42/pause") == (202, {"job_id": 42, "accepted": "pause"})
    assert fake.calls()[-2:] == [("POST", "/api/2.2/jobs/update"), ("POST", "/api/2.2/jobs/runs/cancel-all")]
    assert call("POST", f"{url}/api/continuous-sync/42/resume") == (202, {"job_id": 42, "accepted": "resume"})
    assert fake.requests[-1][1:] == ("/api/2.2/jobs/update", {},
                                     {"job_id": 42, "new_settings": {"continuous": {"pause_status": "UNPAUSED"}}})
    assert call("POST", f"{url}/api/continuous-sync/42/resync/order_items")[0] == 501


def test_a_job_that_is_not_lakemirrors_is_404(fake: FakeJobsApi, url: str) -> None:
    fake.routes[("GET", "/api/2.2/jobs/get")] = {"job_id": 5, "settings": {"name": "not ours"}}
    for method, path in [("GET", "/5"), ("DELETE", "/5"), ("POST", "/5/pause")]:
        assert call(method, f"{url}/api/continuous-sync{path}")[0] == 404
    assert [c for c in fake.calls() if c[0] == "POST"] == []


def test_without_wheel_and_config_dir_submitting_is_503_and_says_what_to_set(fake: FakeJobsApi) -> None:
    api = ContinuousSyncApi(mode="databricks", registry=PipelineRegistry(), worker=CommandWorker(),
                            start_pipeline=lambda s: None, cdf_check=lambda c, s: [],  # type: ignore[arg-type,return-value]
                            databricks=lambda: DatabricksPipelines(fake.client(), DatabricksSettings()))  # type: ignore[call-arg]
    server = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [], {}, api=api)
    server.start()
    try:
        code, answer = call("POST", f"{server.url}/api/continuous-sync", BODY)
        assert code == 503 and "databricks.wheel" in answer["error"] and fake.requests == []
    finally:
        server.close()
        api.worker.close()


# -- the seed's X-Databricks-Host / X-Databricks-Token headers, through the composition root ---------

SECRET = "dapi-REQUEST-TOKEN-7f3c9e1b2a"
SEED_BODY = {"source_catalog": "prod", "destination_catalog": "prod_mirror", "schema_name": "orders",
             "trigger_interval_seconds": 30}


class NoAmbientWorkspace:
    """The daemon's own workspace: must not be used when a request names another one."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the daemon's own workspace was used ({name}) despite the request's headers")


@pytest.fixture
def root_url(tmp_path: Path) -> Iterator[str]:
    """The API as the composition root wires it in databricks mode (the real header -> client factory)."""
    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.settings import load_settings

    settings = load_settings(None, {
        "pipeline_id": "main", "source_catalog": "prod", "destination_catalog": "prod_mirror", "schema_name": "orders",
        "checkpoint_volume": "/Volumes/clone_audit/streaming/cs_checkpoints", "runtime": {"mode": "databricks"},
        "databricks": {"wheel": WHEEL, "config_dir": CONFIG_DIR}})
    app = DaemonContext(settings).replace(workspace=NoAmbientWorkspace())
    server = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [], {}, api=app.api)
    server.start()
    yield server.url
    server.close()
    app.api.worker.close()


def send(url: str, body: Any, headers: dict[str, str], method: str = "POST") -> tuple[int, Any, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method,
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read().decode()
            return resp.status, json.loads(raw), raw
    except HTTPError as exc:
        raw = exc.read().decode()
        return exc.code, json.loads(raw), raw


def test_the_seeds_request_creates_the_job_in_the_named_workspace_with_its_token_and_never_shows_it(
        fake: FakeJobsApi, root_url: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    headers = {"X-Databricks-Host": fake.host, "X-Databricks-Token": SECRET}
    code, answer, raw = send(f"{root_url}/api/continuous-sync", SEED_BODY, headers)
    assert (code, answer) == (201, {"job_id": 42, "run_url": "https://ws/jobs/42/runs/7"})
    assert fake.calls() == [("PUT", f"/api/2.0/fs/files{CONFIG_DIR}/prod.orders-to-prod_mirror.yaml"),
                            ("POST", "/api/2.2/jobs/create"), ("GET", "/api/2.2/jobs/runs/list")]
    assert all(h.get("Authorization") == f"Bearer {SECRET}" for h in fake.headers)
    uploaded = yaml.safe_load(fake.requests[0][3])
    assert uploaded == {**SEED_BODY, "checkpoint_volume": "/Volumes/clone_audit/streaming/cs_checkpoints/api"}
    # the other routes use the request's workspace too
    code, listed, raw_list = send(f"{root_url}/api/continuous-sync", None, headers, "GET")
    assert code == 200 and [p["job_id"] for p in listed["pipelines"]] == [42]
    # a workspace that refuses: a 502 naming the cause, without the token
    fake.routes[("POST", "/api/2.2/jobs/create")] = None
    code, failed, raw_failed = send(f"{root_url}/api/continuous-sync", {**SEED_BODY, "schema_name": "x"}, headers)
    assert code == 502 and "the Databricks workspace failed" in failed["error"]
    logged = "\n".join(r.getMessage() + str(r.args) + str(r.exc_info) for r in caplog.records)
    out = capfd.readouterr()
    for text in (raw, raw_list, raw_failed, logged, out.out, out.err):
        assert SECRET not in text
    assert "api: POST /api/continuous-sync: the Databricks workspace failed" in logged


@pytest.mark.parametrize("headers, message", [
    ({"X-Databricks-Token": SECRET}, "send both X-Databricks-Host and X-Databricks-Token"),
    ({"X-Databricks-Host": "https://ws.example.com"}, "send both"),
    ({"X-Databricks-Host": "http://ws.example.com", "X-Databricks-Token": SECRET}, "must be a workspace URL"),
    ({"X-Databricks-Host": "https://user:pw@ws.example.com", "X-Databricks-Token": SECRET}, "must be a workspace URL"),
    ({"X-Databricks-Host": "https://ws.example.com/path", "X-Databricks-Token": SECRET}, "must be a workspace URL"),
])
def test_unusable_workspace_headers_are_400_without_echoing_the_token(
        fake: FakeJobsApi, root_url: str, headers: dict[str, str], message: str) -> None:
    code, answer, raw = send(f"{root_url}/api/continuous-sync", SEED_BODY, headers)
    assert code == 400 and message in answer["error"] and SECRET not in raw
    assert fake.requests == []
