"""Views replicated with their definitions rewritten to the target's names, created in dependency order.

:func:`read_views` reads a schema's views through SQL (``SHOW VIEWS``, then ``DESCRIBE TABLE EXTENDED``
for each: its text, comment and the catalog and schema it was defined in), on Spark's catalog or Unity
Catalog alike; across metastores, :func:`views_from_sdk` reads them from the source workspace's
``tables.list`` instead. :func:`plan_views` (pure) rewrites each definition
(:func:`~lakemirror.sinks.batch.uc_names.rewrite_names`) and orders them in levels
(:func:`~lakemirror.sinks.batch.uc_names.dependency_levels`); :func:`create_view` creates one on the
target with ``CREATE OR REPLACE VIEW``, the target's catalog and schema current (so the bare names of
the text resolve there, as they did in the source's), on a session of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from lakemirror.identifiers import TableName, quote, sql_string
from lakemirror.sinks.batch.uc_names import NameMap, dependency_levels, references, rewrite_names
from lakemirror.sinks.sql import SqlExecutor

if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient


@dataclass(frozen=True)
class ViewDef:
    name: TableName
    text: str
    comment: str | None = None


@dataclass(frozen=True)
class PlannedView:
    source: TableName
    target: TableName
    text: str                      # rewritten
    comment: str | None
    level: int                     # 0: reads no other replicated view
    depends_on: tuple[str, ...]    # source names of the replicated views it reads


def read_views(sql: SqlExecutor, catalog: str, schema: str) -> list[ViewDef]:
    """The (non-temporary) views of ``catalog.schema`` with their definitions."""
    out = []
    for row in sql.sql(f"SHOW VIEWS IN {quote(catalog)}.{quote(schema)}"):
        if row.get("isTemporary"):
            continue
        name = TableName(catalog, schema, str(row.get("viewName")))
        info = {str(r.get("col_name") or "").strip(): r.get("data_type") for r in
                sql.sql(f"DESCRIBE TABLE EXTENDED {name.sql}")}
        text = info.get("View Text") or info.get("View Original Text")
        if text:
            comment = info.get("Comment")
            out.append(ViewDef(name, str(text), str(comment) if comment else None))
    return out


def views_from_sdk(client: "WorkspaceClient", catalog: str, schema: str) -> list[ViewDef]:
    """The views of ``catalog.schema`` as the source workspace's Unity Catalog describes them."""
    from lakemirror.errors import TerminalError
    from lakemirror.sinks.batch.uc_objects import _absent

    tables = _absent(f"tables of {catalog}.{schema}", lambda: list(client.tables.list(catalog, schema)))
    if tables is None:
        raise TerminalError(f"tables of {catalog}.{schema}: the source workspace has no schema {catalog}.{schema}")
    return [ViewDef(TableName(catalog, schema, str(t.name)), str(t.view_definition), t.comment)
            for t in tables if t.view_definition and str(getattr(t.table_type, "value", t.table_type)) == "VIEW"]


def plan_views(views: Sequence[ViewDef], names: NameMap) -> list[PlannedView]:
    """Each view's target name and rewritten text, and its level (pure)."""
    def key(n: TableName) -> tuple[str, str, str]:
        return (n.catalog.lower(), n.schema.lower(), n.table.lower())

    by_key = {key(v.name): v for v in views}
    refs = {key(v.name): references(v.text, (v.name.catalog, v.name.schema)) for v in views}
    levels = dependency_levels(refs)
    level_of = {k: i for i, level in enumerate(levels) for k in level}
    out = []
    for k, v in sorted(by_key.items(), key=lambda kv: (level_of[kv[0]], kv[0])):
        target_cs = names.map3(v.name.catalog, v.name.schema) or (v.name.catalog, v.name.schema)
        deps = sorted(str(by_key[r].name) for r in refs[k] if r in by_key and r != k)
        out.append(PlannedView(v.name, TableName(target_cs[0], target_cs[1], v.name.table),
                               rewrite_names(v.text, names, (v.name.catalog, v.name.schema)), v.comment,
                               level_of[k], tuple(deps)))
    return out


def create_view_sql(view: PlannedView) -> str:
    comment = f" COMMENT {sql_string(view.comment)}" if view.comment else ""
    return f"CREATE OR REPLACE VIEW {view.target.sql}{comment} AS {view.text}"


def create_view(sql: SqlExecutor, view: PlannedView) -> dict[str, Any]:
    """Create (or replace) the view on the target with its catalog and schema current."""
    sql.sql(f"USE {quote(view.target.catalog)}.{quote(view.target.schema)}")
    sql.sql(create_view_sql(view))
    return {"view": str(view.target), "level": view.level, "depends_on": list(view.depends_on),
            "definition": view.text}


def planned_from(options: Mapping[str, Any]) -> PlannedView:
    """A :class:`PlannedView` carried in a job's options (``options["view"]``)."""
    return PlannedView(TableName.parse(options["source"]), TableName.parse(options["target"]), str(options["text"]),
                       options.get("comment"), int(options.get("level", 0)), tuple(options.get("depends_on", ())))
