"""The backup operation: what the source workspace exports so that the target can replicate it.

Delta Sharing cannot share a Streaming Table's data as it is: its data lives in a backing table its
pipeline manages. Per table, ``backup``:

- a **Streaming Table**: its backing table, found from the pipeline id
  (:func:`~lakemirror.sources.streaming_tables.resolve_backing_table`), is deep cloned into the backup
  catalog under the same schema and table name (``CREATE OR REPLACE TABLE … DEEP CLONE``: Databricks
  copies only the files it has not copied before), recording the Streaming Table as its source;
- a **materialized view** is refused by name, with the reason
  (:data:`~lakemirror.sources.streaming_tables.MATERIALIZED_VIEW_REASON`);
- any other table is shared as it is, through its schema.

Then, per source catalog, :class:`ShareSchemas` adds to the share the schemas that hold what was
backed up: the source schemas of the tables and volumes, the backup catalog's schemas of the clones
(idempotent: a schema already shared is left alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from lakemirror.identifiers import TableName, quote
from lakemirror.sinks.batch.clone import DeepCloner
from lakemirror.sinks.sql import SparkSql, SqlExecutor
from lakemirror.sources.streaming_tables import resolve_backing_table

if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient

    from lakemirror.sinks.batch.operations import TaggedSessions


def backup_table(sql: SqlExecutor, source: TableName, backup_catalog: str) -> dict[str, Any]:
    """Back up one table (see the module docstring); what was done and the schema to share."""
    backing = resolve_backing_table(sql, source)  # a materialized view raises UnsupportedObject here
    if backing == source:
        return {"action": "shared", "share_schema": f"{source.catalog}.{source.schema}",
                "reason": "not a Streaming Table: shared through its schema"}
    target = TableName(backup_catalog, source.schema, source.table)
    sql.sql(f"CREATE SCHEMA IF NOT EXISTS {quote(target.catalog)}.{quote(target.schema)}")
    result = DeepCloner(sql).clone(source, target, read_from=backing)
    return {"action": "deep_clone", "backing_table": str(backing), "backup_table": str(target),
            "share_schema": f"{target.catalog}.{target.schema}", **dict(result.details())}


class BackupOperations:
    """The ``backup`` operation of the batch runner, on the attempt's own session (cancellable by tag)."""

    def __init__(self, sessions: "TaggedSessions") -> None:
        self.sessions = sessions

    def run(self, operation: str, job: Any, tag: str) -> Mapping[str, Any]:
        opts = job.settings.options.get("backup", {})
        with self.sessions.session(tag) as session:
            return backup_table(SparkSql(session), job.source, str(opts["catalog"]).format(catalog=job.source.catalog))

    def cancel(self, tag: str) -> None:
        self.sessions.cancel(tag)


class ShareSchemas:
    """The ``backup_share`` operation: adds ``options["backup_share"]["schemas"]`` to the share."""

    def __init__(self, source: Callable[[], "WorkspaceClient"]) -> None:
        self.source = source

    def run(self, operation: str, job: Any, tag: str) -> Mapping[str, Any]:
        from lakemirror.sinks.batch.sharing import add_schemas

        opts = job.settings.options.get("backup_share", {})
        added = add_schemas(self.source(), str(opts["share"]), list(opts["schemas"]),
                            history=bool(opts.get("history", True)))
        return {"share": opts["share"], "schemas": list(opts["schemas"]), "added": added}

    def cancel(self, tag: str) -> None:
        pass
