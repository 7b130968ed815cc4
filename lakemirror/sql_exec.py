"""The one place lakemirror hands a SQL statement to Spark: every statement is logged at DEBUG on the
``lakemirror.sql`` logger before it runs (credentials redacted), so ``--log-level DEBUG`` shows all of
them, whichever part of lakemirror runs it. A unit test keeps every other module from calling a
session's ``sql`` itself (tests/unit/test_sql_choke_point.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lakemirror.secrets import redact

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("lakemirror.sql")


def run_sql(spark: "SparkSession | Any", statement: str) -> "DataFrame":
    """``spark.sql(statement)``, logged at DEBUG first (its DataFrame; DDL and DML run at once)."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("SQL: %s", redact(statement))
    return spark.sql(statement)
