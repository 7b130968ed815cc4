"""Triggered and snapshot PostgreSQL replicas as tables of /status (supervisor.subtasks.cycle_tables), fed by
the cycle sub-tasks' runs through the sub-task service. No Spark: runs are in-memory twins."""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from lakemirror.checkpoints.state import InMemoryStateStore, TableProgress
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.settings.runtime_spec import cycle_tables, destination_subtasks, pipeline_spec
from lakemirror.identifiers import TableName
from lakemirror.supervisor.subtasks.batch_runner import OperationOutcome, RunSummary, TableJob, TaskSettings
from lakemirror.supervisor.subtasks.service import SubtaskRun, SubtaskService

SETTINGS = load_settings(None, {
    "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales", "checkpoint_volume": "/tmp/ck",
    "tables": ["orders", "archive", "live"],
    "destination": {"kind": "postgres", "host": "h", "database": "db", "user": "u", "mode": "triggered",
                    "table_modes": {"archive": "snapshot", "live": "continuous"}, "every_seconds": 600}})


def outcome(table: str, ok: bool, **details: Any) -> OperationOutcome:
    job = TableJob(TableName("src", "sales", table), TableName("dst", "sales", table), TaskSettings())
    return OperationOutcome(job, "postgres_triggered", "success" if ok else "failed", 1 if ok else 3,
                            None if ok else f"src.sales.{table}: cannot reach the server", details)


def test_cycled_tables_show_their_last_cycle_beside_the_streamed_ones() -> None:
    clock = [1000.0]
    states = InMemoryStateStore()
    spec = pipeline_spec(SETTINGS)
    states.save(spec.source("archive").slug, TableProgress(epoch=1, bootstrapped=True, bootstrap_version=41))
    runs: list[SubtaskRun] = []

    def run(run_id: str, jobs: Sequence[TableJob]) -> SubtaskRun:
        return runs.pop(0)

    def inline(target: Callable[[], None], name: str) -> threading.Thread:
        target()
        return threading.Thread()

    tasks = destination_subtasks(SETTINGS)
    holder: dict[str, SubtaskService] = {}
    views = cycle_tables(SETTINGS, spec, lambda: holder["svc"].views(), states, lambda: clock[0])
    svc = holder["svc"] = SubtaskService(tasks, jobs=lambda t: [], run=run, clock=lambda: clock[0], spawn=inline,
                                         on_run=views.record_run)

    before = {v.table: v for v in views.views()}
    assert sorted(before) == ["archive", "orders"], "the continuous table is the supervisor's"
    assert (before["orders"].state, before["orders"].applied_through) == ("starting", None)
    assert (before["archive"].state, before["archive"].applied_through) == ("running", 41), "held before this run"
    assert before["orders"].detail == {"mode": "triggered", "sub_task": "postgres-triggered",
                                       "next_cycle_at": 1600.0, "last_cycle": None}

    runs += [SubtaskRun(RunSummary("r1", (outcome("orders", True, action="snapshot", version=7, rows_loaded=100),))),
             SubtaskRun(RunSummary("r2", (outcome("archive", False),)))]
    clock[0] = 1601.0
    svc.tick()
    after = {v.table: v for v in views.views()}
    orders, archive = after["orders"], after["archive"]
    assert (orders.state, orders.applied_through, orders.rows_applied, orders.batches, orders.last_batch_at) == \
        ("running", 7, 100, 1, 1601.0)
    assert orders.detail["last_cycle"]["action"] == "snapshot" and orders.detail["next_cycle_at"] == 2200.0
    assert (archive.state, archive.failures, archive.applied_through, archive.next_retry_at) == \
        ("degraded", 1, 41, 2200.0)
    assert "cannot reach the server" in (archive.last_error or "")

    runs.append(SubtaskRun(RunSummary("r3", (outcome("orders", True, action="incremental", version=9,
                                                     rows_inserted=2, rows_updated=1),))))
    clock[0] = 2201.0
    runs.append(SubtaskRun(RunSummary("r4", (outcome("archive", True, action="snapshot", version=44,
                                                     rows_loaded=5),))))
    svc.tick()
    again = {v.table: v for v in views.views()}
    assert (again["orders"].applied_through, again["orders"].rows_applied, again["orders"].batches) == (9, 103, 2)
    assert (again["archive"].state, again["archive"].last_error, again["archive"].applied_through) == \
        ("running", None, 44)
