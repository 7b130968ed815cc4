"""Configuration of ``lakemirror replicate``: batch clone, reconciliation and metadata sync.

Hierarchical, as in the Data Replication System for Databricks: the settings of
:class:`ObjectSettings` may be written at the file's top level, in a catalog entry, a schema entry
or a table entry; each level inherits its parent's values and may override them. Mappings
(``retry``, ``reconcile``, ``metadata``, ``clone``) merge key by key; lists replace. Command-line
flags override every level. So, for one table, the most specific wins:

    CLI flags  >  table  >  schema  >  catalog  >  file top level  >  built-in defaults

Example::

    max_workers: 4
    retry: {max_attempts: 3}
    operations: [clone, reconcile]
    catalogs:
      - name: prod                     # source catalog
        target_catalog: dr_prod
        exclude_schemas: [scratch*]    # shell-style patterns
        reconcile: {buckets: 256}
        schemas:
          - name: sales
            include_tables: [orders, order_items]
            retry: {max_attempts: 5}   # merges: base delays stay inherited
            tables:
              - name: order_items
                keys: [order_id, line_no]

Validated once, at load: every level is resolved with its parents, so a bad value anywhere is
reported with its location before anything runs (``--validate-only`` exits 2 listing them).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lakemirror.daemon.settings import limits, paths
from lakemirror.daemon.settings.pipeline import RuntimeSettings, read_yaml
from lakemirror.errors import ConfigError
from lakemirror.daemon.settings.task_options import CloneOptions, MetadataSettings, ReconcileSettings, RetrySettings
from lakemirror.daemon.settings.volumes import VolumeEntry, VolumeFilesSettings
from lakemirror.daemon.settings.workspaces import (
    SDK_OBJECT_TYPES, BackupSettings, DeltaSharingSettings, UcObjectsSettings, WorkspacesSettings,
)

Operation = Literal["clone", "reconcile", "metadata", "incremental", "volume_files", "backup", "uc_objects"]
OPERATIONS: tuple[str, ...] = ("clone", "reconcile", "metadata", "incremental", "volume_files", "backup",
                               "uc_objects")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ObjectSettings(Strict):
    """Settings of one object (table), after inheritance. Any level may set any of these."""

    operations: list[Operation] = Field(default_factory=lambda: list[Operation](["clone"]),
                                        description="Operations run, in this order, per table.")
    timeout_seconds: float = Field(3600.0, gt=0, le=limits.YEAR, description="Per object and attempt.")
    keys: list[str] = Field(default_factory=list, description="Key columns; empty = inferred.")
    retry: RetrySettings = Field(default_factory=RetrySettings)
    clone: CloneOptions = Field(default_factory=CloneOptions)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    metadata: MetadataSettings = Field(default_factory=MetadataSettings)
    volume_files: VolumeFilesSettings = Field(default_factory=VolumeFilesSettings)

    @field_validator("keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        for column in v:
            if not column or "\x00" in column:
                raise ValueError("key column names cannot be empty or contain NUL")
            limits.name(column, "a key column name")
        return v


TUNABLE = frozenset(ObjectSettings.model_fields)


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge recursively, anything else (lists too) replaces."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else copy.deepcopy(v)
    return out


class _Level(Strict):
    """A level of the hierarchy: its structural fields, plus ``level_settings`` (what it overrides)."""

    level_settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if isinstance(data, dict) and "level_settings" not in data:
            data = dict(data)
            data["level_settings"] = {k: data.pop(k) for k in list(data) if k in TUNABLE}
        return data


_BAD_NAME = re.compile(r"[\x00-\x1f/`.]")


def _check_name(value: str, what: str) -> str:
    limits.name(value, what)
    if not value or not value.strip() or _BAD_NAME.search(value):
        raise ValueError(f"{what} {value!r} must be non-empty without '.', '/', '`' or control characters")
    return value


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _names(v: list[str] | None) -> list[str] | None:
    if v is not None:
        for n in v:
            if not n or "\x00" in n:
                raise ValueError("names and patterns cannot be empty")
            limits.name(n, "a name or pattern")
    return v


class TableEntry(_Level):
    name: str

    @field_validator("name")
    @classmethod
    def _n(cls, v: str) -> str:
        return _check_name(v, "table name")


class SchemaEntry(_Level):
    name: str
    target_schema: str | None = Field(None, description="Schema of the replicas (default: same name).")
    include_tables: list[str] | None = Field(None, description="Tables (patterns) replicated; default all.")
    exclude_tables: list[str] = Field(default_factory=list, description="Tables (patterns) never replicated.")
    tables: list[TableEntry] = Field(default_factory=list, description="Per-table overrides.")

    @field_validator("include_tables", "exclude_tables")
    @classmethod
    def _patterns(cls, v: list[str] | None) -> list[str] | None:
        return _names(v)

    @field_validator("name", "target_schema")
    @classmethod
    def _n(cls, v: str | None) -> str | None:
        return None if v is None else _check_name(v, "schema name")


class CatalogEntry(_Level):
    name: str = Field(description="The source catalog.")
    target_catalog: str = Field(description="The catalog of the replicas.")
    include_schemas: list[str] | None = Field(None, description="Schemas (patterns) replicated; default all.")
    exclude_schemas: list[str] = Field(default_factory=lambda: ["information_schema"],
                                       description="Schemas (patterns) never replicated.")
    schemas: list[SchemaEntry] = Field(default_factory=list, description="Per-schema overrides.")

    @field_validator("include_schemas", "exclude_schemas")
    @classmethod
    def _patterns(cls, v: list[str] | None) -> list[str] | None:
        return _names(v)

    @field_validator("name", "target_catalog")
    @classmethod
    def _n(cls, v: str) -> str:
        return _check_name(v, "catalog name")


class ExecutionLogSettings(Strict):
    """Where and how each run's detailed execution log is written (lakemirror.daemon.execution_log)."""

    folder: str = Field(description="Local directory (a volume's /Volumes/... path on Databricks) of the files.")
    formats: list[Literal["json", "text"]] = Field(default_factory=lambda: list[Literal["json", "text"]](
                                                       ["json", "text"]), min_length=1,
                                                   description="json: one JSON object a line (.jsonl); text: .log.")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "DEBUG", description="Lowest level written (DEBUG: every SQL statement too), whatever the console shows.")

    @field_validator("folder")
    @classmethod
    def _folder(cls, v: str) -> str:
        limits.path(v, "execution_log.folder")
        if not v.strip() or "://" in v or "\x00" in v:
            raise ValueError("a local directory path (not a URI)")
        return v


class CliOverrides(Strict):
    """What the command line says; it wins over every level of the file."""

    target_catalog: str | None = None
    target_schemas: list[str] | None = None
    operations: list[Operation] | None = None
    uc_object_types: list[str] | None = None

    @field_validator("uc_object_types")
    @classmethod
    def _types(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else MetadataSettings._types(v)

    @field_validator("target_catalog")
    @classmethod
    def _catalog(cls, v: str | None) -> str | None:
        return None if v is None else _check_name(v, "--target-catalog")

    @field_validator("target_schemas")
    @classmethod
    def _schemas(cls, v: list[str] | None) -> list[str] | None:
        for schema in v or []:
            _check_name(schema, "a schema of --target-schemas")
        return v

    def as_settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.operations:
            out["operations"] = list(self.operations)
        if self.uc_object_types:
            out["metadata"] = {"object_types": list(self.uc_object_types)}
        return out


class ReplicateConfig(_Level):
    """The whole file. Top-level :class:`ObjectSettings` fields are defaults for every catalog."""

    catalogs: list[CatalogEntry] = Field(min_length=1, description="Source catalogs and their targets.")
    max_workers: int = Field(4, ge=1, le=256, description="Objects processed at once.")
    audit_catalog: str | None = Field(None, description="Catalog of the audit and reconciliation tables "
                                                        "(default: the first target catalog).")
    audit_table: str | None = Field(None, description="Default <audit_catalog>.continuous_sync.audit_log.")
    reconciliation_table: str | None = Field(
        None, description="Default <audit_catalog>.continuous_sync.reconciliation.")
    checkpoint_volume: str | None = Field(
        None, description="Root of the incremental sweeps' checkpoints and state (needed by `incremental`).")
    workspaces: WorkspacesSettings = Field(default_factory=WorkspacesSettings, description="The source and target "
                                           "workspaces (databricks-sdk) of Delta Sharing, backup and UC objects.")
    delta_sharing: DeltaSharingSettings | None = Field(None, description="Replicate across metastores through Delta "
                                                       "Sharing: set-up made or checked first, tables read from the "
                                                       "shared catalogs.")
    uc_objects: UcObjectsSettings = Field(default_factory=UcObjectsSettings, description="The uc_objects operation: "
                                          "Unity Catalog objects and grants.")
    backup: BackupSettings = Field(default_factory=BackupSettings, description="The backup operation's catalog and "
                                   "share (run in the source workspace).")
    execution_log: ExecutionLogSettings | None = Field(
        None, description="Write each run's detailed log as files (JSON lines and/or text), the run id on every line.")
    volumes: list[VolumeEntry] = Field(default_factory=list, description="Directories copied by the "
                                       "volume_files operation, beyond the volumes of the catalogs.")
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    cli: CliOverrides = Field(default_factory=CliOverrides)

    @field_validator("audit_catalog")
    @classmethod
    def _audit_catalog(cls, v: str | None) -> str | None:
        return None if v is None else _check_name(v, "audit_catalog")

    @field_validator("audit_table", "reconciliation_table")
    @classmethod
    def _full_names(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else limits.table_name(v, str(info.field_name))

    @field_validator("checkpoint_volume")
    @classmethod
    def _checkpoint_volume(cls, v: str | None) -> str | None:
        return None if v is None else paths.directory_value(v, "checkpoint_volume")

    @model_validator(mode="after")
    def _check(self) -> "ReplicateConfig":
        targets = [str(v.target_name) for v in self.volumes]
        repeated = sorted({t for t in targets if targets.count(t) > 1})
        if repeated:
            raise ValueError(f"volumes: the names {repeated} repeat; each copy needs a name of its own "
                             f"(it names the copy's manifest)")
        if self.delta_sharing is not None and self.runtime.mode != "databricks":
            raise ValueError("delta_sharing: the shared catalogs are read in a Databricks workspace; set runtime.mode: "
                             "databricks (and run where the target workspace's Spark is)")
        names = [c.name for c in self.catalogs]
        pairs = [(c.name, c.target_catalog) for c in self.catalogs]
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"catalog entries repeat: {names}")
        from lakemirror.identifiers import TableName

        for t in (self.audit_table, self.reconciliation_table):
            if t is not None:
                TableName.parse(t)
        if self.cli.target_catalog and not any(c.target_catalog == self.cli.target_catalog for c in self.catalogs):
            raise ValueError(f"--target-catalog {self.cli.target_catalog}: no catalog entry targets it "
                             f"(targets: {', '.join(c.target_catalog for c in self.catalogs)})")
        return self

    # -- derived ----------------------------------------------------------------------------

    def runs_uc_objects(self) -> bool:
        """Whether some selected catalog's operations include uc_objects."""
        return any("uc_objects" in self.resolve(c).operations for c in self.selected_catalogs())

    def runs_volumes(self) -> bool:
        """Whether the ``volumes`` entries are copied: always, unless ``--operation`` leaves out volume_files."""
        return bool(self.volumes) and (not self.cli.operations or "volume_files" in self.cli.operations)

    def volume_settings(self, entry: VolumeEntry) -> ObjectSettings:
        """A ``volumes`` entry's settings: the file's top level, its own ``volume_files`` on top, CLI last."""
        own = {"volume_files": entry.volume_files.model_dump(exclude_unset=True)} if entry.volume_files else {}
        return ObjectSettings.model_validate(deep_merge(deep_merge(dict(self.level_settings), own),
                                                        self.cli.as_settings()))

    def selected_catalogs(self) -> list[CatalogEntry]:
        want = self.cli.target_catalog
        return [c for c in self.catalogs if want is None or c.target_catalog == want]

    @property
    def effective_audit_catalog(self) -> str:
        return self.audit_catalog or self.catalogs[0].target_catalog

    @property
    def effective_audit_table(self) -> str:
        return self.audit_table or f"{self.effective_audit_catalog}.continuous_sync.audit_log"

    @property
    def effective_reconciliation_table(self) -> str:
        return self.reconciliation_table or f"{self.effective_audit_catalog}.continuous_sync.reconciliation"

    def resolve(self, catalog: CatalogEntry | None = None, schema: SchemaEntry | None = None,
                table: TableEntry | None = None) -> ObjectSettings:
        """The settings of one object: defaults < top < catalog < schema < table < CLI."""
        merged: dict[str, Any] = dict(self.level_settings)
        for level in (catalog, schema, table):
            if level is not None:
                merged = deep_merge(merged, level.level_settings)
        return ObjectSettings.model_validate(deep_merge(merged, self.cli.as_settings()))

    def levels(self) -> list[tuple[str, CatalogEntry | None, SchemaEntry | None, TableEntry | None]]:
        """Every level written in the file, with its location (for validation)."""
        out: list[tuple[str, CatalogEntry | None, SchemaEntry | None, TableEntry | None]] = [("(top level)", None, None, None)]
        for i, c in enumerate(self.catalogs):
            out.append((f"catalogs[{i}]", c, None, None))
            for j, s in enumerate(c.schemas):
                out.append((f"catalogs[{i}].schemas[{j}]", c, s, None))
                for k, t in enumerate(s.tables):
                    out.append((f"catalogs[{i}].schemas[{j}].tables[{k}]", c, s, t))
        return out


def _problems(errors: Sequence[Any], prefix: str, origin: str) -> list[tuple[str, str]]:
    out = []
    for err in errors:
        loc = tuple(p for p in err["loc"] if p != "level_settings")
        where = ".".join(x for x in (prefix if prefix != "(top level)" else "", _loc(loc)) if x and x != "(top level)")
        msg = {"extra_forbidden": "unknown setting (check the spelling)",
               "missing": "required setting is missing"}.get(err["type"], err["msg"])
        out.append((f"{origin}: {where or '(top level)'}", msg))
    return out


def load_replicate_config(path: str | Path | None, cli: CliOverrides | None = None,
                          data: Mapping[str, Any] | None = None) -> ReplicateConfig:
    """Load, validate every level with its parents, apply CLI flags; raise :class:`ConfigError`."""
    raw = dict(data) if data is not None else read_yaml(path, ReplicateConfig.model_fields) if path is not None else {}
    origin = str(path) if path is not None else "settings"
    if cli is not None:
        raw["cli"] = cli.model_dump()
    try:
        cfg = ReplicateConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_problems(exc.errors(include_url=False), "", origin)) from None
    problems: list[tuple[str, str]] = []
    seen: set[tuple[Any, ...]] = set()  # an inherited problem is reported once, where it is written
    for where, c, s, t in cfg.levels():
        try:
            cfg.resolve(c, s, t)
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                ident = (tuple(err["loc"]), err["msg"])
                if ident not in seen:
                    seen.add(ident)
                    problems += _problems([err], where, origin)
    if not problems and cfg.runtime.mode != "databricks":
        for where, c, s, t in cfg.levels():
            if "backup" in cfg.resolve(c, s, t).operations:
                problems.append((f"{origin}: {where}: operations",
                                 "operation backup deep clones Streaming Tables and shares schemas in a Databricks "
                                 "workspace: set runtime.mode: databricks (and run it in the source workspace)"))
                break
    if not problems and cfg.runtime.mode != "databricks" and cfg.runs_uc_objects():
        sdk_kinds = [k for k in cfg.uc_objects.object_types if k in SDK_OBJECT_TYPES]
        if sdk_kinds:
            problems.append((f"{origin}: uc_objects.object_types", f"{', '.join(sdk_kinds)} live in Unity Catalog: "
                             f"set runtime.mode: databricks, or keep only view outside it"))
    if cfg.checkpoint_volume is None and not problems:
        for where, c, s, t in cfg.levels():
            if "incremental" in cfg.resolve(c, s, t).operations:
                problems.append((f"{origin}: checkpoint_volume", f"operation incremental ({where}) keeps its "
                                 f"stream checkpoints there; set checkpoint_volume"))
                break
        if cfg.runs_volumes() or any("volume_files" in cfg.resolve(c, s, t).operations for _, c, s, t in cfg.levels()):
            problems.append((f"{origin}: checkpoint_volume", "operation volume_files keeps the manifest of the "
                             "files it copied there; set checkpoint_volume"))
    if problems:
        raise ConfigError(problems)
    return cfg


def split_list(text: str | None) -> list[str] | None:
    """``a,b , c`` -> ``['a', 'b', 'c']`` (None stays None)."""
    if text is None:
        return None
    return [p.strip() for p in text.split(",") if p.strip()]


def cli_overrides(target_catalog: str | None, target_schemas: str | None, operation: str | None,
                  uc_object_types: str | None) -> CliOverrides:
    try:
        return CliOverrides(target_catalog=target_catalog, target_schemas=split_list(target_schemas),
                            operations=split_list(operation),
                            uc_object_types=split_list(uc_object_types))
    except ValidationError as exc:
        raise ConfigError(_problems(exc.errors(include_url=False), "", "command line")) from None


__all__: Sequence[str] = ("ReplicateConfig", "ObjectSettings", "CliOverrides", "load_replicate_config",
                          "deep_merge", "cli_overrides", "OPERATIONS")
