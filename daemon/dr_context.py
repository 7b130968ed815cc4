"""The disaster-recovery parts of ``lakemirror replicate``, built for the composition root
(:mod:`lakemirror.daemon.context`) from its parts: kept apart so that the root only names them."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, ContextManager, Sequence

from lakemirror.checkpoints import layout
from lakemirror.daemon.settings.runtime_spec import shared_catalogs
from lakemirror.object_store import S3A_CONF_PREFIX, session_s3a_conf
from lakemirror.sinks.batch.operations import Operations
from lakemirror.sinks.batch.routing import ByOperation
from lakemirror.sinks.batch.volumes import VolumeOperations
from lakemirror.supervisor.subtasks.batch_runner import VOLUME_FILES, RunSummary

if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient

log = logging.getLogger(__name__)


def s3a_settings(context: Any) -> dict[str, str]:
    """The ``fs.s3a.*`` settings the run's Spark confs give (``runtime.spark_conf``'s
    ``spark.hadoop.fs.s3a.*``), overlaid with the session's own where it has a JVM."""
    prefix = "spark.hadoop."
    found = {k[len(prefix):]: v for k, v in context.runtime.spark_conf.items()
             if k.startswith(prefix + S3A_CONF_PREFIX)}
    return {**found, **session_s3a_conf(context.spark)}


def logged_run(settings: Any, run_id: str) -> ContextManager[Any]:
    """The run's execution log files when ``settings`` (``execution_log``) is set; nothing otherwise."""
    if settings is None:
        return nullcontext()
    from lakemirror.daemon.execution_log import execution_log

    return execution_log(run_id, settings.folder, list(settings.formats), settings.level)


def workspace_client(settings: Any) -> "WorkspaceClient":
    """A databricks-sdk client for a :class:`~lakemirror.daemon.settings.workspaces.WorkspaceSettings`."""
    from databricks.sdk import WorkspaceClient

    from lakemirror.errors import TerminalError

    try:
        token = settings.resolved_token()
    except ValueError as exc:
        raise TerminalError(str(exc)) from None
    if settings.profile is not None:
        return WorkspaceClient(profile=settings.profile)
    if token is not None:
        return WorkspaceClient(host=settings.host, token=token, auth_type="pat")
    return WorkspaceClient(host=settings.host) if settings.host else WorkspaceClient()


def disaster_recovery_operations(context: Any, base: Operations, checkpoint_volume: str | None) -> Operations:
    """``base`` plus the operations of disaster recovery: volume files (their manifests under
    ``<checkpoint_volume>/replicate``) and the Delta Sharing set-up (the two workspaces' clients built
    when first used)."""
    from lakemirror.sinks.batch.backup import BackupOperations, ShareSchemas
    from lakemirror.sinks.batch.operations import TaggedSessions
    from lakemirror.sinks.batch.sharing import DeltaSharingSetup, SharingOperations
    from lakemirror.sinks.batch.uc_objects import UC_OPERATIONS, UcOperations, UcReplicator
    from lakemirror.daemon.uc_phases import uc_maps

    routes: dict[str, Operations] = {}
    if checkpoint_volume is not None:
        root = str(layout.replicate_dir(checkpoint_volume))
        routes[VOLUME_FILES] = VolumeOperations(root, lambda: s3a_settings(context), clock=context.clock,
                                                sleep=context.sleep)
    ws = context.config.workspaces
    routes["delta_sharing"] = SharingOperations(
        lambda: DeltaSharingSetup(workspace_client(ws.source), workspace_client(ws.target)))
    sessions = TaggedSessions(context.spark)
    routes["backup"] = BackupOperations(sessions)
    uc = UcOperations(lambda: UcReplicator(workspace_client(ws.source), workspace_client(ws.target),
                                           uc_maps(context.config)), sessions)
    routes.update({op: uc for op in UC_OPERATIONS.values()})
    routes["backup_share"] = ShareSchemas(lambda: workspace_client(ws.source))
    if context.config.delta_sharing is not None:  # the source is another metastore: its tags through the SDK
        from lakemirror.sinks.batch.uc_tags import CrossMetastoreMetadata, SdkTags

        routes["metadata"] = CrossMetastoreMetadata(
            base, lambda: SdkTags(workspace_client(ws.source), workspace_client(ws.target)),
            source_catalogs(context.config))
    return ByOperation(base, routes)


def source_catalogs(cfg: Any) -> dict[str, str]:
    """The catalog made from each selected catalog's share -> that source catalog."""
    ds = cfg.delta_sharing
    return {ds.shared_catalog.format(catalog=c.name): c.name for c in cfg.selected_catalogs()} if ds else {}


def uc_early(context: Any) -> list[list[Any]]:
    from lakemirror.daemon.uc_phases import early_phases, uc_catalogs

    cfg = context.config
    if not uc_catalogs(cfg):
        return []
    return early_phases(cfg, _Lazy(lambda: workspace_client(cfg.workspaces.source)))


def uc_late(context: Any) -> list[list[Any]]:
    from lakemirror.daemon.settings.runtime_spec import selections
    from lakemirror.daemon.uc_phases import late_phases, spark_schemas, uc_catalogs
    from lakemirror.sinks.batch.uc_views import read_views, views_from_sdk
    from lakemirror.sinks.sql import SparkSql
    from lakemirror.supervisor.subtasks.batch_runner import TaskSettings, plan_work

    cfg = context.config
    if not uc_catalogs(cfg):
        return []
    tables: list[Any] = []
    if "table_grants" in cfg.uc_objects.object_types:  # every selected table, whatever this run's operations
        tables = plan_work(selections(cfg, shared_catalogs(cfg)), context.discovery,
                           lambda *a: TaskSettings(operations=("uc_table_grants",)), only_schemas=cfg.cli.target_schemas)
    if cfg.delta_sharing is not None:  # the source's views are in another metastore: read them through the SDK
        from lakemirror.sinks.batch.sharing import schemas_of

        source = _Lazy(lambda: workspace_client(cfg.workspaces.source))
        return late_phases(cfg, lambda c, s: views_from_sdk(source, c, s),  # type: ignore[arg-type]
                           lambda c: list(schemas_of(source, c.name, lambda s: True)),  # type: ignore[arg-type]
                           tables)
    sql = SparkSql(context.spark)
    return late_phases(cfg, lambda c, s: read_views(sql, c, s), spark_schemas(sql), tables)


class _Lazy:
    """A workspace client built on first use (a run that lists nothing never connects)."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            self._client = self._make()
        return getattr(self._client, name)


def run_in_phases(context: Any) -> RunSummary:
    """A replicate run: the Delta Sharing set-ups first (the tables are read from the shared catalogs),
    then every table and volume of the catalogs whose set-up succeeded."""
    from lakemirror.daemon.settings.runtime_spec import backup_share_jobs, sharing_jobs

    runner = context.batch_runner(context.operations, context.run_id, context.config.max_workers, context.progress)
    first = sharing_jobs(context.config)
    outcomes: list[Any] = []
    failed: set[str] = set()
    if first:
        summary = runner.run(first)
        outcomes += summary.outcomes
        failed = {o.job.source.catalog for o in summary.failed}
        for catalog in sorted(failed):
            log.warning("run %s: the Delta Sharing set-up of catalog %s failed: its tables are not replicated in "
                        "this run", context.run_id, catalog)
    shared = {src: dst for src, dst in shared_catalogs(context.config).items()}
    skipped = {shared.get(c, c) for c in failed}
    for phase in uc_early(context):  # credentials, locations, catalogs, schemas, volumes: before the tables
        outcomes += runner.run(phase).outcomes
    jobs = [j for j in context.plan() if j.source.catalog not in skipped]
    log.info("replicate run %s: %d objects", context.run_id, len(jobs))
    second = runner.run(jobs).outcomes
    outcomes += second
    for phase in uc_late(context):  # views level by level, then the tables' grants
        outcomes += runner.run(phase).outcomes
    shares = backup_share_jobs(context.config, second)  # after the backups: their schemas into the share
    if shares:
        outcomes += runner.run(shares).outcomes
    return RunSummary(context.run_id, tuple(outcomes))
