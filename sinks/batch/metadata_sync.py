"""Metadata sync: table and column comments, table properties and Unity Catalog tags.

The planner (:func:`plan_table_metadata`, :func:`tags_sql`) is pure: it compares what the source
and the replica hold and returns the SQL statements that make the replica match, honouring the
overwrite flags (off: only fill what the replica lacks; on: also replace differing values).
Every identifier goes through :func:`~lakemirror.identifiers.quote` and every value through
:func:`~lakemirror.identifiers.sql_string`, so a comment holding quotes, backslashes or
backticks arrives intact.

Properties owned by Delta (``delta.*``), by lakemirror (``lakemirror.*``) and the reserved
ones Spark manages itself (comment, location, provider, owner, …) are never copied.
Tags exist only in Unity Catalog (``ALTER … SET TAGS``, read from ``information_schema``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from lakemirror.identifiers import TableName, quote, sql_string
from lakemirror.sinks.sql import Row, SqlExecutor
from lakemirror.tables import TableLocation

TABLE_COMMENT, COLUMN_COMMENT, TABLE_PROPERTY = "table_comment", "column_comment", "table_property"
CATALOG_TAG, SCHEMA_TAG, TABLE_TAG, COLUMN_TAG, VOLUME_TAG = (
    "catalog_tag", "schema_tag", "table_tag", "column_tag", "volume_tag")
#: The values of ``--uc-object-types``.
OBJECT_TYPES = (TABLE_COMMENT, COLUMN_COMMENT, TABLE_PROPERTY, CATALOG_TAG, SCHEMA_TAG, TABLE_TAG,
                COLUMN_TAG, VOLUME_TAG)
TAG_TYPES = (CATALOG_TAG, SCHEMA_TAG, TABLE_TAG, COLUMN_TAG, VOLUME_TAG)
#: What works on open-source Delta (no tags there).
DEFAULT_OBJECT_TYPES = (TABLE_COMMENT, COLUMN_COMMENT, TABLE_PROPERTY)

_INTERNAL_PREFIXES = ("delta.", "lakemirror.", "spark.sql.", "option.")
_RESERVED = {"comment", "location", "provider", "owner", "external", "is_managed_location", "collation"}


def is_internal_property(key: str) -> bool:
    k = key.lower()
    return k in _RESERVED or k.startswith(_INTERNAL_PREFIXES)


@dataclass(frozen=True)
class Overwrite:
    """Whether values the replica already has are replaced (True) or kept (False)."""

    comments: bool = True
    properties: bool = True
    tags: bool = True


@dataclass(frozen=True)
class TableMetadata:
    comment: str | None = None
    column_comments: Mapping[str, str | None] = field(default_factory=dict)
    properties: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    column_tags: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def _wanted(source: str | None, target: str | None, overwrite: bool) -> bool:
    if source is None or source == target:
        return False
    return overwrite or not target


def _changed_pairs(source: Mapping[str, str], target: Mapping[str, str], overwrite: bool) -> dict[str, str]:
    return {k: v for k, v in source.items() if (k not in target) or (overwrite and target[k] != v)}


def _pairs_sql(pairs: Mapping[str, str]) -> str:
    return ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in sorted(pairs.items()))


def tags_sql(object_sql: str, kind: str, source: Mapping[str, str], target: Mapping[str, str],
             overwrite: bool) -> list[str]:
    """``ALTER <CATALOG|SCHEMA|TABLE|VOLUME> … SET TAGS (…)`` for the tags to copy."""
    keyword = {CATALOG_TAG: "CATALOG", SCHEMA_TAG: "SCHEMA", TABLE_TAG: "TABLE", VOLUME_TAG: "VOLUME"}[kind]
    pairs = _changed_pairs(source, target, overwrite)
    return [f"ALTER {keyword} {object_sql} SET TAGS ({_pairs_sql(pairs)})"] if pairs else []


def plan_table_metadata(target_sql: str, source: TableMetadata, target: TableMetadata,
                        object_types: Iterable[str], overwrite: Overwrite = Overwrite()) -> list[str]:
    """The statements making ``target``'s comments, properties and tags match ``source``'s.

    Columns are matched case-insensitively; a source column the replica lacks is skipped.
    """
    kinds = set(object_types)
    unknown = kinds - set(OBJECT_TYPES)
    if unknown:
        raise ValueError(f"unknown object types {sorted(unknown)}; choose from {', '.join(OBJECT_TYPES)}")
    out: list[str] = []
    target_cols = {c.lower(): c for c in (*target.column_comments, *target.column_tags)}
    if TABLE_COMMENT in kinds and _wanted(source.comment, target.comment, overwrite.comments):
        out.append(f"COMMENT ON TABLE {target_sql} IS {sql_string(source.comment or '')}")
    if COLUMN_COMMENT in kinds:
        for col, comment in source.column_comments.items():
            tcol = target_cols.get(col.lower())
            if tcol is not None and _wanted(comment, target.column_comments.get(tcol), overwrite.comments):
                out.append(f"ALTER TABLE {target_sql} ALTER COLUMN {quote(tcol)} COMMENT {sql_string(comment or '')}")
    if TABLE_PROPERTY in kinds:
        src_props = {k: v for k, v in source.properties.items() if not is_internal_property(k)}
        tgt_props = {k: v for k, v in target.properties.items() if not is_internal_property(k)}
        pairs = _changed_pairs(src_props, tgt_props, overwrite.properties)
        if pairs:
            out.append(f"ALTER TABLE {target_sql} SET TBLPROPERTIES ({_pairs_sql(pairs)})")
    if TABLE_TAG in kinds:
        out += tags_sql(target_sql, TABLE_TAG, source.tags, target.tags, overwrite.tags)
    if COLUMN_TAG in kinds:
        for col, tags in source.column_tags.items():
            tcol = target_cols.get(col.lower())
            if tcol is None:
                continue
            pairs = _changed_pairs(tags, target.column_tags.get(tcol, {}), overwrite.tags)
            if pairs:
                out.append(f"ALTER TABLE {target_sql} ALTER COLUMN {quote(tcol)} SET TAGS ({_pairs_sql(pairs)})")
    return out


def parse_describe_columns(rows: Sequence[Row]) -> dict[str, str | None]:
    """Column comments from ``DESCRIBE TABLE`` rows (stops at the first blank or ``#`` section)."""
    out: dict[str, str | None] = {}
    for r in rows:
        name = (r.get("col_name") or "").strip()
        if not name or name.startswith("#"):
            break
        out[name] = r.get("comment") or None
    return out


def _tag_rows(rows: Sequence[Row], by: str | None = None) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        out.setdefault(r[by] if by else "", {})[r["tag_name"]] = r["tag_value"] if r["tag_value"] is not None else ""
    return out


@dataclass(frozen=True)
class MetadataResult:
    source: str
    replica: str
    statements: tuple[str, ...]

    def details(self) -> dict[str, object]:
        return {"statements": len(self.statements)}


class MetadataSync:
    """Reads metadata with SQL, plans, and applies. ``unity_catalog`` enables tags."""

    def __init__(self, sql: SqlExecutor, *, unity_catalog: bool = False) -> None:
        self.sql = sql
        self.unity_catalog = unity_catalog

    def read(self, loc: TableLocation, kinds: Iterable[str]) -> TableMetadata:
        kinds = set(kinds)
        detail = self.sql.sql(f"DESCRIBE DETAIL {loc.sql}")[0]
        columns = parse_describe_columns(self.sql.sql(f"DESCRIBE TABLE {loc.sql}"))
        tags: dict[str, str] = {}
        column_tags: dict[str, dict[str, str]] = {}
        if self.unity_catalog and kinds & {TABLE_TAG, COLUMN_TAG}:
            n = loc.name
            where = f"schema_name = {sql_string(n.schema)} AND table_name = {sql_string(n.table)}"
            info = f"{quote(n.catalog)}.information_schema"
            if TABLE_TAG in kinds:
                tags = _tag_rows(self.sql.sql(f"SELECT tag_name, tag_value FROM {info}.table_tags WHERE {where}")).get("", {})
            if COLUMN_TAG in kinds:
                column_tags = _tag_rows(self.sql.sql(
                    f"SELECT column_name, tag_name, tag_value FROM {info}.column_tags WHERE {where}"), "column_name")
        return TableMetadata(detail.get("description"), columns, dict(detail.get("properties") or {}), tags, column_tags)

    def sync_table(self, source: TableLocation, target: TableLocation, object_types: Sequence[str],
                   overwrite: Overwrite = Overwrite()) -> MetadataResult:
        kinds = [k for k in object_types if k not in (CATALOG_TAG, SCHEMA_TAG, VOLUME_TAG)]
        if not self.unity_catalog:
            kinds = [k for k in kinds if k not in TAG_TYPES]
        statements = plan_table_metadata(target.sql, self.read(source, kinds), self.read(target, kinds),
                                         kinds, overwrite)
        for s in statements:
            self.sql.sql(s)
        return MetadataResult(str(source.name), str(target.name), tuple(statements))

    def sync_container_tags(self, source: TableName, target: TableName, object_types: Sequence[str],
                            overwrite: Overwrite = Overwrite()) -> list[str]:
        """Catalog, schema and volume tags of the schema holding ``source`` (Unity Catalog only).

        ``source``/``target`` name any table of the schema; only their catalog and schema count.
        """
        if not self.unity_catalog:
            return []
        kinds = set(object_types)
        statements: list[str] = []
        s_info, t_info = (f"{quote(n.catalog)}.information_schema" for n in (source, target))
        if CATALOG_TAG in kinds:
            q = "SELECT tag_name, tag_value FROM {}.catalog_tags WHERE catalog_name = {}"
            src = _tag_rows(self.sql.sql(q.format(s_info, sql_string(source.catalog)))).get("", {})
            tgt = _tag_rows(self.sql.sql(q.format(t_info, sql_string(target.catalog)))).get("", {})
            statements += tags_sql(quote(target.catalog), CATALOG_TAG, src, tgt, overwrite.tags)
        if SCHEMA_TAG in kinds:
            q = "SELECT tag_name, tag_value FROM {}.schema_tags WHERE schema_name = {}"
            src = _tag_rows(self.sql.sql(q.format(s_info, sql_string(source.schema)))).get("", {})
            tgt = _tag_rows(self.sql.sql(q.format(t_info, sql_string(target.schema)))).get("", {})
            statements += tags_sql(f"{quote(target.catalog)}.{quote(target.schema)}", SCHEMA_TAG, src, tgt,
                                   overwrite.tags)
        if VOLUME_TAG in kinds:
            q = "SELECT volume_name, tag_name, tag_value FROM {}.volume_tags WHERE schema_name = {}"
            src_v = _tag_rows(self.sql.sql(q.format(s_info, sql_string(source.schema))), "volume_name")
            tgt_v = _tag_rows(self.sql.sql(q.format(t_info, sql_string(target.schema))), "volume_name")
            for volume, tags in sorted(src_v.items()):
                name = f"{quote(target.catalog)}.{quote(target.schema)}.{quote(volume)}"
                statements += tags_sql(name, VOLUME_TAG, tags, tgt_v.get(volume, {}), overwrite.tags)
        for s in statements:
            self.sql.sql(s)
        return statements
