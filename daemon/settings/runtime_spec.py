"""From validated settings to the runtime's own specs: the frozen dataclasses the supervisor,
the event stream and the batch runner take. The only place settings models are read field by
field; the layers below never import pydantic models."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from lakemirror.daemon.settings.destination import PostgresDestination
from lakemirror.daemon.settings.event_source import EventSourceSettings
from lakemirror.daemon.settings.maintenance import VACUUM_TASK
from lakemirror.daemon.settings.pipeline import Settings
from lakemirror.daemon.settings.replicate import CatalogEntry, ReplicateConfig
from lakemirror.daemon.settings.schedule import ScheduleSettings
from lakemirror.sinks.postgres.modes import Mode
from lakemirror.sources.catalog import Discovery
from lakemirror.supervisor.event_stream import EventStreamSpec
from lakemirror.supervisor.pg_cycles import OPERATIONS, operation_of
from lakemirror.supervisor.replicate import (
    CatalogSelection, SchemaSelection, TableJob, TaskSettings, plan_work,
)
from lakemirror.supervisor.spec import PipelineSpec, TableOptions
from lakemirror.supervisor.state import RestartPolicy
from lakemirror.supervisor.subtasks import Subtask

#: Where ``lakemirror replicate`` keeps incremental sweeps under ``checkpoint_volume`` (a daemon
#: uses its pipeline id instead), and part of their transaction ids.
REPLICATE_NAMESPACE = "replicate"


def pipeline_spec(s: Settings) -> PipelineSpec:
    """The streaming pipeline of the daemon's settings."""
    return PipelineSpec(
        pipeline_id=s.effective_pipeline_id, source_catalog=s.source_catalog,
        destination_catalog=s.destination_catalog, schema_name=s.schema_name,
        destination_schema=s.destination_schema or s.schema_name,
        checkpoint_root=s.checkpoint_volume,
        tables=tuple(s.tables) if s.tables is not None else None,
        exclude_tables=tuple(s.exclude_tables),
        options={t: TableOptions(tuple(o.keys), tuple(o.include_columns), tuple(o.exclude_columns))
                 for t, o in s.table_overrides.items()},
        trigger_interval_seconds=s.trigger_interval_seconds, apply_workers=s.effective_apply_workers,
        allow_schema_evolution=s.allow_schema_evolution,
        max_files_per_trigger=s.max_files_per_trigger, max_bytes_per_trigger=s.max_bytes_per_trigger,
        replica_properties=replica_properties(s),
        change_window_policy=s.change_window_policy, retention_warning_seconds=s.retention_warning_seconds,
        rewrite_below_bytes=s.rewrite_below_bytes, driver_apply=s.driver_apply,
        driver_apply_below_bytes=s.driver_apply_below_bytes, kernel_change_feed=s.kernel_change_feed,
        bootstrap=s.bootstrap.policy())


def replica_properties(s: Settings) -> dict[str, str]:
    """The Delta properties a replica lakemirror creates gets: the maintenance block's retention and
    checkpoint interval (:mod:`lakemirror.daemon.settings.maintenance`), then ``replica_properties``, which win."""
    return {**s.replica_maintenance.properties(), **s.replica_properties}


def maintenance_subtasks(s: Settings) -> list[Subtask]:
    """The scheduled VACUUM of the pipeline's Delta replicas (``replica_maintenance``); none for a
    PostgreSQL destination or an event source (whose replicas are kept by the source's own purge)."""
    trigger = s.replica_maintenance.vacuum_trigger()
    if trigger is None or s.destination.kind != "delta" or s.source is not None:
        return []
    pipeline_id = s.effective_pipeline_id
    settings = TaskSettings(operations=("vacuum",), timeout_seconds=s.replica_maintenance.vacuum_timeout_seconds,
                            max_attempts=1, options={"vacuum": {"pipeline_id": pipeline_id}},
                            config={"pipeline_id": pipeline_id, "replica_maintenance": s.replica_maintenance.model_dump()})
    return [Subtask(VACUUM_TASK, trigger, settings, None)]


def event_stream_spec(source: EventSourceSettings, settings: Settings) -> EventStreamSpec:
    """The one query of a pipeline fed by an event source (the YAML's ``source:`` block)."""
    return EventStreamSpec(
        name=source.name, kind=source.kind, format=source.format, path=source.path,
        bootstrap_servers=source.bootstrap_servers, topics=",".join(source.topics) or None,
        topic_pattern=source.topic_pattern, tables=tuple(source.tables) if source.tables is not None else None,
        key_columns={t: tuple(c) for t, c in source.key_columns.items()},
        tombstone_horizon_seconds=source.tombstone_horizon_seconds,
        purge_interval_seconds=source.purge_interval_seconds, history=source.history,
        allow_schema_evolution=settings.allow_schema_evolution,
        trigger_interval_seconds=settings.trigger_interval_seconds, max_per_trigger=source.max_per_trigger,
        table_workers=source.table_workers, driver_apply=settings.driver_apply)


# -- the daemon's scheduled sub-tasks ------------------------------------------------------------

def subtask_of(s: ScheduleSettings, pipeline_id: str) -> Subtask:
    r = s.retry
    settings = TaskSettings(
        operations=tuple(s.operations), timeout_seconds=s.timeout_seconds, max_attempts=r.max_attempts,
        backoff=RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, r.multiplier, r.jitter),
        options={"clone": s.clone.model_dump(), "reconcile": s.reconcile.model_dump(),
                 "metadata": s.metadata.model_dump(), "vacuum": {"pipeline_id": pipeline_id}},
        config={"pipeline_id": pipeline_id, "schedule": s.model_dump()})
    return Subtask(s.name, s.trigger(), settings, tuple(s.tables) if s.tables is not None else None)


def postgres_subtasks(s: Settings) -> list[Subtask]:
    """The cycles of triggered and snapshot PostgreSQL replicas, one sub-task per mode, on the
    destination's schedule. ``tables`` None: every pipeline table whose mode it is (:func:`cycle_mode`)."""
    d = s.destination
    trigger = d.trigger() if isinstance(d, PostgresDestination) else None
    if not isinstance(d, PostgresDestination) or trigger is None:
        return []
    out = []
    for mode in sorted(d.cycled_modes()):
        settings = TaskSettings(operations=(operation_of(mode),), timeout_seconds=d.cycle_timeout_seconds,
                                config={"pipeline_id": s.effective_pipeline_id, "destination_mode": mode,
                                        "snapshot_above_fraction": d.snapshot_above_fraction})
        tables = None if d.mode == mode else tuple(sorted(t for t, m in d.table_modes.items() if m == mode))
        out.append(Subtask(f"postgres-{mode}", trigger, settings, tables))
    return out


def cycle_mode(task: Subtask) -> Mode | None:
    """The destination mode whose cycles ``task`` runs (None: a sub-task of ``schedules``)."""
    ops = task.settings.operations
    return OPERATIONS.get(ops[0]) if len(ops) == 1 else None


def mode_of(s: Settings, table: str) -> Mode:
    d = s.destination
    return d.mode_of(table) if isinstance(d, PostgresDestination) else "continuous"


def jobs_for(task: Subtask, spec: PipelineSpec, list_tables: Callable[[], list[str]]) -> list[TableJob]:
    """The sub-task's tables (the pipeline's when it names none), each with the pipeline's key and
    column choice for that table."""
    jobs = []
    for table in task.tables if task.tables is not None else list_tables():
        opts = spec.options_for(table)
        settings = replace(task.settings, keys=opts.keys, options={
            **task.settings.options,
            "incremental": {"include_columns": list(opts.include_columns),
                            "exclude_columns": list(opts.exclude_columns)}})
        jobs.append(TableJob(spec.source(table), spec.destination(table), settings))
    return jobs


# -- lakemirror replicate ------------------------------------------------------------------------

def selections(cfg: ReplicateConfig) -> list[CatalogSelection]:
    return [CatalogSelection(
        source=c.name, target=c.target_catalog,
        include_schemas=tuple(c.include_schemas) if c.include_schemas is not None else None,
        exclude_schemas=tuple(c.exclude_schemas),
        schemas={s.name: SchemaSelection(s.target_schema,
                                         tuple(s.include_tables) if s.include_tables is not None else None,
                                         tuple(s.exclude_tables)) for s in c.schemas},
    ) for c in cfg.selected_catalogs()]


def task_settings(cfg: ReplicateConfig, catalog: CatalogEntry | None, schema: str, table: str) -> TaskSettings:
    """Resolve one table's settings through the hierarchy (see :mod:`lakemirror.daemon.settings.replicate`)."""
    s_entry = next((s for s in catalog.schemas if s.name == schema), None) if catalog else None
    t_entry = next((t for t in s_entry.tables if t.name == table), None) if s_entry else None
    s = cfg.resolve(catalog, s_entry, t_entry)
    r = s.retry
    return TaskSettings(
        operations=tuple(s.operations), timeout_seconds=s.timeout_seconds, keys=tuple(s.keys),
        max_attempts=r.max_attempts,
        backoff=RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, r.multiplier, r.jitter),
        options={"clone": s.clone.model_dump(), "reconcile": s.reconcile.model_dump(),
                 "metadata": s.metadata.model_dump()},
        config={"runtime": cfg.runtime.model_dump(), **s.model_dump()})


def plan(cfg: ReplicateConfig, discovery: Discovery) -> list[TableJob]:
    entries = {(c.name, c.target_catalog): c for c in cfg.catalogs}
    return plan_work(selections(cfg), discovery,
                     lambda sel, schema, table: task_settings(cfg, entries[(sel.source, sel.target)], schema, table),
                     only_schemas=cfg.cli.target_schemas)
