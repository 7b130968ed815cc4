"""The composition root (lakemirror.daemon.context): parts built once and on first use, replaced by
name for tests, and the two intervals of the settings reaching the parts that use them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.daemon import routes
from lakemirror.daemon.context import DaemonContext, ReplicateContext
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.settings import Settings, load_settings
from lakemirror.daemon.settings.replicate import load_replicate_config
from lakemirror.sinks.postgres.waits import ServerWait
from lakemirror.sources.catalog import LocalCatalog


def settings(tmp_path: Path, **changes: Any) -> Settings:
    return load_settings(None, {
        "pipeline_id": "main", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
        "tables": ["orders"], "checkpoint_volume": str(tmp_path / "ck"),
        "runtime": {"warehouse": str(tmp_path / "wh")}, **changes})


def test_a_part_is_built_once_and_only_when_asked_for(tmp_path: Path) -> None:
    ctx = DaemonContext(settings(tmp_path))
    assert "catalog" not in ctx.__dict__ and "spark" not in ctx.__dict__
    catalog = ctx.catalog
    assert isinstance(catalog, LocalCatalog) and ctx.catalog is catalog
    assert "spark" not in ctx.__dict__, "the local catalog needs no Spark"
    assert ctx.spec.pipeline_id == "main" and ctx.pipeline_dir == tmp_path / "ck" / "main"


def test_replace_puts_a_part_in_place_of_its_factory_and_refuses_unknown_names(tmp_path: Path) -> None:
    spark, checkpoints = object(), InMemoryCheckpointStore()
    ctx = DaemonContext(settings(tmp_path)).replace(spark=spark, checkpoints=checkpoints)
    assert ctx.spark is spark and ctx.checkpoints is checkpoints
    assert ctx.runner_context.spark is spark and ctx.runner_context.checkpoints is checkpoints
    with pytest.raises(TypeError, match="no factory 'sparks'"):
        ctx.replace(sparks=spark)
    with pytest.raises(TypeError, match="no factory 'list_tables'"):  # a method, not a factory
        ctx.replace(list_tables=lambda: [])


def test_a_pipeline_posted_to_the_api_shares_the_session_and_registry_but_not_the_state(tmp_path: Path) -> None:
    parent = DaemonContext(settings(tmp_path)).replace(spark=object(), metrics=Metrics("main", CollectorRegistry()),
                                                       checkpoints=InMemoryCheckpointStore())
    child = parent.for_pipeline(settings(tmp_path, pipeline_id="other", tables=["customers"]))
    assert child.spark is parent.spark and child.catalog is parent.catalog
    assert child.checkpoints is parent.checkpoints, "the same checkpoint table: the same store"
    assert child.metrics.registry is parent.metrics.registry
    assert (child.metrics.pipeline, parent.metrics.pipeline) == ("other", "main")
    assert child.spec.tables == ("customers",) and child.pipeline_dir == tmp_path / "ck" / "other"


def test_turns_are_spaced_by_turn_interval_seconds_and_queries_triggered_by_trigger_interval(tmp_path: Path) -> None:
    def spacing(**changes: Any) -> tuple[float, float]:
        ctx = DaemonContext(settings(tmp_path, **changes)).replace(metrics=Metrics("main", CollectorRegistry()))
        return ctx.supervisor._turns._min_interval, ctx.spec.trigger_interval_seconds

    assert spacing(trigger_interval_seconds=2) == (2.0, 2.0), "unset: the trigger interval, as before the split"
    assert spacing(trigger_interval_seconds=2, turn_interval_seconds=0.5) == (0.5, 2.0)


def test_the_replicate_context_names_its_audit_tables_and_runs_without_incremental_state(tmp_path: Path) -> None:
    config = load_replicate_config(None, data={"runtime": {"warehouse": str(tmp_path)},
                                               "catalogs": [{"name": "prod", "target_catalog": "dr"}]})
    ctx = ReplicateContext(config).replace(run_id="r1")
    assert ctx.audit_table == config.effective_audit_table
    assert ctx.reconciliation_table == config.effective_reconciliation_table
    assert ctx.run_id == "r1" and ctx.runtime is config.runtime


def test_status_lists_the_triggered_and_snapshot_tables_beside_the_streamed_ones(tmp_path: Path) -> None:
    ctx = DaemonContext(settings(tmp_path, tables=["orders", "archive"], destination={
        "kind": "postgres", "host": "h", "database": "db", "user": "u", "table_modes": {"archive": "triggered"},
        "every_seconds": 600}, http={"port": 0})).replace(metrics=Metrics("main", CollectorRegistry()))
    ctx.supervisor._seed(0.0)  # noqa: SLF001 (no Spark: the streamed table is not started here)
    try:
        status, body = ctx.server.answer(routes.match("GET", "/status"), None)  # type: ignore[arg-type]
    finally:
        ctx.server.server.server_close()  # bound, never started
    tables = {t["table"]: t for t in body["tables"]}
    assert status == 200 and "archive" in tables, body
    assert tables["archive"]["state"] == "starting" and tables["archive"]["detail"]["mode"] == "triggered"
    assert tables["archive"]["detail"]["sub_task"] == "postgres-triggered"

    class Cycles:  # what the cycles' side says once a cycle runs: its table waits for a lock
        def wait_of(self, table: str) -> ServerWait | None:
            return ServerWait(5.0, "src.sales.archive: waiting for a lock on s.archive", "postgres_lock") \
                if table == "archive" else None

    ctx.replace(cycles=Cycles())
    [archive] = [v for v in ctx.table_views() if v.table == "archive"]
    assert (archive.state, archive.last_error) == ("degraded", "src.sales.archive: waiting for a lock on s.archive")
