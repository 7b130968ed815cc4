"""From validated settings to the runtime's own specs: the frozen dataclasses the supervisor,
the event stream and the batch runner take. The only place settings models are read field by
field; the layers below never import pydantic models."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Sequence

from lakemirror.daemon.settings.event_source import EventSourceSettings
from lakemirror.daemon.settings.maintenance import VACUUM_TASK
from lakemirror.daemon.settings.pipeline import Settings
from lakemirror.daemon.settings.replicate import CatalogEntry, ObjectSettings, ReplicateConfig
from lakemirror.daemon.settings.schedule import ScheduleSettings
from lakemirror.sinks.waits import ServerWait
from lakemirror.identifiers import TableName
from lakemirror.sources.catalog import Discovery, volume_path
from lakemirror.checkpoints import layout
from lakemirror.checkpoints.state import StateStore
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec, TableOptions
from lakemirror.supervisor.control.table_state import RestartPolicy
from lakemirror.supervisor.events.stream_runner import EventStreamSpec
from lakemirror.supervisor.subtasks.batch_runner import (
    VOLUME_FILES, CatalogSelection, OperationOutcome, SchemaSelection, TableJob, TaskSettings, plan_work,
)
from lakemirror.supervisor.subtasks.cycle_tables import CycleTables
from lakemirror.supervisor.subtasks.scheduler import TaskView
from lakemirror.supervisor.subtasks.service import Subtask

#: Where ``lakemirror replicate`` keeps incremental sweeps under ``checkpoint_volume`` (a daemon
#: uses its pipeline id instead), and part of their transaction ids.
REPLICATE_NAMESPACE = layout.REPLICATE_DIR


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
        enable_change_data_feed=s.enable_change_data_feed, commit_file_batches=s.commit_file_batches,
        bootstrap=s.bootstrap.policy())


def replica_properties(s: Settings) -> dict[str, str]:
    """The Delta properties a replica lakemirror creates gets: the maintenance block's retention and
    checkpoint interval (:mod:`lakemirror.daemon.settings.maintenance`), then ``replica_properties``, which win."""
    return {**s.replica_maintenance.properties(), **s.replica_properties}


def maintenance_subtasks(s: Settings) -> list[Subtask]:
    """The scheduled VACUUM of the pipeline's Delta replicas (``replica_maintenance``); none for a
    destination of other tables or an event source (whose replicas are kept by the source's own purge)."""
    trigger = s.replica_maintenance.vacuum_trigger()
    if trigger is None or not s.destination.writes_delta or s.source is not None:
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


def destination_subtasks(s: Settings) -> list[Subtask]:
    """The destination's cycles (its tables kept on a schedule, not streamed), one sub-task per mode.
    ``tables`` None: every pipeline table whose mode it is (:func:`cycle_mode`)."""
    return s.destination.cycle_subtasks(s.effective_pipeline_id)


def cycle_tables(s: Settings, spec: PipelineSpec, task_views: Callable[[], list[TaskView]], states: StateStore,
                 clock: Callable[[], float],
                 waits: Callable[[str], ServerWait | None] = lambda table: None) -> CycleTables:
    """The tables kept by the destination's cycles as tables of ``/status``
    (:mod:`lakemirror.supervisor.subtasks.cycle_tables`): the tables the configuration names in those
    modes (more are found by their cycles)."""
    tasks = {cycle_mode(s, t): t.name for t in destination_subtasks(s)}
    named = spec.tables if spec.tables is not None else s.destination.moded_tables()
    tables = {t: mode_of(s, t) for t in sorted(named) if t not in spec.exclude_tables and mode_of(s, t) in tasks}

    def next_run(task: str) -> float | None:
        return next((v.next_run_at for v in task_views() if v.task == task), None)

    def holds(table: str) -> int | None:
        progress = states.load(spec.source(table).slug)
        return progress.bootstrap_version if progress.bootstrapped else None

    return CycleTables(tables, {m: name for m, name in tasks.items() if m is not None}, next_run=next_run,
                       holds=holds, waits=waits, clock=clock)


def cycle_mode(s: Settings, task: Subtask) -> str | None:
    """The destination mode whose cycles ``task`` runs (None: a sub-task of ``schedules``)."""
    return s.destination.cycle_mode(task.settings.operations)


def mode_of(s: Settings, table: str) -> str:
    """How ``table``'s replica is kept: ``continuous`` (streamed), or the mode of the destination's cycles."""
    return s.destination.mode_of(table)


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

def selections(cfg: ReplicateConfig, read_from: Mapping[str, str] | None = None) -> list[CatalogSelection]:
    """The selected catalog entries; ``read_from`` maps a source catalog to the catalog its tables are
    read from (the catalog made from its Delta share, in cross-metastore replication)."""
    return [CatalogSelection(
        source=(read_from or {}).get(c.name, c.name), target=c.target_catalog,
        include_schemas=tuple(c.include_schemas) if c.include_schemas is not None else None,
        exclude_schemas=tuple(c.exclude_schemas),
        schemas={s.name: SchemaSelection(s.target_schema,
                                         tuple(s.include_tables) if s.include_tables is not None else None,
                                         tuple(s.exclude_tables)) for s in c.schemas},
    ) for c in cfg.selected_catalogs()]


def _task_settings(cfg: ReplicateConfig, s: ObjectSettings) -> TaskSettings:
    r = s.retry
    return TaskSettings(
        operations=tuple(s.operations), timeout_seconds=s.timeout_seconds, keys=tuple(s.keys),
        max_attempts=r.max_attempts,
        backoff=RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, r.multiplier, r.jitter),
        options={"clone": s.clone.model_dump(), "reconcile": s.reconcile.model_dump(),
                 "metadata": s.metadata.model_dump(), "volume_files": s.volume_files.model_dump(),
                 "backup": {"catalog": cfg.backup.catalog}},
        config={"runtime": cfg.runtime.model_dump(), **s.model_dump()})


def task_settings(cfg: ReplicateConfig, catalog: CatalogEntry | None, schema: str, table: str) -> TaskSettings:
    """Resolve one table's settings through the hierarchy (see :mod:`lakemirror.daemon.settings.replicate`)."""
    s_entry = next((s for s in catalog.schemas if s.name == schema), None) if catalog else None
    t_entry = next((t for t in s_entry.tables if t.name == table), None) if s_entry else None
    return _task_settings(cfg, cfg.resolve(catalog, s_entry, t_entry))


def volume_job_settings(base: TaskSettings, source_path: str, target_path: str) -> TaskSettings:
    """A volume's settings: only ``volume_files``, its options naming the two directories."""
    options = {**base.options, "volume_files": {**base.options.get("volume_files", {}),
                                                "source_path": source_path, "target_path": target_path}}
    return replace(base, operations=(VOLUME_FILES,), options=options)


def _catalog_volume(cfg: ReplicateConfig, catalog: CatalogEntry, schema: str, source: TableName,
                    target: TableName) -> TaskSettings | None:
    s_entry = next((s for s in catalog.schemas if s.name == schema), None)
    base = _task_settings(cfg, cfg.resolve(catalog, s_entry, None))
    if VOLUME_FILES not in base.operations:
        return None
    return volume_job_settings(base, volume_path(source), volume_path(target))


def volume_jobs(cfg: ReplicateConfig) -> list[TableJob]:
    """The ``volumes`` entries of the file, unless ``--operation`` leaves out volume_files."""
    if not cfg.runs_volumes():
        return []
    return [TableJob(v.source_name, v.target_name,
                     volume_job_settings(_task_settings(cfg, cfg.volume_settings(v)), v.source, v.target),
                     object_type="volume") for v in cfg.volumes]


def plan(cfg: ReplicateConfig, discovery: Discovery, read_from: Mapping[str, str] | None = None) -> list[TableJob]:
    """Every object's jobs; ``read_from``: see :func:`selections`."""
    entries = {((read_from or {}).get(c.name, c.name), c.target_catalog): c for c in cfg.catalogs}
    return plan_work(selections(cfg, read_from), discovery,
                     lambda sel, schema, table: task_settings(cfg, entries[(sel.source, sel.target)], schema, table),
                     only_schemas=cfg.cli.target_schemas,
                     volume_settings_for=lambda sel, schema, src, dst: _catalog_volume(
                         cfg, entries[(sel.source, sel.target)], schema, src, dst)) + volume_jobs(cfg)


#: Operations that copy data: a run with any of them makes (or checks) the Delta Sharing set-up first.
DATA_OPERATIONS = ("clone", "incremental", "volume_files")


def shared_catalogs(cfg: ReplicateConfig) -> dict[str, str]:
    """Source catalog -> the catalog made from its share on the target (empty without delta_sharing)."""
    ds = cfg.delta_sharing
    if ds is None or not copies_data(cfg):
        return {}
    return {c.name: ds.shared_catalog.format(catalog=c.name) for c in cfg.selected_catalogs()}


def copies_data(cfg: ReplicateConfig) -> bool:
    """Whether the run copies data (so reads the shared catalogs): ``--operation`` names none of
    :data:`DATA_OPERATIONS` only when it leaves them all out."""
    return not cfg.cli.operations or bool(set(cfg.cli.operations) & set(DATA_OPERATIONS))


def sharing_jobs(cfg: ReplicateConfig) -> list[TableJob]:
    """One Delta Sharing set-up per selected catalog (object_type ``share``), run before the tables."""
    ds = cfg.delta_sharing
    if ds is None or not copies_data(cfg):
        return []
    jobs = []
    for c in cfg.selected_catalogs():
        share, shared = ds.share.format(catalog=c.name), ds.shared_catalog.format(catalog=c.name)
        include = cfg.cli.target_schemas if cfg.cli.target_schemas is not None else c.include_schemas
        base = _task_settings(cfg, cfg.resolve(c))
        settings = replace(base, operations=("delta_sharing",), options={"delta_sharing": {
            "source_catalog": c.name, "recipient": ds.recipient, "share": share, "shared_catalog": shared,
            "provider": ds.provider, "mode": ds.mode, "history": ds.history,
            "include": list(include) if include is not None else None, "exclude": list(c.exclude_schemas)}},
            config={**base.config, "delta_sharing": ds.model_dump()})
        jobs.append(TableJob(TableName(c.name, "*", share), TableName(shared, "*", share), settings,
                             object_type="share"))
    return jobs


def backup_share_of(cfg: ReplicateConfig, catalog: str) -> str:
    """The share the backup adds schemas to, for a source catalog."""
    template = cfg.backup.share or (cfg.delta_sharing.share if cfg.delta_sharing else "lakemirror_{catalog}")
    return template.format(catalog=catalog)


def backup_share_jobs(cfg: ReplicateConfig, outcomes: Sequence[OperationOutcome]) -> list[TableJob]:
    """After the backups: per source catalog, one job adding the schemas of what was backed up (tables
    and volumes) to the share."""
    by_catalog: dict[str, set[str]] = {}
    for o in outcomes:
        if o.status != "success":
            continue
        if o.operation == "backup" and o.details.get("share_schema"):
            by_catalog.setdefault(o.job.source.catalog, set()).add(str(o.details["share_schema"]))
        elif o.job.object_type == "volume" and "backup" in _catalog_operations(cfg, o.job.source.catalog):
            by_catalog.setdefault(o.job.source.catalog, set()).add(f"{o.job.source.catalog}.{o.job.source.schema}")
    jobs = []
    entries = {c.name: c for c in cfg.selected_catalogs()}
    for catalog, schemas in sorted(by_catalog.items()):
        entry = entries.get(catalog)
        if entry is None:
            continue
        share = backup_share_of(cfg, catalog)
        base = _task_settings(cfg, cfg.resolve(entry))
        settings = replace(base, operations=("backup_share",), options={"backup_share": {
            "share": share, "schemas": sorted(schemas), "history": cfg.backup.history}})
        jobs.append(TableJob(TableName(catalog, "*", share), TableName(catalog, "*", share), settings,
                             object_type="share"))
    return jobs


def _catalog_operations(cfg: ReplicateConfig, catalog: str) -> tuple[str, ...]:
    entry = next((c for c in cfg.catalogs if c.name == catalog), None)
    return tuple(cfg.resolve(entry).operations) if entry is not None else ()


def level_task_settings(cfg: ReplicateConfig, catalog: CatalogEntry, schema: str | None = None) -> TaskSettings:
    """The resolved settings of a catalog (or one of its schemas) as a level, for per-catalog jobs."""
    s_entry = next((s for s in catalog.schemas if s.name == schema), None) if schema is not None else None
    return _task_settings(cfg, cfg.resolve(catalog, s_entry))
