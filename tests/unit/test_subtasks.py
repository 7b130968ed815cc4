"""The daemon's scheduled sub-tasks: the `schedules` settings, the service that starts due runs on
worker threads, their metrics, and `/status`. No Spark: runs are in-memory twins."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lakemirror.daemon.settings.runtime_spec import pipeline_spec
from lakemirror.daemon.cli import main
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.settings.runtime_spec import jobs_for, subtask_of
from lakemirror.errors import ConfigError
from lakemirror.identifiers import TableName
from lakemirror.sinks.merge.planner import diff_schema
from lakemirror.sinks.batch.reconcile_plan import ReconcileResult
from lakemirror.supervisor.subtasks.batch_runner import OperationOutcome, RunSummary, TableJob, TaskSettings
from lakemirror.supervisor.subtasks.scheduler import DailyAt, Every
from lakemirror.supervisor.subtasks.service import Subtask, SubtaskRun, SubtaskService

BASE: dict[str, Any] = {"source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
                        "checkpoint_volume": "/tmp/ckpt", "exclude_tables": ["archive"],
                        "table_overrides": {"archive": {"keys": ["id"], "exclude_columns": ["secret"]}}}


def settings(**changes: Any) -> Any:
    return load_settings(None, {**BASE, **changes})


# -- configuration ------------------------------------------------------------------------------

def test_schedules_load_with_defaults_and_triggers() -> None:
    s = settings(schedules=[
        {"name": "nightly", "operations": ["reconcile", "metadata"], "daily_at": "02:30",
         "reconcile": {"buckets": 64}},
        {"name": "sweep", "operations": ["incremental"], "every_seconds": 600, "tables": ["archive"],
         "retry": {"max_attempts": 5}}])
    nightly, sweep = (subtask_of(x, "p") for x in s.schedules)
    assert (nightly.trigger, nightly.tables) == (DailyAt(2, 30), None)
    assert nightly.settings.operations == ("reconcile", "metadata")
    assert nightly.settings.options["reconcile"]["buckets"] == 64
    assert (sweep.trigger, sweep.tables, sweep.settings.max_attempts) == (Every(600), ("archive",), 5)


@pytest.mark.parametrize("entry, where, words", [
    ({"name": "a", "operations": ["reconcile"], "daily_at": "2:30"}, "schedules[0].daily_at", "HH:MM"),
    ({"name": "a", "operations": ["reconcile"]}, "schedules[0]", "exactly one"),
    ({"name": "a", "operations": ["reconcile"], "every_seconds": 5, "daily_at": "01:00"}, "schedules[0]",
     "exactly one"),
    ({"name": "a", "operations": ["copy"], "every_seconds": 5}, "schedules[0].operations[0]", "clone"),
    ({"name": "a", "operations": [], "every_seconds": 5}, "schedules[0].operations", "at least 1"),
    ({"name": "a b", "operations": ["reconcile"], "every_seconds": 5}, "schedules[0].name", "1-64"),
    ({"name": "a", "operations": ["reconcile"], "every_seconds": 0}, "schedules[0].every_seconds", "greater"),
    ({"name": "a", "operations": ["reconcile"], "every_seconds": 5, "colour": 1}, "schedules[0].colour", "unknown"),
    ({"name": "a", "operations": ["reconcile"], "every_seconds": 5, "reconcile": {"bukets": 1}},
     "schedules[0].reconcile.bukets", "unknown"),
    ({"name": "a", "operations": ["incremental"], "every_seconds": 5}, "schedules[0].tables", "name the tables"),
    ({"name": "a", "operations": ["clone"], "every_seconds": 5, "tables": ["orders"]}, "schedules[0].tables",
     "replicated continuously"),
])
def test_bad_schedules_are_refused_naming_the_field(entry: dict[str, Any], where: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(schedules=[entry])
    assert any(loc.endswith(where) and words in msg for loc, msg in info.value.problems), info.value.problems


def test_names_are_unique_and_writers_may_take_tables_outside_the_stream() -> None:
    ok = {"name": "a", "operations": ["clone", "reconcile"], "every_seconds": 5, "tables": ["archive"]}
    assert settings(schedules=[ok]).schedules[0].tables == ["archive"]
    assert settings(tables=["orders"], exclude_tables=[], table_overrides={},
                    schedules=[{**ok, "tables": ["other"]}]).schedules
    with pytest.raises(ConfigError) as info:
        settings(schedules=[ok, ok])
    assert info.value.problems == [("settings: schedules[1].name", "another sub-task is named 'a'; names must be "
                                                                   "unique")]


def test_lakemirror_validate_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**BASE, "checkpoint_volume": str(tmp_path),
                                    "schedules": [{"name": "n", "operations": ["reconcile"], "daily_at": "25:00"}]}))
    assert main(["validate", str(path)]) == 2
    assert f"{path}: schedules[0].daily_at" in capsys.readouterr().err


def test_jobs_take_the_pipelines_tables_keys_and_columns() -> None:
    s = settings(tables=None, schedules=[
        {"name": "r", "operations": ["reconcile"], "every_seconds": 60},
        {"name": "i", "operations": ["incremental"], "every_seconds": 60, "tables": ["archive"]}])
    def spec_tables() -> list[str]:
        return ["orders", "customers"]

    spec = pipeline_spec(s)
    r, i = (subtask_of(x, spec.pipeline_id) for x in s.schedules)
    assert [(j.source, j.target) for j in jobs_for(r, spec, spec_tables)] == [
        (TableName("src", "sales", "orders"), TableName("dst", "sales", "orders")),
        (TableName("src", "sales", "customers"), TableName("dst", "sales", "customers"))]
    [job] = jobs_for(i, spec, spec_tables)
    assert job.settings.keys == ("id",)
    assert job.settings.options["incremental"] == {"include_columns": [], "exclude_columns": ["secret"]}


# -- the service --------------------------------------------------------------------------------

class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def summary(ok: bool, run_id: str = "r") -> RunSummary:
    job = TableJob(TableName("src", "sales", "t"), TableName("dst", "sales", "t"), TaskSettings())
    return RunSummary(run_id, (OperationOutcome(job, "reconcile", "success" if ok else "failed", 1,
                                                None if ok else "3 missing", {}),))


def recon(missing: int) -> ReconcileResult:
    return ReconcileResult(source="src.sales.t", replica="dst.sales.t", source_version=3, source_rows=10,
                           replica_rows=10 - missing, schema=diff_schema((), ()), buckets=4, buckets_differing=1 if missing else 0,
                           missing=missing, extra=0, different=0, sample_keys={})


def service(run: Callable[[str, Sequence[TableJob]], SubtaskRun], clock: Clock, metrics: Metrics,
            spawn: Any = None, every: float = 60) -> SubtaskService:
    task = Subtask("rec", Every(every), TaskSettings(operations=("reconcile",)))
    kwargs: dict[str, Any] = {} if spawn is None else {"spawn": spawn}
    ids = iter(f"run{i}" for i in range(100))
    return SubtaskService([task], jobs=lambda t: [], run=run, observer=metrics, clock=clock,
                          new_run_id=lambda: next(ids), **kwargs)


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"pipeline": "p", **labels})


def test_a_due_run_is_recorded_in_status_and_metrics() -> None:
    clock, metrics = Clock(), Metrics("p", CollectorRegistry())
    seen: list[str] = []

    def run(run_id: str, jobs: Sequence[TableJob]) -> SubtaskRun:
        seen.append(run_id)
        return SubtaskRun(summary(True, run_id), {"t": recon(3)})

    def inline(target: Callable[[], None], name: str) -> threading.Thread:
        target()
        return threading.Thread()

    svc = service(run, clock, metrics, spawn=inline)
    assert sample(metrics, "lakemirror_subtask_next_run_timestamp_seconds", task="rec") == 1060
    svc.tick()
    assert seen == []
    clock.t = 1061
    svc.tick()
    assert seen == ["run0"]
    [view] = svc.status()
    assert (view["last_outcome"], view["last_success_at"], view["next_run_at"], view["runs"]) == (
        "success", 1061, 1120, 1)
    assert view["operations"] == ["reconcile"] and view["tables"] is None
    assert sample(metrics, "lakemirror_subtask_runs_total", task="rec", status="success") == 1
    assert sample(metrics, "lakemirror_subtask_last_success_timestamp_seconds", task="rec") == 1061
    assert sample(metrics, "lakemirror_subtask_next_run_timestamp_seconds", task="rec") == 1120
    assert sample(metrics, "lakemirror_reconcile_mismatched_keys", table="t", kind="missing") == 3
    assert sample(metrics, "lakemirror_reconcile_mismatched_keys", table="t", kind="extra") == 0


def test_a_failed_run_and_a_run_that_raises_are_failures() -> None:
    clock, metrics = Clock(), Metrics("p", CollectorRegistry())
    outcomes = [SubtaskRun(summary(False)), RuntimeError("catalog unreachable")]

    def run(run_id: str, jobs: Sequence[TableJob]) -> SubtaskRun:
        step = outcomes.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def inline(target: Callable[[], None], name: str) -> threading.Thread:
        target()
        return threading.Thread()

    svc = service(run, clock, metrics, spawn=inline, every=10)
    clock.t = 1010
    svc.tick()
    [view] = svc.views()
    assert view.last_outcome == "failed" and "1 of 1 operations failed" in (view.last_error or "")
    clock.t = 1020
    svc.tick()
    [view] = svc.views()
    assert view.last_error == "RuntimeError: catalog unreachable" and view.last_success_at is None
    assert sample(metrics, "lakemirror_subtask_runs_total", task="rec", status="failed") == 2
    assert sample(metrics, "lakemirror_subtask_last_success_timestamp_seconds", task="rec") is None


def test_a_slow_run_never_blocks_the_tick_nor_overlaps_itself() -> None:
    clock, metrics = Clock(), Metrics("p", CollectorRegistry())
    release, started = threading.Event(), []

    def run(run_id: str, jobs: Sequence[TableJob]) -> SubtaskRun:
        started.append(run_id)
        assert release.wait(10)
        return SubtaskRun(summary(True, run_id))

    svc = service(run, clock, metrics, every=10)
    clock.t = 1010
    svc.tick()                      # returns at once: the run waits on `release` in its thread
    for t in range(1011, 1100):     # many run times pass while it runs: none starts
        clock.t = t
        svc.tick()
    assert started == ["run0"] and svc.views()[0].running
    assert svc.shutdown(0.05) == [svc.views()[0].task], "a run still in flight at the deadline is named"
    release.set()
    assert svc.shutdown(5) == []
    view = svc.views()[0]
    assert not view.running and view.runs == 1
    clock.t = 1100
    svc.tick()                      # after shutdown nothing starts
    assert started == ["run0"]


def test_status_serves_the_subtasks() -> None:
    svc = service(lambda r, j: SubtaskRun(summary(True)), Clock(), Metrics("p", CollectorRegistry()))
    server = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [], {"pipeline_id": "p"},
                           subtasks=svc.status)
    server.start()
    try:
        with urllib.request.urlopen(f"{server.url}/status", timeout=5) as resp:
            body = json.load(resp)
    finally:
        server.close()
    [task] = body["subtasks"]
    assert (task["task"], task["schedule"], task["next_run_at"], task["last_outcome"]) == (
        "rec", "every 60 s", 1060.0, None)


def test_status_text_lists_the_subtasks() -> None:
    from lakemirror.daemon.status import render_subtasks

    assert render_subtasks([], now=0) == ""
    text = render_subtasks([{"task": "rec", "schedule": "every 60 s", "running": False, "next_run_at": 1060.0,
                             "last_started_at": 990.0, "last_outcome": "failed", "last_error": "boom"}], now=1000.0)
    assert text.splitlines() == [
        "SUB-TASK  SCHEDULE    STATE  NEXT RUN  LAST RUN  LAST OUTCOME  LAST ERROR",
        "rec       every 60 s  idle   in 60s    10s ago   failed        boom"]
