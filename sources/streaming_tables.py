"""Databricks Streaming Tables: find the Delta table that backs one, so it can be deep-cloned.

A Streaming Table (or a materialized view) of a Lakeflow Declarative Pipeline (formerly DLT) is
not itself a Delta table that ``DEEP CLONE`` can read: its data lives in a backing table the
pipeline manages in the system catalog ``__databricks_internal``, in the schema
``__dlt_materialization_schema_<pipeline id>`` (the id's ``-`` written as ``_``). The pipeline id
is the table property ``pipelines.pipelineId`` (``DESCRIBE DETAIL``). Inside that schema the
backing table has been seen under several names, so they are tried in order (:func:`backing_candidates`)
against one ``SHOW TABLES`` of the schema:

1. the table's own name;
2. ``__materialization_mat_<pipeline id>_<name>_1``;
3. ``__materialization_mat_<name>_1``.

Nothing here is a documented Databricks contract: the layout comes from public tooling that
clones these tables (see the README). A table with the property whose backing table is in none of
the candidates is refused with the names tried, never cloned from a guess.
"""

from __future__ import annotations

from typing import Any, Protocol

from lakemirror.errors import TerminalError
from lakemirror.identifiers import TableName, quote

PIPELINE_ID_PROPERTY = "pipelines.pipelineId"
INTERNAL_CATALOG = "__databricks_internal"
SCHEMA_PREFIX = "__dlt_materialization_schema_"


class SqlRunner(Protocol):
    """Runs one statement and returns its rows as dicts (``lakemirror.sinks.sql.SparkSql`` or its twin)."""

    def sql(self, statement: str) -> list[dict[str, Any]]: ...


class BackingTableMissing(TerminalError):
    code = "backing_table_missing"


class UnsupportedObject(TerminalError):
    """An object replication refuses by name, with the reason (materialized views, streaming checkpoints)."""

    code = "unsupported_object"


MATERIALIZED_VIEW = "MATERIALIZED_VIEW"
#: Why a materialized view is not copied (an unsupported object type).
MATERIALIZED_VIEW_REASON = ("a materialized view is the result of its query, kept by its pipeline: a copy of its "
                            "backing table would be a table no pipeline refreshes, and it cannot be shared or cloned "
                            "as a materialized view. Recreate it on the target from its definition, over the "
                            "replicated tables")
#: Why streaming checkpoints are not copied.
CHECKPOINT_REASON = ("a streaming checkpoint records one query's progress through its own source (offsets, "
                     "state, batch ids); on the target the source's log positions differ, so a copied checkpoint "
                     "would resume at the wrong place or fail. Restart the streams on the target from the "
                     "replicated tables")


def table_type(sql: SqlRunner, name: TableName) -> str | None:
    """The ``Type`` row of ``DESCRIBE TABLE EXTENDED`` (``MANAGED``, ``STREAMING_TABLE``,
    ``MATERIALIZED_VIEW``, ``VIEW``…), upper-cased; None if it does not say."""
    for row in sql.sql(f"DESCRIBE TABLE EXTENDED {name.sql}"):
        if str(row.get("col_name") or "").strip() == "Type":
            return str(row.get("data_type") or "").strip().upper() or None
    return None


def backing_schema(pipeline_id: str) -> str:
    return SCHEMA_PREFIX + pipeline_id.replace("-", "_")


def backing_candidates(name: TableName, pipeline_id: str) -> list[TableName]:
    """Where the backing table of ``name`` may be, most likely first (pure)."""
    pid = pipeline_id.replace("-", "_")
    schema = backing_schema(pipeline_id)
    return [TableName(INTERNAL_CATALOG, schema, t) for t in
            (name.table, f"__materialization_mat_{pid}_{name.table}_1", f"__materialization_mat_{name.table}_1")]


def pipeline_id_of(properties: dict[str, Any] | None) -> str | None:
    pid = (properties or {}).get(PIPELINE_ID_PROPERTY)
    return str(pid) if pid else None


def resolve_backing_table(sql: SqlRunner, name: TableName) -> TableName:
    """``name`` itself for an ordinary table; the backing table for a Streaming Table. A materialized
    view is refused (:class:`UnsupportedObject`, with the reason)."""
    detail = sql.sql(f"DESCRIBE DETAIL {name.sql}")
    pid = pipeline_id_of(detail[0].get("properties") if detail else None)
    if pid is None:
        return name
    if table_type(sql, name) == MATERIALIZED_VIEW:
        raise UnsupportedObject(f"{name} is a materialized view and is not replicated: {MATERIALIZED_VIEW_REASON}",
                                table=str(name))
    candidates = backing_candidates(name, pid)
    schema = f"{quote(INTERNAL_CATALOG)}.{quote(backing_schema(pid))}"
    present = {str(r.get("tableName")) for r in sql.sql(f"SHOW TABLES IN {schema}")}
    for candidate in candidates:
        if candidate.table in present:
            return candidate
    raise BackingTableMissing(
        f"{name} is managed by pipeline {pid} ({PIPELINE_ID_PROPERTY}) but none of its possible backing tables "
        f"exists or is visible to this principal: {', '.join(str(c) for c in candidates)}", table=str(name))
