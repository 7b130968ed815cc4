"""Batch replication: a pure plan of work, and a thread pool that runs it with retries and audit.

- :func:`plan_work` (pure) expands catalog/schema/table selections (shell-style include and
  exclude patterns) over what a :class:`~lakemirror.sources.catalog.Discovery` found into
  :class:`TableJob` values, each with its own resolved :class:`TaskSettings`.
- :class:`BatchRunner` runs the jobs on ``max_workers`` threads. Inside one job the operations
  run in order (clone, then reconcile, then metadata: a reconciliation must not race the clone
  of the same table). Each operation gets up to ``max_attempts`` attempts with exponential
  backoff and jitter (:class:`~lakemirror.supervisor.control.table_state.RestartPolicy`) and a per-attempt
  timeout that cancels the attempt's Spark jobs. Every attempt writes one audit row. One object
  failing never stops the others; :attr:`RunSummary.ok` says whether everything succeeded.

Errors are translated once, here (:func:`lakemirror.supervisor.control.classify_errors.classify`): transient
and unrecognised failures are retried, errors that name a cause a person must fix are not.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import random
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Protocol, Sequence, TextIO

from lakemirror.checkpoints.audit import FAILED, SUCCESS, AuditLog, AuditRecord, config_json
from lakemirror.errors import TerminalError, TransientError
from lakemirror.identifiers import TableName
from lakemirror.secrets import redact
from lakemirror.sinks.batch.operations import Operations
from lakemirror.sources.catalog import Discovery
from lakemirror.supervisor.control.classify_errors import classify
from lakemirror.supervisor.control.table_state import RestartPolicy

log = logging.getLogger(__name__)

#: The audit log's operation_type for each operation: one of the Data Replication System for
#: Databricks' values (backup, replication, uc_replication, reconciliation), or maintenance for a
#: replica's VACUUM, which that system does not run.
OPERATION_TYPE = {"clone": "replication", "incremental": "replication", "reconcile": "reconciliation",
                  "metadata": "uc_replication", "postgres_triggered": "replication",
                  "postgres_snapshot": "replication", "volume_files": "replication",
                  "delta_sharing": "replication", "backup": "backup", "backup_share": "backup",
                  "vacuum": "maintenance",
                  **{f"uc_{kind}": "uc_replication" for kind in (
                      "storage_credential", "external_location", "catalog", "schema", "volume", "view",
                      "table_grants")}}
#: The operation that copies a volume's files.
VOLUME_FILES = "volume_files"
#: Operations planned per catalog rather than per table (the Unity Catalog objects, in phases).
UC_OBJECTS = "uc_objects"
NOT_PER_TABLE = frozenset({VOLUME_FILES, UC_OBJECTS})


@dataclass(frozen=True)
class TaskSettings:
    """The resolved settings of one table (plain data; the daemon's config builds it)."""

    operations: tuple[str, ...] = ("clone",)
    timeout_seconds: float = 3600.0
    keys: tuple[str, ...] = ()
    max_attempts: int = 3
    backoff: RestartPolicy = RestartPolicy()
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per operation
    config: Mapping[str, Any] = field(default_factory=dict)                 # for config_details


@dataclass(frozen=True)
class SchemaSelection:
    target_schema: str | None = None
    include_tables: tuple[str, ...] | None = None
    exclude_tables: tuple[str, ...] = ()


@dataclass(frozen=True)
class CatalogSelection:
    source: str
    target: str
    include_schemas: tuple[str, ...] | None = None
    exclude_schemas: tuple[str, ...] = ()
    schemas: Mapping[str, SchemaSelection] = field(default_factory=dict)


@dataclass(frozen=True)
class TableJob:
    """One object's work: a table (its operations in order), or another object of the run (a volume's
    ``volume_files``, a Delta Sharing set-up, a Unity Catalog object), named by ``object_type``."""

    source: TableName
    target: TableName
    settings: TaskSettings
    object_type: str = "table"


def selected(name: str, include: Sequence[str] | None, exclude: Sequence[str]) -> bool:
    """Shell-style patterns, case-sensitive; exclusion wins."""
    if any(fnmatch.fnmatchcase(name, p) for p in exclude):
        return False
    return include is None or any(fnmatch.fnmatchcase(name, p) for p in include)


SettingsFor = Callable[[CatalogSelection, str, str], TaskSettings]  # (catalog, schema, table) -> settings
#: (catalog, schema, source volume, target volume) -> the volume's settings, its operation's options
#: naming the directories copied; None: the schema does not copy its volumes.
VolumeSettingsFor = Callable[[CatalogSelection, str, TableName, TableName], "TaskSettings | None"]


def plan_work(catalogs: Sequence[CatalogSelection], discovery: Discovery, settings_for: SettingsFor,
              *, only_schemas: Sequence[str] | None = None,
              volume_settings_for: VolumeSettingsFor | None = None) -> list[TableJob]:
    """Every table (and, where ``volume_settings_for`` says so, every volume) to process, in a stable
    order. ``only_schemas`` (the CLI's ``--target-schemas``) replaces the file's schema include list.
    A table's jobs leave out ``volume_files``; a volume's run only it."""
    jobs: list[TableJob] = []
    list_volumes = getattr(discovery, "list_volumes", None)
    for cat in catalogs:
        include = tuple(only_schemas) if only_schemas is not None else cat.include_schemas
        for schema in discovery.list_schemas(cat.source):
            if not selected(schema, include, cat.exclude_schemas):
                continue
            sel = cat.schemas.get(schema, SchemaSelection())
            for table in discovery.list_tables(cat.source, schema):
                if not selected(table, sel.include_tables, sel.exclude_tables):
                    continue
                source = TableName(cat.source, schema, table)
                target = TableName(cat.target, sel.target_schema or schema, table)
                if source == target:
                    raise TerminalError(f"{source}: the source and the target are the same table; "
                                        f"set a different target_catalog or target_schema")
                settings = settings_for(cat, schema, table)
                operations = tuple(op for op in settings.operations if op not in NOT_PER_TABLE)
                if operations:
                    jobs.append(TableJob(source, target, replace(settings, operations=operations)))
            if volume_settings_for is None or list_volumes is None:
                continue
            for volume in list_volumes(cat.source, schema):
                source = TableName(cat.source, schema, volume)
                target = TableName(cat.target, sel.target_schema or schema, volume)
                vs = volume_settings_for(cat, schema, source, target)
                if vs is not None and source != target:
                    jobs.append(TableJob(source, target, vs, object_type="volume"))
    return jobs


class Progress(Protocol):
    def started(self, total: int) -> None: ...
    def finished(self, job: TableJob, operation: str, status: str, attempt: int, seconds: float,
                 error: str | None, final: bool) -> None: ...


class TextProgress:
    """A progress bar on a terminal; plain lines otherwise (logs, CI)."""

    def __init__(self, stream: TextIO, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.total = self.done = 0
        self._lock = threading.Lock()

    def started(self, total: int) -> None:
        """``total`` more operations to run (a run in phases starts one batch of them per phase)."""
        self.total += total
        if not self.tty:
            self.stream.write(f"{total} operation{'s' if total != 1 else ''} to run\n")
            self.stream.flush()

    def finished(self, job: TableJob, operation: str, status: str, attempt: int, seconds: float,
                 error: str | None, final: bool) -> None:
        with self._lock:
            if final:
                self.done += 1
            what = status if final or status == SUCCESS else f"{status}, will retry"
            line = (f"[{self.done}/{self.total}] {operation} {job.source} -> {job.target}: {what} "
                    f"(attempt {attempt}, {seconds:.1f} s){': ' + error if error else ''}")
            if self.tty:
                width = 30
                filled = int(width * self.done / max(self.total, 1))
                self.stream.write(f"\r\x1b[2K{line[:120]}\n[{'#' * filled}{'.' * (width - filled)}] "
                                  f"{self.done}/{self.total}")
            else:
                self.stream.write(line + "\n")
            self.stream.flush()


@dataclass(frozen=True)
class OperationOutcome:
    job: TableJob
    operation: str
    status: str
    attempts: int
    error: str | None
    details: Mapping[str, Any]


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    outcomes: tuple[OperationOutcome, ...]

    @property
    def ok(self) -> bool:
        return all(o.status == SUCCESS for o in self.outcomes)

    @property
    def failed(self) -> list[OperationOutcome]:
        return [o for o in self.outcomes if o.status != SUCCESS]


def retryable(exc: BaseException) -> bool:
    err = classify(exc)
    return isinstance(err, TransientError) or err.code in ("failed", "timeout")


class AttemptTimeout(TransientError):
    code = "timeout"


class BatchRunner:
    """See the module docstring. Clock, sleep and randomness are injected for tests."""

    def __init__(self, operations: Operations, audit: AuditLog, *, run_id: str, execution_user: str,
                 max_workers: int = 4, progress: Progress | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random, cancel_grace_seconds: float = 60.0) -> None:
        self.operations = operations
        self.audit = audit
        self.run_id = run_id
        self.execution_user = execution_user
        self.max_workers = max_workers
        self.progress = progress
        self.clock, self.sleep, self.rand = clock, sleep, rand
        self.cancel_grace_seconds = cancel_grace_seconds

    def run(self, jobs: Sequence[TableJob]) -> RunSummary:
        if self.progress:
            self.progress.started(sum(len(j.settings.operations) for j in jobs))
        with ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="lakemirror-replicate") as pool:
            per_job = list(pool.map(self._run_job, jobs))
        return RunSummary(self.run_id, tuple(o for outcomes in per_job for o in outcomes))

    def _run_job(self, job: TableJob) -> list[OperationOutcome]:
        return [self._run_operation(job, op) for op in job.settings.operations]

    def _run_operation(self, job: TableJob, operation: str) -> OperationOutcome:
        s = job.settings
        error: str | None = None
        details: Mapping[str, Any] = {}
        for attempt in range(1, s.max_attempts + 1):
            start = self.clock()
            again = False
            tag = f"lakemirror-{self.run_id}-{operation}-{job.target.slug}-{attempt}"
            try:
                details = self._attempt(operation, job, tag)
                error = None
            except Exception as exc:  # noqa: BLE001 — every failure is recorded, none escapes
                err = classify(exc, table=str(job.source))
                error = err.message
                details = {"error_code": err.code, **getattr(exc, "details", {}), "trace": _trace(exc)}
                again = retryable(exc) and attempt < s.max_attempts
                log.warning("run %s: %s %s -> %s: attempt %d of %d failed%s: %s", self.run_id, operation, job.source,
                            job.target, attempt, s.max_attempts, " (will retry)" if again else "", redact(err.message))
                log.debug("run %s: %s %s: the failure's trace", self.run_id, operation, job.source, exc_info=exc)
            end = self.clock()
            status = SUCCESS if error is None else FAILED
            self._audit(job, operation, status, start, end, error, details, attempt)
            if self.progress:
                self.progress.finished(job, operation, status, attempt, end - start, error, not again)
            if error is None:
                return OperationOutcome(job, operation, SUCCESS, attempt, None, details)
            if not again:
                return OperationOutcome(job, operation, FAILED, attempt, error, details)
            self.sleep(s.backoff.delay(attempt, self.rand()))
        raise AssertionError("unreachable: the last attempt returns")  # pragma: no cover

    def _attempt(self, operation: str, job: TableJob, tag: str) -> Mapping[str, Any]:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = self.operations.run(operation, job, tag)
            except BaseException as exc:  # noqa: BLE001 — handed to the waiting thread
                box["error"] = exc

        worker = threading.Thread(target=target, name=tag[:60], daemon=True)
        worker.start()
        worker.join(job.settings.timeout_seconds)
        if worker.is_alive():
            self.operations.cancel(tag)
            worker.join(self.cancel_grace_seconds)
            raise AttemptTimeout(f"{job.source}: {operation} timed out after {job.settings.timeout_seconds:g} s "
                                 f"and was cancelled", table=str(job.source))
        if "error" in box:
            raise box["error"]
        return box.get("result") or {}

    def _audit(self, job: TableJob, operation: str, status: str, start: float, end: float,
               error: str | None, details: Mapping[str, Any], attempt: int) -> None:
        def ts(t: float) -> datetime:
            return datetime.fromtimestamp(t, timezone.utc)

        self.audit.append(AuditRecord(
            run_id=self.run_id, logging_time=ts(self.clock()), operation_type=OPERATION_TYPE.get(operation, operation),
            catalog_name=job.target.catalog, schema_name=job.target.schema, object_name=job.target.table,
            object_type=job.object_type, status=status, start_time=ts(start), end_time=ts(end),
            duration_seconds=round(end - start, 6), error_message=redact(error) if error else error,
            details=json.dumps({"operation": operation, "source": str(job.source), **details}, default=str,
                               sort_keys=True),
            attempt_number=attempt, max_attempts=job.settings.max_attempts,
            config_details=config_json(job.settings.config), execution_user=self.execution_user))


def _trace(exc: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-limit:]
