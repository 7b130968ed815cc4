"""The REST control API under ``/api``: Continuous Sync pipelines and the CDF readiness check.

Each handler takes a matched route (and a parsed body) and returns ``(HTTP status, JSON payload)``;
:mod:`lakemirror.daemon.http` does the transport and the authorization. Work that needs Spark
(starting or stopping a local pipeline, describing tables) runs on the :class:`CommandWorker`,
never on the HTTP thread: the handler waits at most ``timeout_seconds`` and answers 504 after.

Local and connect mode run a posted pipeline in this daemon, beside the one of its configuration
file (``job_id`` = the pipeline id, ``run_url`` = ""); databricks mode submits it as a job.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from pydantic import ValidationError

from lakemirror.daemon.settings import Settings, limits, local_path_problem, object_storage_problem
from lakemirror.daemon.databricks_pipelines import DatabricksNotConfigured, DatabricksPipelines
from lakemirror.daemon.settings.pipeline import DAEMON_ONLY_KEYS, checkpoint_problem
from lakemirror.checkpoints import layout
from lakemirror.checkpoints.lease import LeaseHeld, LeaseUnreachable
from lakemirror.daemon.lease import unreachable_advice
from lakemirror.daemon.pipelines import (FoldersOverlap, PipelineExists, PipelineHandle, PipelineRegistry,
                                         checkpoint_dir_to_delete, claim_folder, inside, release_folder)
from lakemirror.daemon.routes import Match
from lakemirror.daemon.worker import CommandWorker, WorkerClosed, WorkerTimeout
from lakemirror.errors import ConfigError, excerpt
from lakemirror.secrets import redact
from lakemirror.sources.cdf_check import Readiness
from lakemirror.supervisor.control.loop import CommandRefused

log = logging.getLogger(__name__)

Reply = tuple[int, Any]
_NAME = re.compile(r"^[^\x00-\x1f`]{1,255}$")

#: The request headers that name the workspace (and its token) a pipeline is submitted to in
#: databricks mode, as Continuous Sync's REST API takes them. The token is never logged nor echoed.
HOST_HEADER, TOKEN_HEADER = "X-Databricks-Host", "X-Databricks-Token"


class BadCredentials(Exception):
    """The X-Databricks-* headers cannot be used (the message names the fix, never the token)."""


def workspace_credentials(headers: Mapping[str, str] | None) -> tuple[str, str] | None:
    """``(host, token)`` from the request's X-Databricks-* headers; None when neither is sent."""
    host = (headers.get(HOST_HEADER) or "").strip() if headers is not None else ""
    token = (headers.get(TOKEN_HEADER) or "").strip() if headers is not None else ""
    if not host and not token:
        return None
    if not host or not token:
        raise BadCredentials(f"send both {HOST_HEADER} and {TOKEN_HEADER}, or neither (the daemon's own "
                             f"workspace credentials are used then)")
    url = urlsplit(host if "://" in host else f"https://{host}")
    loopback = url.hostname in ("127.0.0.1", "localhost", "::1")
    if url.scheme not in ("https", "http") or (url.scheme == "http" and not loopback) or not url.hostname \
            or url.username or url.password or url.query or url.fragment or url.path not in ("", "/"):
        raise BadCredentials(f"{HOST_HEADER} must be a workspace URL such as https://<workspace>.cloud.databricks"
                             f".com (https; no path, query or credentials)")
    return f"{url.scheme}://{url.netloc}", token


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(body)"


#: At most this many problems are listed in a 422 (a body can name thousands of unknown keys).
MAX_PROBLEMS = 30


def _problems(found: list[dict[str, str]]) -> list[dict[str, str]]:
    """``found`` as the 422 lists them: credentials masked, each cut to a short excerpt, at most
    :data:`MAX_PROBLEMS` (and one more saying how many were left out)."""
    out = [{"field": excerpt(redact(p["field"]), 200), "message": excerpt(redact(p["message"]), 500)}
           for p in found[:MAX_PROBLEMS]]
    if len(found) > MAX_PROBLEMS:
        out.append({"field": "…", "message": f"and {len(found) - MAX_PROBLEMS} more problems"})
    return out


def settings_from_body(body: Any, mode: str, default_checkpoint_volume: str | None = None,
                       daemon: Settings | None = None) -> Settings | list[dict[str, str]]:
    """The pipeline a request body describes, or every problem with its field (for a 422).

    A body without ``checkpoint_volume`` gets ``default_checkpoint_volume`` (the daemon's own
    ``<checkpoint_volume>/api``, so the pipeline's folder is ``<checkpoint_volume>/api/<pipeline_id>``):
    a Continuous Sync REST request names no folder. The YAML pipeline still has to name one.

    With ``daemon`` (the daemon's own settings), the pipeline runs with the daemon's ``runtime``,
    ``http`` and ``databricks`` blocks, and outside databricks mode its ``checkpoint_volume`` must
    lie inside the daemon's own (a request cannot have lakemirror write, or later delete, a folder
    elsewhere) and outside every Delta table and schema folder.
    """
    if not isinstance(body, dict):
        return [{"field": "(body)", "message": "the body must be a JSON object of pipeline settings"}]
    problems = [{"field": k, "message": "set by the daemon's own configuration, not per pipeline"}
                for k in DAEMON_ONLY_KEYS if k in body]
    fields = {k: v for k, v in body.items() if k not in DAEMON_ONLY_KEYS}
    if daemon is not None:
        fields.update({k: getattr(daemon, k) for k in DAEMON_ONLY_KEYS})
    if "checkpoint_volume" not in fields and default_checkpoint_volume is not None:
        fields["checkpoint_volume"] = default_checkpoint_volume
    try:
        settings = Settings.model_validate(fields)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown setting (see docs/configuration.md)"
            elif err["type"] == "missing":
                msg = "required setting is missing"
            problems.append({"field": _loc(tuple(err["loc"])), "message": msg})
        # a field (a dict key) or message may quote a credential the body holds
        return _problems(problems)
    if mode != "databricks":
        problem = local_path_problem(settings.checkpoint_volume)
        if problem is None and daemon is not None:
            root = daemon.checkpoint_volume
            folder = layout.pipeline_dir(settings.checkpoint_volume, settings.effective_pipeline_id)
            if object_storage_problem("checkpoint_volume", settings.checkpoint_volume) is not None \
                    or not inside(folder, root) or inside(root, folder):
                problem = (f"the pipeline's folder {folder} is not inside {root}, the daemon's checkpoint_volume: "
                           f"a pipeline posted to the API keeps its state there (leave checkpoint_volume out for "
                           f"{default_checkpoint_volume or root})")
            else:
                problem = checkpoint_problem(settings, daemon.runtime.warehouse)
        if problem:
            problems.append({"field": "checkpoint_volume", "message": problem})
    return _problems(problems) if problems else settings


def pipeline_json(h: PipelineHandle) -> dict[str, Any]:
    s = h.settings
    return {"job_id": h.pipeline_id, "pipeline_id": h.pipeline_id, "origin": h.origin, "state": h.state,
            "source": f"{s.source_catalog}.{s.schema_name}",
            "destination": f"{s.destination_catalog}.{s.destination_schema or s.schema_name}",
            "run_url": "", "started_at": h.started_at, "tables": [asdict(v) for v in h.views()]}


def readiness_json(r: Readiness) -> dict[str, Any]:
    out = asdict(r)
    out["key"] = list(r.key) if r.key is not None else None
    return out


class ContinuousSyncApi:
    def __init__(self, *, mode: str, registry: PipelineRegistry, worker: CommandWorker,
                 start_pipeline: Callable[[Settings], PipelineHandle],
                 cdf_check: Callable[[str, str], list[Readiness]],
                 recovery_point: Callable[[float | None, str | None, list[str] | None], dict[str, Any]] | None = None,
                 databricks: Callable[[], DatabricksPipelines] | None = None,
                 databricks_as: Callable[[str, str], DatabricksPipelines] | None = None,
                 default_checkpoint_volume: str | None = None, daemon: Settings | None = None,
                 timeout_seconds: float = 30.0, drain_timeout_seconds: float = 120.0) -> None:
        self.mode = mode
        self.registry = registry
        self.worker = worker
        self.start_pipeline = start_pipeline   # runs on the worker: builds, registers, starts
        self.cdf_check_fn = cdf_check          # runs on the worker
        self.recovery_point_fn = recovery_point  # runs on the worker
        self.databricks_ambient = databricks   # databricks mode only; built lazily by the root
        self.databricks_as = databricks_as     # (host, token) of the request's X-Databricks-* headers
        self.default_checkpoint_volume = default_checkpoint_volume
        #: The daemon's own settings: the blocks a posted pipeline runs with, and the checkpoint folder
        #: its state must stay inside (None: neither, as in tests of the transport alone).
        self.daemon = daemon
        self._local = threading.local()        # per HTTP thread: the request's workspace credentials
        self.timeout = timeout_seconds
        self.drain_timeout = drain_timeout_seconds

    def databricks(self) -> DatabricksPipelines:
        """The workspace of this request: the X-Databricks-* headers' when sent, else the daemon's."""
        credentials = getattr(self._local, "credentials", None)
        if credentials is not None:
            if self.databricks_as is None:
                raise DatabricksNotConfigured(f"this daemon does not take {HOST_HEADER} / {TOKEN_HEADER}; send "
                                              f"the request without them")
            return self.databricks_as(*credentials)
        if self.databricks_ambient is None:
            raise DatabricksNotConfigured(f"this daemon has no workspace of its own: send {HOST_HEADER} and "
                                          f"{TOKEN_HEADER}")
        return self.databricks_ambient()

    def handle(self, m: Match, body: Any, headers: Mapping[str, str] | None = None) -> Reply:
        """Answer one request; ``headers`` are the request's (X-Databricks-* are read in databricks mode)."""
        self._local.credentials = None
        if self.mode == "databricks":
            try:
                self._local.credentials = workspace_credentials(headers)
            except BadCredentials as exc:
                return 400, {"error": str(exc)}
        try:
            return getattr(self, f"_{m.route.name}")(m, body)  # type: ignore[no-any-return]
        except WorkerTimeout as exc:
            return 504, {"error": str(exc)}
        except (WorkerClosed, CommandRefused) as exc:  # CommandRefused: draining, or not journalled
            return 503, {"error": str(exc)}
        except DatabricksNotConfigured as exc:
            return 503, {"error": str(exc)}
        except OSError as exc:  # the SDK's errors (DatabricksError, requests' errors) are OSErrors
            if not self._remote:
                raise
            credentials = getattr(self._local, "credentials", None)
            known = (credentials[1],) if credentials is not None else ()
            reason = redact(f"{type(exc).__name__}: {exc}", known)
            log.warning("api: %s %s: the Databricks workspace failed: %s", m.route.method, m.route.template, reason)
            return 502, {"error": f"the Databricks workspace failed: {reason}"}

    @property
    def _remote(self) -> bool:
        """Databricks mode: pipelines are jobs in a workspace."""
        return self.mode == "databricks" and (self.databricks_ambient is not None or self.databricks_as is not None)

    # -- pipelines --------------------------------------------------------------------------------

    def _create(self, m: Match, body: Any) -> Reply:
        parsed = settings_from_body(body, self.mode, self.default_checkpoint_volume, self.daemon)
        if isinstance(parsed, list):
            return 422, {"error": "invalid pipeline", "problems": parsed}
        if self._remote:
            submitted = self.databricks().submit(parsed)
            log.info("api: pipeline %s submitted as job %s", parsed.effective_pipeline_id, submitted.job_id)
            return 201, {"job_id": submitted.job_id, "run_url": submitted.run_url}
        pid = parsed.effective_pipeline_id
        if self.registry.get(pid) is not None:
            return 409, {"error": f"pipeline {pid!r} already runs in this daemon (DELETE it first, or set "
                                  f"another pipeline_id)"}
        folder = layout.pipeline_dir(Path(parsed.checkpoint_volume).expanduser(), pid)
        clash = self.registry.overlapping(folder)
        if clash is not None:
            return 409, {"error": str(FoldersOverlap(folder, clash.pipeline_id, clash.directory))}
        try:
            created = claim_folder(folder, pid)  # marked as lakemirror's: the one folder DELETE may remove
        except OSError as exc:
            return 422, {"error": "invalid pipeline", "problems": [
                {"field": "checkpoint_volume", "message": f"cannot create {folder}: {exc.strerror or exc}"}]}
        try:
            handle = self.worker.call(f"start pipeline {pid}", lambda: self.start_pipeline(parsed), self.timeout)
        except WorkerTimeout:
            raise  # the start goes on: its folder stays
        except BaseException as exc:
            if created:
                release_folder(folder)
            if isinstance(exc, PipelineExists):
                return 409, {"error": f"pipeline {pid!r} already runs in this daemon"}
            if isinstance(exc, (FoldersOverlap, LeaseHeld)):  # an overlapping folder; another daemon's lease
                return 409, {"error": str(exc)}
            if isinstance(exc, LeaseUnreachable):  # the lease's store: whether another daemon runs it is unknown
                return 503, {"error": redact(unreachable_advice(exc))}
            raise
        log.info("api: pipeline %s started", pid)
        return 201, {"job_id": handle.pipeline_id, "run_url": ""}

    def _list(self, m: Match, body: Any) -> Reply:
        out = [pipeline_json(h) for h in self.registry.all()]
        if self._remote:
            out += self.databricks().list()
        return 200, {"pipelines": out}

    def _job_id(self, m: Match) -> int | None:
        raw = m.params["job_id"]
        if self._remote and raw.isdigit() \
                and self.registry.get(raw) is None:
            return int(raw)
        return None

    def _unknown(self, job_id: str) -> Reply:
        return 404, {"error": f"no pipeline {excerpt(job_id, 100)!r} in this daemon"}

    def _get(self, m: Match, body: Any) -> Reply:
        remote = self._job_id(m)
        if remote is not None:
            try:
                return 200, self.databricks().describe(remote)
            except KeyError:
                return self._unknown(m.params["job_id"])
        h = self.registry.get(m.params["job_id"])
        return (200, pipeline_json(h)) if h is not None else self._unknown(m.params["job_id"])

    def _delete(self, m: Match, body: Any) -> Reply:
        cleanup = (m.arg("cleanup_checkpoints") or "false").lower()
        if cleanup not in ("true", "false"):
            return 422, {"error": "invalid query", "problems": [
                {"field": "cleanup_checkpoints", "message": "must be true or false"}]}
        remote = self._job_id(m)
        if remote is not None:
            if cleanup == "true":
                return 409, {"error": "cleanup_checkpoints=true is not done for a Databricks job: its cancelled run "
                                      "may still be draining; delete its checkpoint folder once the run has ended"}
            try:
                self.databricks().delete(remote)
            except KeyError:
                return self._unknown(m.params["job_id"])
            return 200, {"job_id": remote, "stopped": True, "checkpoints_deleted": False}
        h = self.registry.get(m.params["job_id"])
        if h is None:
            return self._unknown(m.params["job_id"])
        if h.origin == "config":
            return 409, {"error": f"pipeline {h.pipeline_id!r} comes from the daemon's configuration file; stop "
                                  f"the daemon (SIGTERM) to stop it"}
        target = None
        if cleanup == "true":
            try:
                target = checkpoint_dir_to_delete(h.settings.checkpoint_volume, h.pipeline_id,
                                                  [o.directory for o in self.registry.all() if o is not h],
                                                  self.daemon.checkpoint_volume if self.daemon is not None else None)
            except ValueError as exc:
                return 409, {"error": f"checkpoints not deleted and pipeline not stopped: {exc}"}

        def stop() -> bool:
            h.stop(self.drain_timeout)
            self.registry.remove(h.pipeline_id)
            if target is not None and target.is_dir():
                shutil.rmtree(target)
                log.info("api: deleted %s", target)
            return target is not None

        try:
            deleted = self.worker.call(f"stop pipeline {h.pipeline_id}", stop, self.timeout)
        except WorkerTimeout as exc:
            if not exc.started:
                raise
            return 202, {"job_id": h.pipeline_id, "stopped": False, "state": "stopping",
                         "message": "the pipeline is draining; it disappears from the list when stopped"}
        log.info("api: pipeline %s stopped", h.pipeline_id)
        return 200, {"job_id": h.pipeline_id, "stopped": True, "checkpoints_deleted": deleted}

    def _pause(self, m: Match, body: Any) -> Reply:
        return self._pause_or_resume(m, "pause")

    def _resume(self, m: Match, body: Any) -> Reply:
        return self._pause_or_resume(m, "resume")

    def _pause_or_resume(self, m: Match, verb: str) -> Reply:
        remote = self._job_id(m)
        if remote is not None:
            try:
                getattr(self.databricks(), verb)(remote)
            except KeyError:
                return self._unknown(m.params["job_id"])
            return 202, {"job_id": remote, "accepted": verb}
        h = self.registry.get(m.params["job_id"])
        if h is None or h.state != "running":
            return self._unknown(m.params["job_id"])
        tables = h.supervisor.command_all(verb, [v.table for v in h.views()])  # one journal write: all or none
        return 202, {"job_id": h.pipeline_id, "accepted": verb, "tables": tables}

    def _resync(self, m: Match, body: Any) -> Reply:
        if self._job_id(m) is not None:
            return 501, {"error": "resync a table of a Databricks job through that job's own daemon "
                                  "(POST /tables/{table}/resync on its endpoint)"}
        h = self.registry.get(m.params["job_id"])
        if h is None or h.state != "running":
            return self._unknown(m.params["job_id"])
        table = m.params["table"]
        if not h.supervisor.command("resync", table):
            return 404, {"error": f"no table {excerpt(table, limits.MAX_NAME_CHARS)!r} in pipeline {h.pipeline_id!r}"}
        return 202, {"job_id": h.pipeline_id, "accepted": "resync", "table": table}

    # -- readiness --------------------------------------------------------------------------------

    def _cdf_check(self, m: Match, body: Any) -> Reply:
        catalog, schema = m.arg("catalog"), m.arg("schema")
        problems = [{"field": name, "message": "required; a catalog or schema name"}
                    for name, value in (("catalog", catalog), ("schema", schema))
                    if value is None or not _NAME.match(value) or "." in value]
        if problems:
            return 422, {"error": "invalid query", "problems": problems}
        assert catalog is not None and schema is not None
        verdicts = self.worker.call(f"cdf-check {catalog}.{schema}",
                                    lambda: self.cdf_check_fn(catalog, schema), self.timeout)
        return 200, {"catalog": catalog, "schema": schema, "ready": all(v.ready for v in verdicts),
                     "tables": [readiness_json(v) for v in verdicts]}

    # -- recovery points --------------------------------------------------------------------------

    def _recovery_point(self, m: Match, body: Any) -> Reply:
        from lakemirror.daemon.recovery import parse_instant, parse_tables
        from lakemirror.supervisor.recovery.recovery_point import NoRecoveryPoint

        if self.recovery_point_fn is None:
            return 404, {"error": "recovery points are not served by this endpoint"}
        problems: list[dict[str, str]] = []
        at: float | None = None
        only: list[str] | None = None
        try:
            at = parse_instant(m.arg("at") or "", "at") if m.arg("at") is not None else None
        except ConfigError as exc:
            problems += [{"field": "at", "message": msg} for _, msg in exc.problems]
        try:
            only = parse_tables(m.arg("tables"), "tables")
        except ConfigError as exc:
            problems += [{"field": "tables", "message": msg} for _, msg in exc.problems]
        anchor = m.arg("anchor")
        if anchor is not None and len(anchor) > limits.MAX_NAME_CHARS:
            problems.append({"field": "anchor", "message": f"a table name has at most {limits.MAX_NAME_CHARS} "
                                                           f"characters (this one has {len(anchor)})"})
        elif anchor is not None and (not anchor or "." in anchor or "\x00" in anchor):
            problems.append({"field": "anchor", "message": "a table name of the pipeline (no catalog or schema)"})
        if problems:
            return 422, {"error": "invalid query", "problems": problems}
        fn = self.recovery_point_fn
        try:
            cut = self.worker.call("recovery-point", lambda: fn(at, anchor, only), self.timeout)
        except NoRecoveryPoint as exc:
            return 409, {"error": str(exc), "reasons": exc.reasons}
        return 200, cut
