"""Pipelines of the control API in databricks mode: each one a Databricks job (see databricks_jobs).

``submit`` writes the pipeline's YAML (only the settings the request gave; no daemon-level
section, no secret) to ``databricks.config_dir`` with the Files API, then creates the continuous
job whose task runs ``lakemirror run <that file>``. Stopping, pausing and resuming go through
:mod:`lakemirror.daemon.databricks_jobs`. Every call here is an HTTPS call to the workspace, never
Spark, so HTTP threads may make them. The :class:`WorkspaceClient` comes from the composition root.
"""

from __future__ import annotations

import io
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import yaml

from lakemirror.daemon import databricks_jobs as dj
from lakemirror.daemon.settings import DatabricksSettings, Settings
from lakemirror.daemon.settings.pipeline import DAEMON_ONLY_KEYS

if TYPE_CHECKING:  # the SDK is imported when a workspace is called: it takes seconds to import
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.service import jobs

class DatabricksNotConfigured(Exception):
    pass


def pipeline_yaml(settings: Settings) -> str:
    """The pipeline file a job reads: the fields that were set, without daemon-level sections."""
    data = settings.model_dump(mode="json", exclude_unset=True, exclude=set(DAEMON_ONLY_KEYS))
    return yaml.safe_dump(data, sort_keys=True)


class DatabricksPipelines:
    def __init__(self, ws: WorkspaceClient, config: DatabricksSettings) -> None:
        self.ws = ws
        self.config = config

    def _target(self, config_path: str) -> dj.JobTarget:
        if not self.config.wheel or not self.config.config_dir:
            raise DatabricksNotConfigured(
                "set databricks.wheel (the uploaded lakemirror .whl) and databricks.config_dir (where "
                "pipeline files are written) in the daemon's configuration to submit pipelines as jobs")
        return dj.JobTarget(wheel=self.config.wheel, config_path=config_path,
                            spark_version=self.config.spark_version, node_type_id=self.config.node_type_id,
                            num_workers=self.config.num_workers)

    def config_path(self, settings: Settings) -> str:
        return f"{(self.config.config_dir or '').rstrip('/')}/{settings.effective_pipeline_id}.yaml"

    def submit(self, settings: Settings) -> dj.SubmittedJob:
        path = self.config_path(settings)
        target = self._target(path)
        self.ws.files.upload(path, io.BytesIO(pipeline_yaml(settings).encode()), overwrite=True)
        return dj.submit_job(self.ws, dj.build_job_settings(settings, replace(target, config_path=path)))

    def describe(self, job_id: int) -> dict[str, Any]:
        """The job as the API shows it: its tags, trigger state and active run (no per-table view:
        that lives in the job's own daemon, at its /status)."""
        job = self._owned(job_id)
        return self._view(job_id, (job.settings.tags if job.settings else None) or {}, job.settings)

    def _owned(self, job_id: int) -> jobs.Job:
        """The job, or KeyError when it does not exist or is not a lakemirror job."""
        from databricks.sdk.errors import NotFound

        try:
            job = self.ws.jobs.get(job_id)
        except NotFound as exc:
            raise KeyError(job_id) from exc
        if ((job.settings.tags if job.settings else None) or {}).get("created_by") != dj.CREATED_BY:
            raise KeyError(job_id)
        return job

    def _view(self, job_id: int, tags: dict[str, str], settings: Any) -> dict[str, Any]:
        run = dj.active_run(self.ws, job_id)
        paused = None
        if settings is not None and settings.continuous is not None and settings.continuous.pause_status:
            paused = settings.continuous.pause_status.value == "PAUSED"
        state = None
        if run is not None and run.state is not None and run.state.life_cycle_state is not None:
            state = run.state.life_cycle_state.value
        return {"job_id": job_id, "pipeline_id": tags.get("pipeline_id"), "origin": "databricks",
                "source": tags.get("source"), "destination": tags.get("destination"),
                "state": "paused" if paused else (state or "no active run").lower(),
                "run_url": (run.run_page_url if run is not None and run.run_page_url else
                            dj.job_url(self.ws.config.host or "", job_id)),
                "tables": []}

    def list(self) -> list[dict[str, Any]]:
        out = []
        for job in dj.lakemirror_jobs(self.ws):
            if job.job_id is None or job.settings is None:
                continue
            out.append(self._view(job.job_id, job.settings.tags or {}, job.settings))
        return out

    def delete(self, job_id: int) -> None:
        self._owned(job_id)  # KeyError unless it is a lakemirror job
        dj.stop_job(self.ws, job_id, delete=True)

    def pause(self, job_id: int) -> None:
        self._owned(job_id)
        dj.stop_job(self.ws, job_id)

    def resume(self, job_id: int) -> None:
        self._owned(job_id)
        dj.resume_job(self.ws, job_id)
