"""A path-based Delta table described from its log on the driver (delta-rs), with no Spark job.

Spark describes a table by ``DESCRIBE DETAIL`` and the schema of a read, and each rebuilds the
table's snapshot: a Spark job on a source whose writer leaves no checksum files, and on a freshly
started JVM much of a new pipeline's first launch (Delta's classes loaded and compiled for it). Yet
everything a description holds comes from the latest ``metaData`` action of the table's log: the
table id, the schema, and the properties (``DESCRIBE DETAIL``'s ``properties`` are the metadata's
``configuration``). delta-rs reads that action on the driver, from the last checkpoint and the
commits after it, for a table on the driver's file system or on S3 through the session's settings
(:func:`lakemirror.object_store.delta_rs_reader`).

Its columns are typed as Spark names them (:func:`lakemirror.schema.columns_from_delta_schema`:
``long`` is ``bigint``; ``char``/``varchar`` columns are strings in the log's schema as in Spark's
read). Where delta-rs cannot read the log (no table there, a feature it does not know, a type the
mapping does not name), the answer is None and Spark describes the table, or names the problem.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakemirror.object_store import delta_rs_reader
from lakemirror.schema import Column, columns_from_delta_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogDescription:
    """What a table's latest ``metaData`` action says, read at ``version``."""

    version: int
    table_id: str
    columns: tuple[Column, ...]
    properties: dict[str, str]


def describe_from_log(spark: "SparkSession", path: str | None) -> LogDescription | None:
    """The description of the path-based table at ``path`` read from its log by delta-rs; None where
    delta-rs does not reach or read it (see the module docstring)."""
    reader = delta_rs_reader(spark, path)
    if reader is None or importlib.util.find_spec("deltalake") is None:
        return None
    from deltalake import DeltaTable

    uri, options = reader
    try:
        table = DeltaTable(uri, storage_options=options or None)
        metadata = table.metadata()
        columns = columns_from_delta_schema(json.loads(table.schema().to_json()))
        return LogDescription(int(table.version()), str(metadata.id), columns,
                              {str(k): str(v) for k, v in dict(metadata.configuration).items()})
    except Exception as exc:  # noqa: BLE001 (Spark describes the table, or names what is wrong with it)
        log.debug("table at %s: delta-rs does not describe it (%s); Spark does", path, exc)
        return None
