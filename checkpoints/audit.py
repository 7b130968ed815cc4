"""The audit log: one row per object per attempt of a batch operation (clone, reconcile, metadata).

Exactly the columns of the Data Replication System for Databricks's audit log table, in its order, so that one table
and the queries over it serve both:
run_id, logging_time, operation_type, catalog_name, schema_name, object_name, object_type,
status, start_time, end_time, duration_seconds, error_message, details, attempt_number,
max_attempts, config_details, execution_user. ``config_details`` is JSON with every secret
masked (:func:`mask_secrets`); ``details`` is JSON of the operation's result.

A failed attempt that is retried writes its own row (status ``failed``), then the retry writes
another: the table tells how often an object needed a second try.
"""

from __future__ import annotations

import json
import threading
from dataclasses import astuple, dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from lakemirror import tables
from lakemirror.secrets import MASK, mask_secrets  # noqa: F401  (MASK: part of this module's API)
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SUCCESS = "success"
FAILED = "failed"

@dataclass(frozen=True)
class AuditRecord:
    run_id: str
    logging_time: datetime
    operation_type: str
    catalog_name: str
    schema_name: str
    object_name: str
    object_type: str
    status: str
    start_time: datetime
    end_time: datetime
    duration_seconds: float
    error_message: str | None
    details: str | None
    attempt_number: int
    max_attempts: int
    config_details: str
    execution_user: str

    @classmethod
    def column_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


#: Spark DDL of the audit table, in that column order.
AUDIT_DDL = ", ".join([
    "run_id STRING", "logging_time TIMESTAMP", "operation_type STRING", "catalog_name STRING",
    "schema_name STRING", "object_name STRING", "object_type STRING", "status STRING",
    "start_time TIMESTAMP", "end_time TIMESTAMP", "duration_seconds DOUBLE", "error_message STRING",
    "details STRING", "attempt_number INT", "max_attempts INT", "config_details STRING",
    "execution_user STRING",
])


def config_json(config: Any) -> str:
    """``config_details``: masked, JSON, keys sorted (stable across runs)."""
    return json.dumps(mask_secrets(config), sort_keys=True, default=str)


class AuditLog(Protocol):
    """Where audit rows go; ``append`` is called once per object per attempt."""

    def append(self, record: AuditRecord) -> None: ...


class InMemoryAuditLog:
    """The twin used by unit tests: rows in a list, thread-safe like the Delta table."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []
        self._lock = threading.Lock()

    def append(self, record: AuditRecord) -> None:
        with self._lock:
            self.records.append(record)


class DeltaAuditLog:
    """Audit rows appended to a Delta table (default ``<audit catalog>.continuous_sync.audit_log``).

    Appends from worker threads are serialised: blind appends never conflict in Delta, but one
    lock keeps the driver from building many tiny jobs at once.
    """

    def __init__(self, spark: "SparkSession", location: TableLocation) -> None:
        self.spark = spark
        self.location = location
        self._lock = threading.Lock()

    def append(self, record: AuditRecord) -> None:
        with self._lock:
            df = self.spark.createDataFrame([astuple(record)], AUDIT_DDL)
            tables.write(df, self.location, "append")
