"""Databricks Jobs for lakemirror: the job spec as data, and submit / stop / look-up through the SDK.

A Continuous Sync pipeline runs on Databricks as a *continuous* job (one run always active; the Jobs
service restarts it with backoff if it fails) whose single task is the console script
``lakemirror run <config>`` of the built wheel, on a job cluster with Unity Catalog (dedicated access
mode). Incremental Sync uses the same task on a cron schedule instead of the continuous trigger.

:func:`build_job_settings` is pure: it returns SDK dataclasses and reads nothing. The functions that
talk to a workspace take a :class:`~databricks.sdk.WorkspaceClient` built by the caller; this
module creates no client of its own.

Stopping a continuous job needs care: cancelling its run makes the Jobs service start a new one, so
:func:`stop_job` first pauses the continuous trigger (or the schedule), then cancels the active runs.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from lakemirror import __version__
from lakemirror.daemon.settings import Settings

if TYPE_CHECKING:  # the SDK is imported where a job is built or read: it takes seconds to import
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.service import jobs

CREATED_BY = "lakemirror"
TASK_KEY = "lakemirror"
CLUSTER_KEY = "lakemirror_driver"
PACKAGE_NAME = "lakemirror"
ENTRY_POINT = "lakemirror"  # the console script of pyproject's [project.scripts]


class SyncKind(str, enum.Enum):
    """How the job is triggered; also the job's ``kind`` tag."""

    CONTINUOUS = "continuous-sync"
    INCREMENTAL = "incremental-sync"


@dataclass(frozen=True)
class Schedule:
    """A Quartz cron schedule, for Incremental Sync (e.g. ``"0 0/15 * * * ?"`` every 15 minutes)."""

    quartz_cron_expression: str
    timezone_id: str = "UTC"


@dataclass(frozen=True)
class JobTarget:
    """Where the job's code, configuration and compute come from in the workspace.

    ``wheel`` is the built lakemirror wheel uploaded to the workspace (a Unity Catalog volume or a
    workspace file, e.g. ``/Volumes/ops/lakemirror/wheels/lakemirror-0.1.0-py3-none-any.whl``);
    ``config_path`` is the pipeline YAML the task reads (e.g.
    ``/Volumes/ops/lakemirror/config/prod-orders.yaml``). The job runs on a new job cluster described
    by ``spark_version``, ``node_type_id`` and ``num_workers``, unless ``existing_cluster_id`` is given.
    """

    wheel: str
    config_path: str
    spark_version: str = "17.3.x-scala2.13"
    node_type_id: str = "i3.xlarge"
    num_workers: int = 1
    existing_cluster_id: str | None = None
    kind: SyncKind = SyncKind.CONTINUOUS
    schedule: Schedule | None = None
    start_paused: bool = False
    extra_tags: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.wheel.endswith(".whl"):
            raise ValueError(f"wheel must be the path of a built .whl file, got {self.wheel!r}")
        if not self.config_path:
            raise ValueError("config_path cannot be empty")
        if self.num_workers < 0:
            raise ValueError("num_workers cannot be negative")
        if self.kind is SyncKind.INCREMENTAL and self.schedule is None:
            raise ValueError("an incremental-sync job needs a schedule")
        if self.kind is SyncKind.CONTINUOUS and self.schedule is not None:
            raise ValueError("a continuous-sync job has no schedule (it always has one run active)")


@dataclass(frozen=True)
class SubmittedJob:
    """What ``POST /api/continuous-sync`` answers: the job and where to look at it."""

    job_id: int
    run_url: str


def job_tags(settings: Settings, kind: SyncKind = SyncKind.CONTINUOUS) -> dict[str, str]:
    """The tags every lakemirror job carries; ``source`` / ``destination`` are ``catalog.schema``."""
    dest_schema = settings.destination_schema or settings.schema_name
    return {
        "created_by": CREATED_BY,
        "kind": kind.value,
        "source": f"{settings.source_catalog}.{settings.schema_name}",
        "destination": f"{settings.destination_catalog}.{dest_schema}",
        "pipeline_id": settings.effective_pipeline_id,
    }


def task_parameters(config_path: str) -> list[str]:
    """The arguments of the ``lakemirror`` console script: ``run <config>`` in Databricks mode."""
    return ["run", config_path, "--set", "runtime.mode=databricks"]


def build_job_settings(settings: Settings, target: JobTarget) -> jobs.JobSettings:
    """The Job spec of a pipeline, as SDK dataclasses (pure: no I/O, same input, same output).

    A continuous job has no retry policy (the Jobs service backs off by itself) and at most one run;
    an incremental job carries the cron schedule. ``settings`` names the job and fills the tags;
    ``target`` says which wheel, config file and compute the task uses.
    """
    from databricks.sdk.service import compute, jobs

    tags = {**job_tags(settings, target.kind), **dict(target.extra_tags)}
    pause = jobs.PauseStatus.PAUSED if target.start_paused else jobs.PauseStatus.UNPAUSED
    task = jobs.Task(
        task_key=TASK_KEY,
        description=f"lakemirror {__version__}: {tags['source']} -> {tags['destination']}",
        python_wheel_task=jobs.PythonWheelTask(package_name=PACKAGE_NAME, entry_point=ENTRY_POINT,
                                               parameters=task_parameters(target.config_path)),
        libraries=[compute.Library(whl=target.wheel)],
    )
    clusters: list[jobs.JobCluster] | None = None
    if target.existing_cluster_id:
        task.existing_cluster_id = target.existing_cluster_id
    else:
        task.job_cluster_key = CLUSTER_KEY
        clusters = [jobs.JobCluster(job_cluster_key=CLUSTER_KEY, new_cluster=compute.ClusterSpec(
            spark_version=target.spark_version,
            node_type_id=target.node_type_id,
            num_workers=target.num_workers,
            data_security_mode=compute.DataSecurityMode.SINGLE_USER,
            custom_tags={k: v for k, v in tags.items() if k in ("created_by", "kind")},
        ))]
    spec = jobs.JobSettings(
        name=f"lakemirror {settings.effective_pipeline_id}",
        description=f"lakemirror {target.kind.value} of {tags['source']} into {tags['destination']}",
        tags=tags,
        tasks=[task],
        job_clusters=clusters,
        max_concurrent_runs=1,
    )
    if target.kind is SyncKind.CONTINUOUS:
        spec.continuous = jobs.Continuous(pause_status=pause)
    else:
        assert target.schedule is not None
        spec.schedule = jobs.CronSchedule(quartz_cron_expression=target.schedule.quartz_cron_expression,
                                          timezone_id=target.schedule.timezone_id, pause_status=pause)
    return spec


def _create_kwargs(spec: jobs.JobSettings) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if getattr(spec, f.name) is not None}


def job_url(host: str, job_id: int) -> str:
    """The job's page in the workspace UI."""
    return f"{host.rstrip('/')}/jobs/{job_id}"


def submit_job(ws: WorkspaceClient, spec: jobs.JobSettings) -> SubmittedJob:
    """Create the job (``POST /api/2.2/jobs/create``); an unpaused continuous job starts by itself.

    ``run_url`` is the page of the job's active run when the Jobs service lists one already, else
    the job's page (which shows the run once it starts).
    """
    created = ws.jobs.create(**_create_kwargs(spec))
    if created.job_id is None:
        raise RuntimeError("the Jobs API created a job but returned no job_id")
    run = active_run(ws, created.job_id)
    url = run.run_page_url if run is not None and run.run_page_url else job_url(ws.config.host or "", created.job_id)
    return SubmittedJob(job_id=created.job_id, run_url=url)


def active_run(ws: WorkspaceClient, job_id: int) -> jobs.BaseRun | None:
    """The job's active run (queued, pending, running or terminating), if any."""
    for run in ws.jobs.list_runs(job_id=job_id, active_only=True, limit=1):
        return run
    return None


def get_run(ws: WorkspaceClient, run_id: int) -> jobs.Run:
    """One run with its state and page URL (``GET /api/2.2/jobs/runs/get``)."""
    return ws.jobs.get_run(run_id)


def lakemirror_jobs(ws: WorkspaceClient) -> Iterator[jobs.BaseJob]:
    """Every job of the workspace tagged ``created_by=lakemirror``."""
    for job in ws.jobs.list():
        if job.settings is not None and (job.settings.tags or {}).get("created_by") == CREATED_BY:
            yield job


def stop_job(ws: WorkspaceClient, job_id: int, *, delete: bool = False) -> None:
    """Stop a lakemirror job: pause its trigger, cancel its active runs, optionally delete it.

    The trigger is paused first because the Jobs service starts a new run of an unpaused continuous
    job as soon as its run is cancelled. The daemon in the cancelled run drains on the signal it
    receives; its checkpoints stay where they are (resuming continues from them).
    """
    from databricks.sdk.service import jobs

    job = ws.jobs.get(job_id)
    current = job.settings or jobs.JobSettings()
    update = jobs.JobSettings()
    if current.continuous is not None:
        update.continuous = jobs.Continuous(pause_status=jobs.PauseStatus.PAUSED)
    if current.schedule is not None:
        update.schedule = jobs.CronSchedule(quartz_cron_expression=current.schedule.quartz_cron_expression,
                                            timezone_id=current.schedule.timezone_id,
                                            pause_status=jobs.PauseStatus.PAUSED)
    if update.continuous is not None or update.schedule is not None:
        ws.jobs.update(job_id, new_settings=update)
    ws.jobs.cancel_all_runs(job_id=job_id)
    if delete:
        ws.jobs.delete(job_id)


def resume_job(ws: WorkspaceClient, job_id: int) -> None:
    """Unpause a continuous job's trigger: the Jobs service starts a run, which resumes from the checkpoints."""
    from databricks.sdk.service import jobs

    ws.jobs.update(job_id, new_settings=jobs.JobSettings(continuous=jobs.Continuous(
        pause_status=jobs.PauseStatus.UNPAUSED)))
