"""Unity Catalog tags copied across metastores, through databricks-sdk's ``entity_tag_assignments``.

A catalog made from a Delta share carries no tags, and the source's ``information_schema`` lives in
another metastore: so when the tables are read from a shared catalog, the ``metadata`` operation's tag
kinds (catalog, schema, table, column and volume tags) are read from the source workspace's API
(``entity_tag_assignments.list``) under the source's own names, and written to the target workspace
(``create`` for a key the target lacks, ``update`` with ``update_mask=tag_value`` for a differing value
when ``overwrite_tags``) under the target's names. Tags are only added or changed, never removed; tags
assigned by the system (data classification) are left to the target's own classification.

:func:`plan_tags` is pure. :class:`SdkTags` copies one entity's tags at a time; a failure of one entity
is recorded and the others go on (:meth:`SdkTags.sync_table` raises at the end, naming every entity
that failed, so the table's audit row says so and the batch runner retries it). An entity the target
does not have is skipped and reported when it is a volume (volumes are replicated only when configured)
or a column the replica lacks; a missing catalog, schema or table fails, named.
:class:`CrossMetastoreMetadata` is the ``metadata`` operation of such a run: the base operation does
comments and properties, this module the tags.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from lakemirror.errors import TerminalError, TransientError
from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.metadata_sync import (CATALOG_TAG, COLUMN_TAG, SCHEMA_TAG, TABLE_TAG, TAG_TYPES,
                                                  VOLUME_TAG)
from lakemirror.sinks.batch.sharing import _absent as _absent_with, _sdk as _sdk_with

#: What a permission error tells the principal it needs.
TAG_NEEDS = ("USE_CATALOG and USE_SCHEMA on the parents and APPLY_TAG on each object (and ASSIGN on the "
             "tag policy of a governed tag)")

T = TypeVar("T")


def _sdk(what: str, call: Callable[[], T]) -> T:
    return _sdk_with(what, call, TAG_NEEDS)


def _absent(what: str, call: Callable[[], T]) -> T | None:
    return _absent_with(what, call, TAG_NEEDS)


if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient

    from lakemirror.sinks.batch.operations import BatchJob, Operations

#: ``entity_type`` of the API per tag kind.
ENTITY_TYPES = {CATALOG_TAG: "catalogs", SCHEMA_TAG: "schemas", TABLE_TAG: "tables", COLUMN_TAG: "columns",
                VOLUME_TAG: "volumes"}


@dataclass(frozen=True)
class TagPlan:
    create: tuple[tuple[str, str | None], ...] = ()
    update: tuple[tuple[str, str | None], ...] = ()


def plan_tags(source: Mapping[str, str | None], target: Mapping[str, str | None], overwrite: bool) -> TagPlan:
    """The tags to create on the target and (with ``overwrite``) the values to change. Pure."""
    create = tuple(sorted((k, v) for k, v in source.items() if k not in target))
    update = tuple(sorted((k, v) for k, v in source.items() if k in target and overwrite and (target[k] or None) != (v or None)))
    return TagPlan(create, update)


class TagsFailed(TransientError):
    """Some entities' tags could not be copied (each named); the others were. Retried: at least one
    failure may pass on a later attempt."""

    code = "tags_failed"

    def __init__(self, message: str, *, table: str, details: Mapping[str, Any]) -> None:
        super().__init__(message, table=table)
        self.details = dict(details)


class TagsRefused(TerminalError):
    """Every failure was terminal (a permission, an invalid tag): retrying will not help."""

    code = "tags_failed"

    def __init__(self, message: str, *, table: str, details: Mapping[str, Any]) -> None:
        super().__init__(message, table=table)
        self.details = dict(details)


def _user_tags(assignments: Sequence[Any]) -> dict[str, str | None]:
    return {str(a.tag_key): a.tag_value for a in assignments if a.source_type is None}


class SdkTags:
    """Copies tags from the ``source`` workspace to the ``target`` one (see the module docstring)."""

    def __init__(self, source: "WorkspaceClient", target: "WorkspaceClient") -> None:
        self.source = source
        self.target = target

    def _read(self, client: "WorkspaceClient", entity_type: str, name: str) -> dict[str, str | None] | None:
        found = _absent(f"tags of {entity_type} {name}",
                        lambda: list(client.entity_tag_assignments.list(entity_type, name)))
        return None if found is None else _user_tags(found)

    def copy(self, entity_type: str, source_name: str, target_name: str, overwrite: bool) -> dict[str, Any]:
        """One entity's tags: ``{"entity", "created", "updated"}``, or ``"skipped"`` with the reason."""
        from databricks.sdk.service.catalog import EntityTagAssignment

        source = self._read(self.source, entity_type, source_name)
        if source is None:
            return {"entity": f"{entity_type} {target_name}", "skipped": f"the source has no {entity_type} {source_name}"}
        target = self._read(self.target, entity_type, target_name) if source else {}
        if target is None and entity_type == "volumes":  # volumes are replicated only when configured
            return {"entity": f"{entity_type} {target_name}", "skipped": "the target does not have it"}
        if target is None:
            raise TerminalError(f"{entity_type} {target_name} is not on the target: its tags are copied once it "
                                f"is replicated there")
        plan = plan_tags(source, target, overwrite)

        def assignment(key: str, value: str | None) -> EntityTagAssignment:
            return EntityTagAssignment(entity_name=target_name, tag_key=key, entity_type=entity_type, tag_value=value)

        def update(key: str, value: str | None) -> None:
            self.target.entity_tag_assignments.update(entity_type, target_name, key, assignment(key, value),
                                                      update_mask="tag_value")

        def create(key: str, value: str | None) -> str:
            from databricks.sdk.errors import ResourceConflict

            try:
                self.target.entity_tag_assignments.create(assignment(key, value))
                return "created"
            except ResourceConflict:  # assigned meanwhile: by the job of another table of the schema, or by hand
                current = self.target.entity_tag_assignments.get(entity_type, target_name, key)
                if overwrite and (current.tag_value or None) != (value or None):
                    update(key, value)
                    return "updated"
                return "unchanged"

        done: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": []}
        for key, value in plan.create:
            done[_sdk(f"tag {key} of {entity_type} {target_name}", lambda: create(key, value))].append(key)
        for key, value in plan.update:
            _sdk(f"tag {key} of {entity_type} {target_name}", lambda: update(key, value))
            done["updated"].append(key)
        return {"entity": f"{entity_type} {target_name}", "created": done["created"], "updated": done["updated"]}

    def _columns(self, client: "WorkspaceClient", full_name: str) -> list[str]:
        info = _absent(f"table {full_name}", lambda: client.tables.get(full_name))
        return [str(c.name) for c in (info.columns or []) if c.name] if info is not None else []

    def entities(self, source: TableName, target: TableName, kinds: Sequence[str]) -> list[tuple[str, str, str]]:
        """``(entity_type, source name, target name)`` of every entity whose tags ``kinds`` select."""
        out: list[tuple[str, str, str]] = []
        if CATALOG_TAG in kinds:
            out.append(("catalogs", source.catalog, target.catalog))
        if SCHEMA_TAG in kinds:
            out.append(("schemas", f"{source.catalog}.{source.schema}", f"{target.catalog}.{target.schema}"))
        if TABLE_TAG in kinds:
            out.append(("tables", str(source), str(target)))
        if COLUMN_TAG in kinds:
            target_columns = {c.lower(): c for c in self._columns(self.target, str(target))}
            for column in self._columns(self.source, str(source)):
                if column.lower() in target_columns:
                    out.append(("columns", f"{source}.{column}", f"{target}.{target_columns[column.lower()]}"))
        if VOLUME_TAG in kinds:
            volumes = _sdk(f"volumes of {source.catalog}.{source.schema}",
                           lambda: list(self.source.volumes.list(source.catalog, source.schema)))
            out += [("volumes", f"{source.catalog}.{source.schema}.{v.name}", f"{target.catalog}.{target.schema}.{v.name}")
                    for v in sorted(volumes, key=lambda v: str(v.name))]
        return out

    def sync_table(self, source: TableName, target: TableName, kinds: Sequence[str], overwrite: bool) -> dict[str, Any]:
        """The tags ``kinds`` select of a table and of the catalog, schema and volumes holding it;
        raises :class:`TagsFailed` after trying them all when any failed."""
        done: list[dict[str, Any]] = []
        failed: list[str] = []
        transient = False
        for entity_type, src, dst in self.entities(source, target, kinds):
            try:
                done.append(self.copy(entity_type, src, dst, overwrite))
            except (TerminalError, TransientError) as exc:
                failed.append(f"{entity_type} {dst}: {exc}")
                transient = transient or isinstance(exc, TransientError)
        details = {"tags_created": sorted(f"{d['entity']}: {k}" for d in done for k in d.get("created", ())),
                   "tags_updated": sorted(f"{d['entity']}: {k}" for d in done for k in d.get("updated", ())),
                   "tags_skipped": sorted(f"{d['entity']} ({d['skipped']})" for d in done if "skipped" in d)}
        if failed:
            kind = TagsFailed if transient else TagsRefused
            raise kind(f"the tags of {len(failed)} object(s) were not copied (the others were): {'; '.join(failed)}",
                       table=str(source), details={**details, "tags_failed": failed})
        return details


class CrossMetastoreMetadata:
    """The ``metadata`` operation when tables are read from shared catalogs: comments and properties by
    ``base`` (from the shared table, which carries them), tags through :class:`SdkTags` from the source
    workspace under the source's names (``original`` maps a shared catalog back to its source catalog)."""

    def __init__(self, base: "Operations", tags: Callable[[], SdkTags], original: Mapping[str, str]) -> None:
        self.base = base
        self._make = tags
        self._tags: SdkTags | None = None
        self.original = dict(original)

    @property
    def tags(self) -> SdkTags:
        if self._tags is None:
            self._tags = self._make()
        return self._tags

    def run(self, operation: str, job: "BatchJob", tag: str) -> Mapping[str, Any]:
        opts = dict(job.settings.options.get("metadata", {}))
        kinds = list(opts.get("object_types", ()))
        tag_kinds = [k for k in kinds if k in TAG_TYPES]
        other = [k for k in kinds if k not in TAG_TYPES]
        out: dict[str, Any] = {}
        if other or not tag_kinds:
            settings = replace(job.settings, options={**job.settings.options,  # type: ignore[type-var]
                                                      "metadata": {**opts, "object_types": other}})
            out.update(self.base.run(operation, replace(job, settings=settings), tag))  # type: ignore[type-var]
        if tag_kinds:
            source = TableName(self.original.get(job.source.catalog, job.source.catalog), job.source.schema,
                               job.source.table)
            out.update(self.tags.sync_table(source, job.target, tag_kinds, bool(opts.get("overwrite_tags", True))))
        return out

    def cancel(self, tag: str) -> None:
        self.base.cancel(tag)
