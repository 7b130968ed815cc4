"""A SQL executor interface with its twin, for the sinks that speak SQL (clone, metadata sync).

:class:`SparkSql` runs statements on a Spark session (a Databricks job's, or a local one);
:class:`RecordingSql` is the in-memory twin: it records every statement in order and answers
queries from canned rows, so unit tests check the exact SQL without a workspace.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Row = dict[str, Any]


class SqlExecutor(Protocol):
    def sql(self, statement: str) -> list[Row]:
        """Run one statement; return its rows as dicts (empty for DDL)."""
        ...


class SparkSql:
    """Statements on a Spark session; every statement is logged at DEBUG (:mod:`lakemirror.sql_exec`)."""

    def __init__(self, spark: "SparkSession") -> None:
        self.spark = spark

    def sql(self, statement: str) -> list[Row]:
        return [r.asDict(recursive=True) for r in run_sql(self.spark, statement).collect()]


class RecordingSql:
    """The twin: records statements; ``answers`` maps a statement prefix to rows (or a callable)."""

    def __init__(self, answers: dict[str, list[Row] | Callable[[str], list[Row]]] | None = None) -> None:
        self.answers = dict(answers or {})
        self.statements: list[str] = []
        self._lock = threading.Lock()

    def sql(self, statement: str) -> list[Row]:
        with self._lock:
            self.statements.append(statement)
        for prefix, rows in sorted(self.answers.items(), key=lambda kv: -len(kv[0])):
            if statement.startswith(prefix):
                return rows(statement) if callable(rows) else list(rows)
        return []
