"""The REST control API (/api) on the real ControlServer with a real HTTP client; pipelines are real
Supervisors over in-memory runners, Spark work runs on the real CommandWorker."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator
from urllib.error import HTTPError

import pytest
from prometheus_client import CollectorRegistry

from lakemirror.daemon import routes
from lakemirror.daemon.api import ContinuousSyncApi
from lakemirror.daemon.settings import Settings
from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.openapi import document
from lakemirror.daemon.pipelines import PipelineHandle, PipelineRegistry
from lakemirror.daemon.worker import CommandWorker
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sources import cdf_check
from lakemirror.sources.catalog import TableInfo
from lakemirror.supervisor.control.lag import LagReading
from lakemirror.supervisor.control.loop import Supervisor
from lakemirror.tables import TableLocation

TOKEN = "api-t0ken-for-tests-51f0"


class MemoryRunner:
    """The Runner protocol in memory: launches at once, reports a fixed lag, remembers what it was told."""

    def __init__(self, table: str, halt_gate: threading.Event | None = None) -> None:
        self.table = table
        self.applied_through: int | None = 3
        self.last_batch_at: float | None = None
        self.last_lag: LagReading | None = None
        self.paused = False
        self.halted = False
        self.resyncs: list[str] = []
        self.halt_gate = halt_gate
        self._events: list[Any] = []

    def launch(self) -> None:
        from lakemirror.supervisor.control import table_state as sm
        self._events.append(sm.StreamStarted())

    def halt(self, timeout: float = 60.0) -> None:
        if self.halt_gate is not None:
            self.halt_gate.wait(10)
        self.halted = True

    def poll(self) -> list[Any]:
        out, self._events = self._events, []
        return out

    def probe_lag(self, now: float) -> LagReading | None:
        self.last_lag = LagReading(1.5, 2, 5, 3)
        return self.last_lag

    def pause_persisted(self, paused: bool) -> None:
        self.paused = paused

    def persisted_pause(self) -> bool:
        return False

    def resync(self, reason: str) -> None:
        self.resyncs.append(reason)


def pipeline_settings(tmp: Path, **kw: Any) -> Settings:
    base: dict[str, Any] = {"source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
                            "checkpoint_volume": str(tmp / "ck"), "tables": ["orders", "customers"]}
    return Settings.model_validate({**base, **kw})


def info(table: str, *, cdf: bool = True, columns: tuple[Column, ...] = (Column("id", "bigint", False),),
         props: dict[str, str] | None = None) -> TableInfo:
    name = TableName("src", "sales", table)
    properties = {"delta.enableChangeDataFeed": "true" if cdf else "false", **(props or {})}
    return TableInfo(TableLocation(name, f"/wh/src/sales/{table}"), "id-1", columns, properties)


class Daemon:
    """What the composition root wires, with in-memory parts: a registry, the worker, the server."""

    def __init__(self, tmp: Path, token: str | None = None, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.tmp = tmp
        self.registry = PipelineRegistry()
        self.worker = CommandWorker()
        self.runners: dict[tuple[str, str], MemoryRunner] = {}
        self.threads: list[str] = []
        self.halt_gate: threading.Event | None = None
        self.cdf_gate: threading.Event | None = None
        self.schemas = {("src", "sales"): [info("orders"), info("events", cdf=False,
                                                                 columns=(Column("payload", "string"),))]}
        self.settings = pipeline_settings(tmp, pipeline_id="main")
        config = PipelineHandle(self.settings, self._supervisor("main", ["orders"]), "config")
        self.registry.add(config)
        config.supervisor.start()
        config.tick()
        self.api = ContinuousSyncApi(mode="local", registry=self.registry, worker=self.worker,
                                     start_pipeline=self.start_pipeline, cdf_check=self.cdf_check,
                                     default_checkpoint_volume=str(tmp / "ck" / "api"), daemon=self.settings,
                                     timeout_seconds=timeout, drain_timeout_seconds=5)
        self.server = ControlServer(host, 0, CollectorRegistry(), config.views, {"pipeline_id": "main"},
                                    commands=config.supervisor.command, auth_token=token, api=self.api)
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def _supervisor(self, pid: str, tables: list[str]) -> Supervisor:
        def runner(table: str) -> MemoryRunner:
            self.runners[(pid, table)] = MemoryRunner(table, self.halt_gate)
            return self.runners[(pid, table)]
        return Supervisor(runner_factory=runner, list_tables=lambda: list(tables), lag_interval_seconds=0)

    def start_pipeline(self, settings: Settings) -> PipelineHandle:
        self.threads.append(threading.current_thread().name)
        handle = PipelineHandle(settings, self._supervisor(settings.effective_pipeline_id, list(settings.tables or [])),
                                "api")
        self.registry.add(handle)
        handle.supervisor.start()
        handle.tick()
        return handle

    def cdf_check(self, catalog: str, schema: str) -> list[cdf_check.Readiness]:
        self.threads.append(threading.current_thread().name)
        if self.cdf_gate is not None:
            self.cdf_gate.wait(10)
        return [cdf_check.assess(i) for i in self.schemas.get((catalog, schema), [])]

    def close(self) -> None:
        for gate in (self.halt_gate, self.cdf_gate):
            if gate is not None:
                gate.set()
        self.server.close()
        self.worker.close()


@pytest.fixture
def daemon(tmp_path: Path, request: Any) -> Iterator[Daemon]:
    d = Daemon(tmp_path, **getattr(request, "param", {}))
    yield d
    d.close()


def call(method: str, url: str, body: Any = None, token: str | None = None,
         raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            if resp.headers.get_content_type() == "text/html":
                return resp.status, resp.read().decode()
            return resp.status, json.loads(resp.read() or b"null")
    except HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def body(tmp: Path, **kw: Any) -> dict[str, Any]:
    return {"source_catalog": "src", "destination_catalog": "dst2", "schema_name": "sales",
            "tables": ["orders", "customers"], "trigger_interval_seconds": 2,
            "checkpoint_volume": str(tmp / "ck"), "allow_schema_evolution": True, "pipeline_id": "p2", **kw}


# -- pipelines --------------------------------------------------------------------------------------

def test_post_whose_lease_store_is_out_of_reach_is_503_naming_it_and_leaves_no_folder(
        daemon: Daemon, tmp_path: Path) -> None:
    from lakemirror.checkpoints.lease import LeaseUnreachable

    def unreachable(settings: Settings) -> PipelineHandle:
        raise LeaseUnreachable(settings.effective_pipeline_id, "s3://lake/locks/.lakemirror/leases/p2",
                               ConnectionError("Could not connect to the endpoint URL"))

    daemon.api.start_pipeline = unreachable
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))
    assert code == 503, answer
    assert answer["error"].startswith("pipeline p2: its lease at s3://lake/locks/.lakemirror/leases/p2 could not be "
                                      "read or written (ConnectionError: Could not connect")
    assert "lease.object_store" in answer["error"]
    assert not (tmp_path / "ck" / "p2").exists() and daemon.registry.get("p2") is None


def test_post_starts_a_second_pipeline_on_the_worker_and_get_shows_its_tables(daemon: Daemon, tmp_path: Path) -> None:
    assert call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path)) == (201, {"job_id": "p2", "run_url": ""})
    assert daemon.threads and all(t.startswith("api-worker") for t in daemon.threads)
    code, listed = call("GET", f"{daemon.url}/api/continuous-sync")
    assert code == 200
    assert [(p["job_id"], p["origin"], p["state"]) for p in listed["pipelines"]] == [
        ("main", "config", "running"), ("p2", "api", "running")]
    code, one = call("GET", f"{daemon.url}/api/continuous-sync/p2")
    assert code == 200 and one["destination"] == "dst2.sales" and one["run_url"] == ""
    assert [(t["table"], t["state"], t["lag_seconds"], t["versions_behind"]) for t in one["tables"]] == [
        ("customers", "running", 1.5, 2), ("orders", "running", 1.5, 2)]
    assert call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))[0] == 409
    assert call("GET", f"{daemon.url}/api/continuous-sync/nope")[0] == 404


def test_pause_resume_and_resync_are_queued_to_that_pipeline_only(daemon: Daemon, tmp_path: Path) -> None:
    call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync/p2/pause")
    assert code == 202 and answer == {"job_id": "p2", "accepted": "pause", "tables": ["customers", "orders"]}
    daemon.registry.tick_all()
    assert daemon.runners[("p2", "orders")].paused and daemon.runners[("p2", "customers")].paused
    assert not daemon.runners[("main", "orders")].paused
    _, one = call("GET", f"{daemon.url}/api/continuous-sync/p2")
    assert {t["state"] for t in one["tables"]} == {"paused"}
    assert call("POST", f"{daemon.url}/api/continuous-sync/p2/resume")[0] == 202
    daemon.registry.tick_all()
    assert not daemon.runners[("p2", "orders")].paused
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync/p2/resync/orders")
    assert code == 202 and answer == {"job_id": "p2", "accepted": "resync", "table": "orders"}
    daemon.registry.tick_all()
    assert daemon.runners[("p2", "orders")].resyncs and not daemon.runners[("main", "orders")].resyncs
    assert call("POST", f"{daemon.url}/api/continuous-sync/p2/resync/missing")[0] == 404
    assert call("POST", f"{daemon.url}/api/continuous-sync/zz/pause")[0] == 404


def test_a_table_name_with_any_character_is_one_encoded_segment(daemon: Daemon, tmp_path: Path) -> None:
    call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path, tables=["order's ü"]))
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync/p2/resync/order%27s%20%C3%BC")
    assert code == 202 and answer["table"] == "order's ü"


def test_delete_drains_and_forgets_the_pipeline_keeping_checkpoints_by_default(daemon: Daemon, tmp_path: Path) -> None:
    call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))
    assert (tmp_path / "ck" / "p2" / ".lakemirror-pipeline").is_file(), "lakemirror made the folder and marked it"
    code, answer = call("DELETE", f"{daemon.url}/api/continuous-sync/p2")
    assert code == 200 and answer == {"job_id": "p2", "stopped": True, "checkpoints_deleted": False}
    assert daemon.runners[("p2", "orders")].halted and not daemon.runners[("main", "orders")].halted
    assert (tmp_path / "ck" / "p2").is_dir()
    assert call("GET", f"{daemon.url}/api/continuous-sync/p2")[0] == 404
    assert call("DELETE", f"{daemon.url}/api/continuous-sync/p2")[0] == 404
    assert call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))[0] == 201  # the id is free again


def test_delete_with_cleanup_removes_only_the_pipelines_own_directory(daemon: Daemon, tmp_path: Path) -> None:
    call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))
    own, main = tmp_path / "ck" / "p2", tmp_path / "ck" / "main"
    (own / "src.sales.orders" / "e1").mkdir(parents=True)
    (main / "state").mkdir(parents=True)
    (tmp_path / "ck" / "p2.yaml").write_text("a neighbour, not the pipeline's directory")
    assert call("DELETE", f"{daemon.url}/api/continuous-sync/p2?cleanup_checkpoints=maybe")[0] == 422
    assert call("GET", f"{daemon.url}/api/continuous-sync/p2")[0] == 200  # a bad query stops nothing
    code, answer = call("DELETE", f"{daemon.url}/api/continuous-sync/p2?cleanup_checkpoints=true")
    assert code == 200 and answer["checkpoints_deleted"] is True
    assert not own.exists() and main.is_dir() and (tmp_path / "ck" / "p2.yaml").is_file()


def test_the_configured_pipeline_cannot_be_deleted_over_the_api(daemon: Daemon) -> None:
    code, answer = call("DELETE", f"{daemon.url}/api/continuous-sync/main?cleanup_checkpoints=true")
    assert code == 409 and "configuration file" in answer["error"]
    assert not daemon.runners[("main", "orders")].halted


def test_delete_answers_202_while_a_long_drain_goes_on(tmp_path: Path) -> None:
    d = Daemon(tmp_path, timeout=0.3)
    d.halt_gate = threading.Event()
    try:
        call("POST", f"{d.url}/api/continuous-sync", body(tmp_path))
        code, answer = call("DELETE", f"{d.url}/api/continuous-sync/p2")
        assert code == 202 and answer["state"] == "stopping"
        assert call("GET", f"{d.url}/api/continuous-sync/p2")[1]["state"] == "stopping"
        d.halt_gate.set()
        d.worker.call("sync", lambda: None, 5)
        assert call("GET", f"{d.url}/api/continuous-sync/p2")[0] == 404
    finally:
        d.close()


# -- the seed's body and checkpoint folders ------------------------------------------------------------

SEED_BODY = {"source_catalog": "prod", "destination_catalog": "prod_mirror", "schema_name": "orders",
             "trigger_interval_seconds": 30}


def test_the_seeds_rest_example_is_accepted_as_written_under_the_daemons_api_folder(
        daemon: Daemon, tmp_path: Path) -> None:
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync", SEED_BODY)
    assert code == 201, answer
    handle = daemon.registry.get(answer["job_id"])
    assert handle is not None and handle.origin == "api"
    assert handle.settings.checkpoint_volume == str(tmp_path / "ck" / "api")
    assert handle.directory == tmp_path / "ck" / "api" / answer["job_id"]
    assert call("POST", f"{daemon.url}/api/continuous-sync", SEED_BODY)[0] == 409  # same derived id


def test_without_a_daemon_default_checkpoint_volume_stays_required(tmp_path: Path) -> None:
    from lakemirror.daemon.api import settings_from_body

    assert settings_from_body(SEED_BODY, "local") == [
        {"field": "checkpoint_volume", "message": "required setting is missing"}]
    given = settings_from_body({**SEED_BODY, "checkpoint_volume": str(tmp_path / "mine")}, "local", str(tmp_path / "d"))
    assert not isinstance(given, list) and given.checkpoint_volume == str(tmp_path / "mine")


def _overlap_cases(tmp: Path) -> list[tuple[str, dict[str, Any], str]]:
    """(case, body fields, the running folder the 409 names); the configured pipeline is tmp/ck/main."""
    (tmp / "via").mkdir()
    (tmp / "via" / "x").symlink_to(tmp / "ck" / "main")          # the same folder under another name
    (tmp / "alias").symlink_to(tmp / "ck" / "main")              # a volume that is main's folder
    (tmp / "ck_link").symlink_to(tmp / "ck")
    main = str(tmp / "ck" / "main")
    return [("inside", {"checkpoint_volume": main, "pipeline_id": "p4"}, main),
            ("same via symlink", {"checkpoint_volume": str(tmp / "via"), "pipeline_id": "x"}, main),
            ("inside via symlink", {"checkpoint_volume": str(tmp / "alias"), "pipeline_id": "p3"}, main),
            ("api pipeline's folder", {"checkpoint_volume": str(tmp / "ck" / "p2"), "pipeline_id": "p5"},
             str(tmp / "ck" / "p2")),
            ("api pipeline's folder via symlink", {"checkpoint_volume": str(tmp / "ck_link" / "p2" / "sub"),
                                                   "pipeline_id": "p6"}, str(tmp / "ck" / "p2"))]


def test_a_pipeline_whose_folder_overlaps_a_running_ones_is_refused_at_creation(daemon: Daemon, tmp_path: Path) -> None:
    assert call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))[0] == 201  # tmp/ck/p2: a sibling
    for case, fields, running in _overlap_cases(tmp_path):
        code, answer = call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path, **fields))
        assert code == 409, (case, answer)
        new = str(Path(fields["checkpoint_volume"]) / fields["pipeline_id"])
        assert new in answer["error"] and running in answer["error"], (case, answer)
    assert [p.pipeline_id for p in daemon.registry.all()] == ["main", "p2"]
    assert len(daemon.threads) == 1  # refused before any start reached the worker
    code, _ = call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path, pipeline_id="p7"))
    assert code == 201  # another sibling is fine


def test_the_registry_itself_refuses_overlapping_folders(tmp_path: Path) -> None:
    from lakemirror.daemon.pipelines import FoldersOverlap, PipelineRegistry

    registry = PipelineRegistry()
    d = Daemon.__new__(Daemon)  # only its supervisor factory is used
    d.runners, d.halt_gate = {}, None
    registry.add(PipelineHandle(pipeline_settings(tmp_path, pipeline_id="a"), d._supervisor("a", []), "api"))
    inner = PipelineHandle(pipeline_settings(tmp_path, pipeline_id="b", checkpoint_volume=str(tmp_path / "ck" / "a")),
                           d._supervisor("b", []), "api")
    with pytest.raises(FoldersOverlap, match="overlaps"):
        registry.add(inner)
    registry.add(PipelineHandle(pipeline_settings(tmp_path, pipeline_id="c"), d._supervisor("c", []), "api"))
    assert [h.pipeline_id for h in registry.all()] == ["a", "c"]


# -- validation --------------------------------------------------------------------------------------

def test_a_bad_body_is_422_with_every_problem_and_its_field(daemon: Daemon, tmp_path: Path) -> None:
    bad = body(tmp_path, trigger_interval_seconds=-1, allow_schema_evolution="perhaps", tables=["a.b"],
               runtime={"mode": "local"}, colour="blue")
    del bad["source_catalog"]
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync", bad)
    assert code == 422
    fields = sorted(p["field"] for p in answer["problems"])
    assert fields == ["allow_schema_evolution", "colour", "runtime", "source_catalog", "tables",
                      "trigger_interval_seconds"]
    assert daemon.threads == [] and [p.pipeline_id for p in daemon.registry.all()] == ["main"]


@pytest.mark.parametrize("raw, message", [(b"[1, 2]", "JSON object"), (b"", "JSON object"), (b'"x"', "JSON object")])
def test_a_body_that_is_no_object_is_422(daemon: Daemon, raw: bytes, message: str) -> None:
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync", raw=raw)
    assert code == 422 and message in answer["problems"][0]["message"]


def test_a_body_that_is_no_json_is_400(daemon: Daemon) -> None:
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync", raw=b"{not json")
    assert code == 400 and "not valid JSON" in answer["error"]


def test_an_unusable_checkpoint_volume_is_422(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path, checkpoint_volume=str(tmp_path / "file")))
    assert code == 422 and answer["problems"][0]["field"] == "checkpoint_volume"


# -- cdf-check ----------------------------------------------------------------------------------------

def test_cdf_check_runs_on_the_worker_and_says_what_to_run(daemon: Daemon) -> None:
    code, answer = call("GET", f"{daemon.url}/api/incremental/cdf-check?catalog=src&schema=sales")
    assert code == 200 and answer["ready"] is False
    orders, events = answer["tables"]
    assert (orders["table"], orders["ready"], orders["key"], orders["key_rule"]) == (
        "src.sales.orders", True, ["id"], "column named id")
    assert orders["retention_headroom_seconds"] == 7 * 86400.0
    assert (events["ready"], events["cdf_enabled"], events["key"]) == (False, False, None)
    assert events["fixes"][0] == ("ALTER TABLE delta.`/wh/src/sales/events` SET TBLPROPERTIES "
                                  "('delta.enableChangeDataFeed' = 'true')")
    assert daemon.threads == ["api-worker_0"]


@pytest.mark.parametrize("query", ["", "?catalog=src", "?catalog=src&schema=a.b", "?schema=x&catalog="])
def test_cdf_check_needs_a_catalog_and_a_schema(daemon: Daemon, query: str) -> None:
    code, answer = call("GET", f"{daemon.url}/api/incremental/cdf-check{query}")
    assert code == 422 and answer["problems"]


def test_cdf_check_that_outlasts_the_timeout_is_504(tmp_path: Path) -> None:
    d = Daemon(tmp_path, timeout=0.3)
    d.cdf_gate = threading.Event()
    try:
        code, answer = call("GET", f"{d.url}/api/incremental/cdf-check?catalog=src&schema=sales")
        assert code == 504 and "did not finish within" in answer["error"]
    finally:
        d.close()


# -- auth ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("daemon", [{"token": TOKEN}], indirect=True)
def test_every_api_route_needs_the_token_when_one_is_set(daemon: Daemon, tmp_path: Path) -> None:
    for method, path in [("POST", "/api/continuous-sync"), ("GET", "/api/continuous-sync"),
                         ("GET", "/api/continuous-sync/main"), ("DELETE", "/api/continuous-sync/main"),
                         ("POST", "/api/continuous-sync/main/pause"), ("POST", "/api/continuous-sync/main/resume"),
                         ("POST", "/api/continuous-sync/main/resync/orders"),
                         ("GET", "/api/incremental/cdf-check?catalog=src&schema=sales")]:
        assert call(method, daemon.url + path, body(tmp_path))[0] == 401, (method, path)
        assert call(method, daemon.url + path, body(tmp_path), token="wrong")[0] == 401, (method, path)
    assert daemon.threads == []
    assert call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path), token=TOKEN)[0] == 201
    assert call("GET", f"{daemon.url}/api/continuous-sync", token=TOKEN)[0] == 200
    for open_path in ("/api/openapi.json", "/healthz", "/status", "/readyz"):
        assert call("GET", daemon.url + open_path)[0] == 200, open_path


@pytest.mark.parametrize("daemon", [{"host": "0.0.0.0"}], indirect=True)
def test_without_a_token_the_api_is_refused_off_loopback(daemon: Daemon, tmp_path: Path) -> None:
    code, answer = call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))
    assert code == 403 and "http.auth_token" in answer["error"]
    assert call("GET", f"{daemon.url}/api/incremental/cdf-check?catalog=src&schema=sales")[0] == 403
    assert call("GET", f"{daemon.url}/healthz")[0] == 200


# -- routing and the OpenAPI document -------------------------------------------------------------

def _operations_of_the_document() -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document()["paths"].items() for method in item}


def test_the_openapi_document_names_exactly_the_routes_the_server_dispatches() -> None:
    assert _operations_of_the_document() == {(r.method, r.template) for r in routes.ROUTES}
    doc = document()
    assert doc["openapi"].startswith("3.")
    for path, item in doc["paths"].items():
        for op in item.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == {part[1:-1] for part in path.split("/") if part.startswith("{")}, path


def test_the_server_answers_every_documented_operation_and_nothing_else(daemon: Daemon) -> None:
    code, served = call("GET", f"{daemon.url}/api/openapi.json")
    assert code == 200 and served == json.loads(json.dumps(document()))
    for method, path in sorted(_operations_of_the_document()):
        url = daemon.url + path.replace("{job_id}", "nope").replace("{table}", "orders")
        code, answer = call(method, url, {} if method == "POST" else None)
        assert code not in (405, 501) and not (code == 404 and "no such endpoint" in str(answer)), \
            (method, path, code, answer)
    for method, path in [("GET", "/api"), ("GET", "/api/continuous-sync/a/b"), ("GET", "/tables/x"),
                         ("POST", "/api/continuous-sync/a/resync"), ("GET", "/metrics/"), ("GET", "/status/x")]:
        code, answer = call(method, daemon.url + path)
        assert code == 404 and "no such endpoint" in answer["error"], (method, path)
    code, answer = call("DELETE", f"{daemon.url}/api/continuous-sync")
    assert code == 405 and "GET, POST" in answer["error"]


@pytest.mark.parametrize("method, target, name, params", [
    ("GET", "/api/continuous-sync/p%2F1", "get", {"job_id": "p/1"}),
    ("POST", "/api/continuous-sync/p/resync/a%20b", "resync", {"job_id": "p", "table": "a b"}),
    ("DELETE", "/api/continuous-sync/p?cleanup_checkpoints=true", "delete", {"job_id": "p"}),
    ("POST", "/tables/t/pause", "table_pause", {"table": "t"}),
])
def test_route_matching(method: str, target: str, name: str, params: dict[str, str]) -> None:
    m = routes.match(method, target)
    assert isinstance(m, routes.Match) and m.route.name == name and m.params == params
    assert routes.match("PATCH", target) == "method"
    assert routes.match(method, "/api/nothing") is None


def test_workspace_headers_are_ignored_outside_databricks_mode(daemon: Daemon) -> None:
    req = urllib.request.Request(f"{daemon.url}/api/continuous-sync", data=json.dumps(SEED_BODY).encode(),
                                 method="POST", headers={"X-Databricks-Host": "https://ws.example.com",
                                                         "X-Databricks-Token": "dapi-x",
                                                         "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 201 and json.loads(resp.read())["run_url"] == ""
