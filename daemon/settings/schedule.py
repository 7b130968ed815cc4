"""The ``schedules`` section of a pipeline: batch sub-tasks the daemon runs on a schedule.

Each entry names a sub-task, its operations (run in the given order per table, like
``lakemirror replicate``), when it runs (``every_seconds`` or ``daily_at: "HH:MM"`` in UTC; exactly
one), the tables (default: the pipeline's), and the per-object options of ``lakemirror replicate``
(``timeout_seconds``, ``retry``, ``clone``, ``reconcile``, ``metadata``)::

    schedules:
      - name: nightly-reconcile
        operations: [reconcile]
        daily_at: "02:30"
        reconcile: {buckets: 256, repair: false}
      - name: archive-sweep
        operations: [incremental, metadata]
        every_seconds: 600
        tables: [archive]              # excluded from the continuous stream (exclude_tables)

``clone`` and ``incremental`` write the replica, so they only take tables the continuous stream
does not replicate (named explicitly): the two would race on one replica. The cross-checks against
the pipeline live in :func:`schedule_problems`, called by the pipeline's validator.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Sequence

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from lakemirror.daemon.settings import limits
from lakemirror.daemon.settings.task_options import CloneOptions, MetadataSettings, ReconcileSettings, RetrySettings, Strict
from lakemirror.supervisor.subtasks.scheduler import DailyAt, Every, Trigger


def _daily_at_quoted(v: object) -> object:
    if isinstance(v, int) and not isinstance(v, bool):  # YAML 1.1 reads 02:30 unquoted as 150 (base 60)
        raise ValueError(f"write the time of day quoted, e.g. daily_at: \"02:30\" (unquoted, YAML reads "
                         f"HH:MM as a number: {v})")
    return v


def _daily_at_valid(v: str | None) -> str | None:
    if v is not None:
        DailyAt.parse(v)
    return v


#: A ``daily_at`` field: "HH:MM" in UTC, refused unquoted (YAML would read it as a number).
DailyAtText = Annotated[str | None, BeforeValidator(_daily_at_quoted), AfterValidator(_daily_at_valid)]

SubtaskOperation = Literal["clone", "reconcile", "metadata", "incremental", "vacuum"]
#: Operations that write the replica: never on a table the continuous stream owns.
WRITERS = frozenset({"clone", "incremental"})
_TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ScheduleSettings(Strict):
    """One scheduled sub-task (an entry of ``schedules``)."""

    name: str = Field(description="Unique name of the sub-task (1-64 of [A-Za-z0-9_.-]); a metric label.")
    operations: list[SubtaskOperation] = Field(min_length=1, description="clone, incremental, reconcile, "
                                                                        "metadata, vacuum (of a replica lakemirror "
                                                                        "created, at its own retention); run in this "
                                                                        "order per table.")
    every_seconds: float | None = Field(None, gt=0, le=limits.YEAR,
                                        description="Run every this many seconds (first run one interval after the "
                                                    "daemon starts).")
    daily_at: DailyAtText = Field(None, description="Run once a day at HH:MM, UTC (24-hour), e.g. '02:30'.")
    tables: list[str] | None = Field(None, description="Tables of the source schema (default: the pipeline's).")
    timeout_seconds: float = Field(3600.0, gt=0, le=limits.YEAR, description="Per table, operation and attempt.")
    retry: RetrySettings = Field(default_factory=RetrySettings)
    clone: CloneOptions = Field(default_factory=CloneOptions)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    metadata: MetadataSettings = Field(default_factory=MetadataSettings)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _TASK_NAME.match(v):
            raise ValueError("a sub-task name is 1-64 characters of letters, digits, '_', '.', '-', "
                             "starting with a letter or digit")
        return v

    @field_validator("operations")
    @classmethod
    def _ops(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"operations repeat: {v}")
        return v

    @field_validator("tables")
    @classmethod
    def _tables(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v:
                raise ValueError("an empty list runs nothing; omit `tables` for the pipeline's tables")
            limits.names(v, "a table name")
            bad = [t for t in v if not t.strip() or re.search(r"[\x00-\x1f/`.]", t)]
            if bad:
                raise ValueError(f"table names {bad} may not be empty or contain '.', '/', '`' or control characters")
            if len(set(v)) != len(v):
                raise ValueError(f"table names repeat: {v}")
        return v

    @model_validator(mode="after")
    def _one_trigger(self) -> "ScheduleSettings":
        if (self.every_seconds is None) == (self.daily_at is None):
            raise ValueError("give exactly one of every_seconds or daily_at")
        return self

    def trigger(self) -> Trigger:
        return Every(self.every_seconds) if self.every_seconds is not None else DailyAt.parse(self.daily_at or "")


Problem = tuple[tuple[str | int, ...], str]  # (location, message)


def schedule_problems(schedules: Sequence[ScheduleSettings], streamed: Sequence[str] | None,
                      excluded: Sequence[str]) -> list[Problem]:
    """What is wrong with ``schedules`` given the continuous stream's ``tables`` (None: every table
    of the schema except ``excluded``), each with its location."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, s in enumerate(schedules):
        if s.name in seen:
            problems.append((("schedules", i, "name"), f"another sub-task is named {s.name!r}; names must be unique"))
        seen.add(s.name)
        writers = ", ".join(sorted(WRITERS & set(s.operations)))
        if not writers:
            continue
        if s.tables is None:
            problems.append((("schedules", i, "tables"), f"{writers} write the replica: name the tables, which the "
                             f"continuous stream must not replicate (list them in exclude_tables)"))
            continue
        owned = [t for t in s.tables if t not in excluded and (streamed is None or t in streamed)]
        if owned:
            problems.append((("schedules", i, "tables"), f"{owned} are replicated continuously; {writers} would "
                             f"race the stream on their replicas (exclude them from the stream, or drop them here)"))
    return problems
