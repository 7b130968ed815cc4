"""VACUUM of a replica lakemirror created, at the replica's own retention (the ``vacuum`` operation).

Nothing else removes the files a MERGE replaced: they stay in storage, and a full VACUUM lists the
whole table to find them. This one:

- touches only a replica the pipeline created (its ``lakemirror.pipeline`` property names the
  pipeline): never a table something else owns;
- passes no retention of its own: Delta keeps every file a reader at the replica's
  ``delta.deletedFileRetentionDuration`` could need (a time-travel read, or a reader of the
  replica's change feed that far behind), and its check that a VACUUM keeps at least that stays
  on. The replica's transaction ids live in its log, which a VACUUM does not touch, so a replayed
  batch is still recognised after one;
- runs Delta's ``LITE`` mode first, which finds the files to delete from the log's remove actions
  instead of listing the table (on object storage, one LIST request per 1,000 files), and a full
  VACUUM only where the log no longer reaches back far enough for it (Delta says so).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lakemirror import tables
from lakemirror.errors import TerminalError
from lakemirror.sinks.batch.snapshot_copy import PIPELINE_PROPERTY, replica_properties
from lakemirror.tables import TableLocation
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Delta's answer when a LITE vacuum cannot see every file to delete in the log.
LITE_NOT_ENOUGH_LOG = "DELTA_CANNOT_VACUUM_LITE"
RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"


class NotOurReplica(TerminalError):
    """The table to VACUUM was not created by this pipeline: it is left alone."""

    code = "not_our_replica"


def vacuum_replica(spark: "SparkSession", target: TableLocation, pipeline_id: str) -> dict[str, Any]:
    """VACUUM the replica ``target`` of pipeline ``pipeline_id``; what was done, for the audit row."""
    if not tables.exists(spark, target):
        return {"vacuumed": False, "reason": "the replica does not exist yet"}
    properties = replica_properties(spark, target)
    owner = properties.get(PIPELINE_PROPERTY)
    if owner != pipeline_id:
        raise NotOurReplica(f"{target.name} was not created by pipeline {pipeline_id!r} "
                            f"({'it is the replica of ' + repr(owner) if owner else 'it is not a lakemirror replica'});"
                            f" lakemirror vacuums only its own replicas", table=str(target.name))
    retention = properties.get(RETENTION_PROPERTY, "interval 7 days (Delta's default)")
    mode = "lite"
    try:
        run_sql(spark, f"VACUUM {target.sql} LITE").collect()
    except Exception as exc:  # noqa: BLE001 (only Delta's "the log does not reach back" falls back)
        if LITE_NOT_ENOUGH_LOG not in str(exc):
            raise
        log.info("%s: the log does not reach back to every file to delete; a full VACUUM lists the table", target.name)
        mode = "full"
        run_sql(spark, f"VACUUM {target.sql}").collect()
    return {"vacuumed": True, "mode": mode, "retention": retention, **_deleted(spark, target)}


def _deleted(spark: "SparkSession", target: TableLocation) -> dict[str, Any]:
    """The files the VACUUM deleted, from its ``VACUUM END`` commit (Delta logs one when vacuum
    logging is on); nothing when it left none."""
    try:
        rows = (tables.history(spark, target, 3).where("operation = 'VACUUM END'")
                .select("operationMetrics").limit(1).collect())
    except Exception as exc:  # noqa: BLE001 (the report only)
        log.debug("%s: reading the VACUUM's metrics failed: %s", target.name, exc)
        return {}
    if not rows:
        return {}
    metrics = rows[0]["operationMetrics"] or {}
    return {"files_deleted": int(metrics.get("numDeletedFiles") or 0),
            "directories_vacuumed": int(metrics.get("numVacuumedDirectories") or 0)}
