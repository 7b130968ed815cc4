"""The ``uc_objects`` operation of ``lakemirror replicate`` as jobs in phases: what each Unity Catalog
object needs must exist before it (credentials, then external locations, catalogs, schemas, volumes;
after the tables, views level by level and the tables' grants). Each object is a job of its own: one
audit row per object and attempt, retried with the catalog's backoff, one failure never stopping the
others (a view whose dependency failed fails in turn, naming it)."""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import replace
from typing import Any, Callable, Sequence

from lakemirror.daemon.settings.replicate import CatalogEntry, ReplicateConfig
from lakemirror.daemon.settings.runtime_spec import level_task_settings, shared_catalogs
from lakemirror.identifiers import TableName, quote
from lakemirror.sinks.batch.uc_names import NameMap
from lakemirror.sinks.batch.uc_objects import UC_OPERATIONS, UcMaps
from lakemirror.supervisor.subtasks.batch_runner import UC_OBJECTS, TableJob


log = logging.getLogger(__name__)


def uc_catalogs(cfg: ReplicateConfig) -> list[CatalogEntry]:
    return [c for c in cfg.selected_catalogs() if UC_OBJECTS in cfg.resolve(c).operations]


def uc_maps(cfg: ReplicateConfig) -> UcMaps:
    u = cfg.uc_objects
    return UcMaps(catalogs={c.name: c.target_catalog for c in cfg.catalogs},
                  schemas={(c.name, s.name): (c.target_catalog, s.target_schema) for c in cfg.catalogs
                           for s in c.schemas if s.target_schema},
                  principals=dict(u.principals), unmapped_principals=u.unmapped_principals,
                  location_urls=dict(u.location_urls), storage_credentials=dict(u.storage_credentials),
                  revoke_extra=u.revoke_extra)


def name_map(cfg: ReplicateConfig) -> NameMap:
    m = uc_maps(cfg)
    return NameMap(catalogs=m.catalogs, schemas=m.schemas)


def _selected(cfg: ReplicateConfig, c: CatalogEntry) -> Callable[[str], bool]:
    include = cfg.cli.target_schemas if cfg.cli.target_schemas is not None else c.include_schemas

    def ok(schema: str) -> bool:
        if schema == "information_schema" or any(fnmatch.fnmatchcase(schema, p) for p in c.exclude_schemas):
            return False
        return include is None or any(fnmatch.fnmatchcase(schema, p) for p in include)
    return ok


def _job(cfg: ReplicateConfig, c: CatalogEntry | None, kind: str, source: TableName, target: TableName,
         options: dict[str, Any], schema: str | None = None) -> TableJob:
    base = level_task_settings(cfg, c or cfg.catalogs[0], schema)
    return TableJob(source, target, replace(base, operations=(UC_OPERATIONS[kind],),
                                            options={**base.options, **options}), object_type=kind)


def early_phases(cfg: ReplicateConfig, source: Any) -> list[list[TableJob]]:
    """Credentials, external locations, catalogs, schemas, volumes: one phase each. ``source`` is the
    source workspace's client (only listed when an object type needs it)."""
    kinds = set(cfg.uc_objects.object_types)
    catalogs = uc_catalogs(cfg)
    if not catalogs:
        return []
    maps = uc_maps(cfg)
    phases: list[list[TableJob]] = []
    locations = list(cfg.uc_objects.external_locations) if "external_location" in kinds else []
    if "storage_credential" in kinds and cfg.uc_objects.external_locations:
        from lakemirror.sinks.batch.uc_objects import _sdk

        def credential_of(name: str) -> str:
            return str(_sdk(f"external location {name}", lambda: source.external_locations.get(name)).credential_name)

        found = set()
        for n in cfg.uc_objects.external_locations:
            try:
                found.add(credential_of(n))
            except Exception:  # noqa: BLE001 — the location's own job reads it again and fails naming it
                log.warning("the credential of external location %s could not be read; its job reports why", n)
        credentials = sorted(found)
        phases.append([_job(cfg, None, "storage_credential", TableName("*", "*", n),
                            TableName("*", "*", maps.storage_credentials.get(n, n)), {"uc": {"name": n}})
                       for n in credentials])
    if locations:
        phases.append([_job(cfg, None, "external_location", TableName("*", "*", n), TableName("*", "*", n),
                            {"uc": {"name": n}}) for n in locations])
    if "catalog" in kinds:
        phases.append([_job(cfg, c, "catalog", TableName(c.name, "*", c.name),
                            TableName(c.target_catalog, "*", c.target_catalog), {"uc": {"name": c.name}})
                       for c in catalogs])
    schemas: list[tuple[CatalogEntry, str]] = []
    unread: list[TableJob] = []  # failed jobs of what could not be listed
    if kinds & {"schema", "volume"}:
        from lakemirror.sinks.batch.sharing import schemas_of

        for c in catalogs:
            try:
                schemas += [(c, s) for s in schemas_of(source, c.name, _selected(cfg, c))]
            except Exception as exc:  # noqa: BLE001 — the catalog's failed job says why; the others go on
                kind = "schema" if "schema" in kinds else "volume"
                unread.append(_unread(cfg, c, kind, "*", f"the schemas of catalog {c.name} could not be listed",
                                      exc))
    if "schema" in kinds:
        def schema_job(c: CatalogEntry, s: str) -> TableJob:
            target_catalog, target_schema = maps.full_name(f"{c.name}.{s}").split(".", 1)
            return _job(cfg, c, "schema", TableName(c.name, s, s), TableName(target_catalog, target_schema, target_schema),
                        {"uc": {"name": f"{c.name}.{s}"}}, s)

        phases.append([schema_job(c, s) for c, s in schemas] + [j for j in unread if j.object_type == "schema"])
    if "volume" in kinds:
        from lakemirror.sinks.batch.uc_objects import _sdk

        def volumes_of(catalog: str, schema: str) -> list[Any]:
            return list(_sdk(f"volumes of {catalog}.{schema}", lambda: list(source.volumes.list(catalog, schema))))

        jobs = [j for j in unread if j.object_type == "volume"]
        for c, s in schemas:
            try:
                volumes = volumes_of(c.name, s)
            except Exception as exc:  # noqa: BLE001 — the schema's failed volume job says why
                jobs.append(_unread(cfg, c, "volume", s, f"the volumes of {c.name}.{s} could not be listed", exc))
                continue
            for v in volumes:
                full = f"{c.name}.{s}.{v.name}"
                jobs.append(_job(cfg, c, "volume", TableName.parse(full), TableName.parse(maps.full_name(full)),
                                 {"uc": {"name": full}}, s))
        phases.append(jobs)
    return [p for p in phases if p]


def _unread(cfg: ReplicateConfig, c: CatalogEntry, kind: str, schema: str, what: str, exc: BaseException) -> TableJob:
    """A job that fails with ``what`` and the error's cause: the audit row of what could not be listed."""
    from lakemirror.supervisor.control.classify_errors import classify

    target = uc_maps(cfg).full_name(f"{c.name}.{schema}").split(".", 1) if schema != "*" else [c.target_catalog, "*"]
    return _job(cfg, c, kind, TableName(c.name, schema, "*"), TableName(target[0], target[1], "*"),
                {"uc": {"name": f"{c.name}.{schema}", "listing_error": f"{what}: {classify(exc).message}"}},
                None if schema == "*" else schema)


def late_phases(cfg: ReplicateConfig, read_views: Callable[[str, str], Sequence[Any]],
                list_schemas: Callable[[CatalogEntry], Sequence[str]], tables: Sequence[TableJob]) -> list[list[TableJob]]:
    """Views level by level (each job carries its rewritten definition), and the replicated tables' grants."""
    from lakemirror.sinks.batch.uc_views import plan_views

    kinds = set(cfg.uc_objects.object_types)
    catalogs = uc_catalogs(cfg)
    if not catalogs:
        return []
    phases: list[list[TableJob]] = []
    if "view" in kinds:
        views, unread = _read_all_views(cfg, catalogs, read_views, list_schemas)
        entries = {c.name: c for c in catalogs}
        by_level: dict[int, list[TableJob]] = {}
        maps = uc_maps(cfg)
        for c, s, error in unread:  # one failed job per catalog or schema whose views could not be read
            target = maps.full_name(f"{c.name}.{s}").split(".", 1) if s != "*" else [c.target_catalog, "*"]
            by_level.setdefault(0, []).append(_job(cfg, c, "view", TableName(c.name, s, "*"),
                                                   TableName(target[0], target[1], "*"),
                                                   {"uc": {"name": f"{c.name}.{s}", "listing_error": error}},
                                                   None if s == "*" else s))
        for p in plan_views(views, name_map(cfg)):
            c = entries[p.source.catalog]
            options = {"view": {"source": str(p.source), "target": str(p.target), "text": p.text,
                                "comment": p.comment, "level": p.level, "depends_on": list(p.depends_on),
                                "grants": "table_grants" in kinds}}
            by_level.setdefault(p.level, []).append(_job(cfg, c, "view", p.source, p.target, options, p.source.schema))
        phases += [by_level[k] for k in sorted(by_level)]
    if "table_grants" in kinds:
        original = {v: k for k, v in shared_catalogs(cfg).items()}
        names = {c.name for c in catalogs}
        jobs = []
        for t in tables:
            if t.object_type != "table":
                continue
            src = TableName(original.get(t.source.catalog, t.source.catalog), t.source.schema, t.source.table)
            if src.catalog in names:
                jobs.append(_job(cfg, next(c for c in catalogs if c.name == src.catalog), "table_grants", src,
                                 t.target, {"uc": {"name": str(src)}}, src.schema))
        phases.append(jobs)
    return [p for p in phases if p]


def _read_all_views(cfg: ReplicateConfig, catalogs: Sequence[CatalogEntry], read_views: Callable[[str, str], Sequence[Any]],
                    list_schemas: Callable[[CatalogEntry], Sequence[str]]
                    ) -> tuple[list[Any], list[tuple[CatalogEntry, str, str]]]:
    """The views of every selected schema, and ``(catalog, schema or "*", error)`` of those whose views
    (or whose catalog's schemas) could not be read: one failure never stops the others."""
    from lakemirror.supervisor.control.classify_errors import classify

    views: list[Any] = []
    unread: list[tuple[CatalogEntry, str, str]] = []
    for c in catalogs:
        try:
            schemas = [s for s in list_schemas(c) if _selected(cfg, c)(s)]
        except Exception as exc:  # noqa: BLE001 — reported as the catalog's failed view job
            unread.append((c, "*", f"the schemas of catalog {c.name} could not be listed: {classify(exc).message}"))
            continue
        for s in schemas:
            try:
                views += read_views(c.name, s)
            except Exception as exc:  # noqa: BLE001 — reported as the schema's failed view job
                unread.append((c, s, f"the views of {c.name}.{s} could not be read: {classify(exc).message}"))
    return views, unread


def spark_schemas(sql: Any) -> Callable[[CatalogEntry], list[str]]:
    """A catalog's schemas by SQL (``SHOW SCHEMAS``): Spark's catalog or Unity Catalog."""
    def schemas(c: CatalogEntry) -> list[str]:
        return sorted(str(next(iter(r.values()))) for r in sql.sql(f"SHOW SCHEMAS IN {quote(c.name)}"))
    return schemas
