"""The ``replica_maintenance:`` block: keeping a replica's cost per batch flat over hours.

Every MERGE into a small replica rewrites most of its files, and each file it replaces stays in
the replica's log as a *remove* action (a tombstone) for ``delta.deletedFileRetentionDuration``
(Delta's default: 7 days), in every checkpoint written meanwhile. Every snapshot Delta builds of
the replica (one per MERGE) reads the last checkpoint, so with the default a replica taking a batch
every few seconds carries hundreds of thousands of tombstones after a week, and each batch pays for
them. The replaced files themselves stay in storage until a VACUUM removes them, and nothing else
removes them. So the replicas lakemirror creates get:

- a shorter deleted-file retention (tombstones leave the checkpoints sooner; a reader can time
  travel that far back, and a VACUUM never removes a file a reader at the retention could need);
- a log retention at least as long (commit files and history are kept that long);
- a checkpoint interval of their own (a checkpoint every this many commits);
- a VACUUM on a schedule (a sub-task of its own, ``replica-vacuum``), which removes the files their
  retention no longer covers and never passes a retention of its own (Delta's check that a VACUUM
  keeps the table's retention stays on).

What ``replica_properties`` sets wins over the first three, replica by replica.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lakemirror.daemon.settings import limits
from lakemirror.daemon.settings.schedule import DailyAtText
from lakemirror.supervisor.subtasks.scheduler import DailyAt, Every, Trigger

#: The Delta table properties the block sets.
DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"
LOG_RETENTION = "delta.logRetentionDuration"
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
#: The name of the scheduled VACUUM sub-task (a metric label and its status entry).
VACUUM_TASK = "replica-vacuum"


def hours_interval(hours: float) -> str:
    """A duration as Delta's table properties spell it (``interval 36 hours``, ``interval 90 minutes``)."""
    minutes = round(hours * 60)
    return f"interval {minutes // 60} hours" if minutes % 60 == 0 else f"interval {minutes} minutes"


class ReplicaMaintenance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    deleted_file_retention_hours: float | None = Field(
        24.0, ge=1, le=limits.YEAR / 3600, description="delta.deletedFileRetentionDuration of the replicas "
        "lakemirror creates: how long a file a batch replaced stays readable (time travel, a reader of the replica's "
        "own change feed) and stays in the replica's checkpoints as a remove action. Shorter keeps every batch's "
        "snapshot of the replica small (Delta's default, 7 days, leaves a week of every batch's replaced files in "
        "each checkpoint); longer lets readers of the replica fall further behind. null: Delta's default.")
    log_retention_hours: float | None = Field(
        168.0, ge=1, le=limits.YEAR / 3600, description="delta.logRetentionDuration of the replicas lakemirror "
        "creates: how long commit files (and DESCRIBE HISTORY) are kept. At least deleted_file_retention_hours. "
        "null: Delta's default (30 days).")
    checkpoint_interval: int | None = Field(
        10, ge=1, le=10_000, description="delta.checkpointInterval of the replicas lakemirror creates: a checkpoint "
        "every this many commits. Each batch's snapshot of the replica reads the last checkpoint and every commit "
        "after it (on object storage a request each), and each checkpoint rewrites the replica's whole file list, "
        "remove actions within the retention included; with the retention above the list stays small, so "
        "checkpoints are kept frequent. Set here so that a session default "
        "(spark.databricks.delta.properties.defaults.checkpointInterval) does not change it. null: the session's "
        "or Delta's default.")
    vacuum_every_seconds: float | None = Field(
        21600.0, gt=0, le=limits.YEAR, description="How often the sub-task replica-vacuum runs VACUUM on every "
        "replica of the pipeline (Delta replicas only), with each replica's own retention: files replaced more than "
        "deleted_file_retention_hours ago are deleted from storage. First run one interval after the daemon starts. "
        "null (and no vacuum_daily_at): never.")
    vacuum_daily_at: DailyAtText = Field(
        None, description="Instead of vacuum_every_seconds: run replica-vacuum once a day at HH:MM UTC, e.g. '03:30'.")
    vacuum_timeout_seconds: float = Field(3600.0, gt=0, le=limits.DAY, description="Per replica and attempt.")

    @model_validator(mode="after")
    def _consistent(self) -> "ReplicaMaintenance":
        files, log = self.deleted_file_retention_hours, self.log_retention_hours
        if files is not None and log is not None and log < files:
            raise ValueError(f"log_retention_hours ({log:g}) is shorter than deleted_file_retention_hours "
                             f"({files:g}): a version whose files are kept could not be read once its commit is "
                             f"gone; make log_retention_hours at least {files:g}")
        return self

    def properties(self) -> dict[str, str]:
        """The table properties a replica lakemirror creates gets (before ``replica_properties``)."""
        out: dict[str, str] = {}
        if self.deleted_file_retention_hours is not None:
            out[DELETED_FILE_RETENTION] = hours_interval(self.deleted_file_retention_hours)
        if self.log_retention_hours is not None:
            out[LOG_RETENTION] = hours_interval(self.log_retention_hours)
        if self.checkpoint_interval is not None:
            out[CHECKPOINT_INTERVAL] = str(self.checkpoint_interval)
        return out

    def vacuum_trigger(self) -> Trigger | None:
        """When replica-vacuum runs; None: never."""
        if self.vacuum_daily_at is not None:
            return DailyAt.parse(self.vacuum_daily_at)
        return Every(self.vacuum_every_seconds) if self.vacuum_every_seconds is not None else None

    def describe(self) -> dict[str, Any]:
        return self.model_dump()
