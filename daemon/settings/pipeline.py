"""The pipeline configuration: a YAML file, overridden by environment variables, then CLI flags.

Typed and validated once, at start; every problem is reported with its location, and an invalid
configuration stops the daemon before anything starts (``lakemirror validate`` exits 2).
Environment variables use the prefix ``LAKEMIRROR_`` and ``__`` for nesting, e.g.
``LAKEMIRROR_TRIGGER_INTERVAL_SECONDS=5`` or ``LAKEMIRROR_RUNTIME__MODE=connect``.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Collection, Final, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from lakemirror.daemon.settings import config_file, limits, paths
from lakemirror.daemon.settings.bootstrap import BootstrapSettings
from lakemirror.daemon.settings.destination import DeltaDestination, Destination
from lakemirror.daemon.settings.env_source import EnvValueError, LakemirrorEnvSource
from lakemirror.daemon.settings.event_source import EventSourceSettings
from lakemirror.daemon.settings.lease import LeaseSettings
from lakemirror.daemon.settings.maintenance import VACUUM_TASK, ReplicaMaintenance
from lakemirror.daemon import spark_values, yaml_loader
from lakemirror.daemon.settings.schedule import ScheduleSettings, schedule_problems
from lakemirror.errors import ConfigError
from lakemirror.sinks.merge.apply_choice import DEFAULT_DRIVER_APPLY_BELOW_BYTES, DEFAULT_REWRITE_BELOW_BYTES

log = logging.getLogger(__name__)

#: Delta's property that expires a table's transaction ids: never on a replica.
TXN_RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"

_NAME = re.compile(r"^[^\x00-\x1f/`.]+$")
_PIPELINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _check_name(value: str, what: str) -> str:
    if not value or not value.strip():
        raise ValueError(f"{what} cannot be empty")
    if len(value) > limits.MAX_NAME_CHARS:
        raise ValueError(f"{what} is {len(value)} characters long; a name has at most {limits.MAX_NAME_CHARS}")
    if not _NAME.match(value):
        raise ValueError(f"{what} {value!r} may not contain '.', '/', '`' or control characters")
    return value


def bearer_token(value: str) -> str:
    """A token as the server compares it and the client sends it: spaces and line breaks at either
    end dropped, at least one character, printable ASCII without spaces (an HTTP header's value).
    The message never quotes the token."""
    token = limits.secret(value.strip(), "auth_token")
    if not token:
        raise ValueError("auth_token is empty; give a token, or leave auth_token out to have one generated "
                         "(http.auth token)")
    if not all("\x21" <= c <= "\x7e" for c in token):
        raise ValueError("auth_token must be printable ASCII without spaces or line breaks inside (it is sent "
                         "in an HTTP header)")
    return token


#: Blocks of the YAML that belong to the daemon, not to a pipeline posted to its control API.
DAEMON_ONLY_KEYS = ("runtime", "http", "databricks")

#: The version of the settings format this lakemirror writes and reads (the ``version`` field).
SETTINGS_VERSION: Final = 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _scalar_strings(v: Any) -> Any:
    """YAML writes ``true`` and ``8`` for the strings Spark and Delta read as "true" and "8"."""
    if isinstance(v, dict):
        return {k: (str(x).lower() if isinstance(x, bool) else str(x) if isinstance(x, (int, float)) else x)
                for k, x in v.items()}
    return v


class TableOverride(Strict):
    """Per-table settings under ``table_overrides: {<table>: …}``."""

    keys: list[str] = Field(default_factory=list, description="Primary-key columns; empty = infer.")
    include_columns: list[str] = Field(default_factory=list, description="Only these columns reach the replica.")
    exclude_columns: list[str] = Field(default_factory=list, description="These columns never reach the replica.")

    @field_validator("keys", "include_columns", "exclude_columns")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name or "\x00" in name:
                raise ValueError("column names cannot be empty or contain NUL")
            if len(name) > limits.MAX_NAME_CHARS:
                raise ValueError(f"a column name is {len(name)} characters long; a name has at most "
                                 f"{limits.MAX_NAME_CHARS}")
        if len(set(v)) != len(v):
            raise ValueError(f"names repeat: {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "TableOverride":
        if self.include_columns and self.exclude_columns:
            raise ValueError("give include_columns or exclude_columns, not both")
        return self


class RuntimeSettings(Strict):
    """Where Spark runs."""

    mode: Literal["local", "connect", "databricks"] = Field(
        "local", description="local: embedded Spark + Delta (default); connect: a Spark Connect server; "
                             "databricks: the session of a Databricks job.")
    master: str = Field("local[2]", max_length=limits.MAX_PATH_CHARS, description="Spark master URL in local mode.")
    warehouse: str = Field("./lakehouse", description="Local mode: the directory holding catalogs/schemas/tables, "
                           "or s3a://bucket/path for a lakehouse on S3 (with the spark.hadoop.fs.s3a.* confs in "
                           "spark_conf; docs/deployment.md, \"Object storage\").")
    spark_remote: str | None = Field(None, max_length=limits.MAX_PATH_CHARS,
                                     description="Connect mode: the server, e.g. sc://host:15002.")
    jars_dir: str | None = Field(None, description="Directory of Delta's jars (default: ~/.cache/lakemirror/jars).")
    shuffle_partitions: int = Field(4, ge=1, le=spark_values.JAVA_INT_MAX, description="spark.sql.shuffle.partitions for the daemon's session.")
    driver_memory: str = Field("2g", description="Local mode: spark.driver.memory, the JVM's heap (e.g. 2g, 512m).")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark confs; those whose format "
                                       "lakemirror knows (sizes, durations, booleans, every *.enabled) are checked "
                                       "at load, a name differing from a known one only in case is refused (Spark "
                                       "would ignore it), and in local mode a class a conf names (spark.sql."
                                       "extensions, a catalog, a plugin) must be in the session's jars. A conf "
                                       "wins over lakemirror's own, except spark.sql.extensions, spark.jars and "
                                       "spark.driver.extraJavaOptions, which add to lakemirror's, and "
                                       "spark.sql.catalog.spark_catalog and spark.sql.session.timeZone, which "
                                       "must stay DeltaCatalog and UTC. A value carrying a credential (a URL with "
                                       "a password, password=...) is kept off the JVM's command line, as secret "
                                       "names (*.secret.key, *password*) are.")

    @field_validator("master")
    @classmethod
    def _master(cls, v: str) -> str:
        return spark_values.master_url(v)

    @field_validator("warehouse", "jars_dir")
    @classmethod
    def _folders(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else paths.directory_value(v, f"runtime.{info.field_name}")

    @field_validator("driver_memory", mode="before")
    @classmethod
    def _heap(cls, v: Any) -> str:
        return spark_values.jvm_heap(v, "driver_memory")

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _conf_strings(cls, v: Any) -> Any:
        return _scalar_strings(v)

    @field_validator("spark_conf")
    @classmethod
    def _conf(cls, v: dict[str, str]) -> dict[str, str]:
        out, problems = {}, []
        for key, value in v.items():
            try:
                out[key] = spark_values.spark_conf_value(key, value)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("; ".join(problems))
        return out

    @model_validator(mode="after")
    def _remote(self) -> "RuntimeSettings":
        if self.mode == "connect" and not (self.spark_remote or "").startswith("sc://"):
            raise ValueError("runtime.mode connect needs runtime.spark_remote = sc://host:port")
        if self.spark_remote is not None:
            from lakemirror.daemon.preflight import StartupError, remote_address

            try:
                remote_address(self.spark_remote)
            except StartupError as exc:
                raise ValueError(str(exc)) from None
        return self


class HttpSettings(Strict):
    host: str = Field("127.0.0.1", max_length=limits.MAX_NAME_CHARS,
                      description="Interface of the /metrics, /healthz and /status endpoint.")
    port: int = Field(9464, ge=0, le=65535, description="Port (0 = any free port).")
    auth: Literal["token", "none"] = Field(
        "token", description="token (default): every control route and /api route needs Authorization: Bearer "
        "<token>, the token being auth_token, or when that is unset one generated at each start and written to "
        "<checkpoint_volume>/<pipeline_id>/daemon.token, readable by the daemon's user only (lakemirror "
        "pause|resume|resync read it there; the status page asks for it). none: no token; control is accepted on "
        "a loopback interface only, from any local user and process, and refused on others.")
    auth_token: SecretStr | None = Field(None, description="Bearer token for the control API (never logged). "
                                         "Spaces and line breaks at either end are dropped (a YAML block scalar "
                                         "or a mounted secret file ends in one); printable ASCII otherwise.")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host names a control or /api request may name in its Host header besides "
        "the daemon's own address (a DNS name in front of it: a Kubernetes service, a proxy). Its IP address, and "
        "localhost when it listens on loopback or on every interface, need no entry; a request naming any other "
        "host is refused, as is one whose Origin is another site's (DNS rebinding, cross-site requests).")

    @field_validator("auth_token")
    @classmethod
    def _token(cls, v: SecretStr | None) -> SecretStr | None:
        return None if v is None else SecretStr(bearer_token(v.get_secret_value()))

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for host in v:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]", host):
                raise ValueError(f"allowed_hosts: {host[:100]!r} is not a host name (write it without a scheme, "
                                 f"port or path, e.g. lakemirror.prod.svc)")
        return [h.lower() for h in v]

    @model_validator(mode="after")
    def _auth(self) -> "HttpSettings":
        if self.auth == "none" and self.auth_token is not None:
            raise ValueError("http.auth is none but http.auth_token is set: remove one of them")
        return self


class RestartSettings(Strict):
    base_delay_seconds: float = Field(2.0, gt=0, le=limits.DAY, description="First retry delay of a degraded table.")
    max_delay_seconds: float = Field(300.0, gt=0, le=limits.DAY, description="Cap of the exponential backoff.")
    jitter: float = Field(0.2, ge=0, le=1, description="Fraction by which a delay is randomly shortened.")


class DatabricksSettings(Strict):
    """Where pipelines submitted through ``POST /api/continuous-sync`` in databricks mode run."""

    wheel: str | None = Field(None, max_length=limits.MAX_PATH_CHARS,
                              description="The built lakemirror wheel in the workspace (a .whl path).")
    config_dir: str | None = Field(None, max_length=limits.MAX_PATH_CHARS, description="Workspace folder (e.g. a "
                                   "volume) the daemon writes each submitted pipeline's YAML to.")
    spark_version: str = Field("17.3.x-scala2.13", max_length=limits.MAX_NAME_CHARS,
                               description="Runtime of the job cluster.")
    node_type_id: str = Field("i3.xlarge", max_length=limits.MAX_NAME_CHARS, description="Node type of the job cluster.")
    num_workers: int = Field(1, ge=0, description="Workers of the job cluster.")


def driver_cores(master: str, machine_cores: int) -> int:
    """The cores the driver's Spark has: N of ``local[N]`` / ``local[N,F]``, 1 of ``local``, else the
    machine's (``local[*]``, a cluster manager's driver, a Databricks job's driver). Pure."""
    match = re.match(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$", master.strip())
    if match is None or match.group(1) == "*":
        return max(1, machine_cores)
    return int(match.group(1)) if match.group(1) else 1


def default_apply_workers(mode: str, cores: int = 2) -> int:
    """Tables applied at once when ``apply_workers`` is unset: one turn for every two of the driver's
    ``cores`` (at least one), each table's query waiting at a gate between its turns
    (:mod:`lakemirror.supervisor.apply_workers.query_gate`). One warm Spark MERGE keeps about two cores busy, so more
    turns than half the cores only queue for them (and 2 workers on 2 cores starved the benchmark's
    writer: docs/BENCHMARKS.md). Over Spark Connect the MERGEs run on the server, whose cores the
    daemon does not know: one turn at a time, the batch functions waiting at a gate of files
    (:mod:`lakemirror.sinks.merge.connect_gate`)."""
    if mode == "connect":
        return 1
    return max(1, cores // 2)


class Settings(BaseSettings):
    """A Continuous Sync pipeline: the daemon's YAML. Field names follow Continuous Sync's pipeline YAML
    in the Data Replication System for Databricks."""

    model_config = SettingsConfigDict(env_prefix="LAKEMIRROR_", env_nested_delimiter="__",
                                      extra="forbid", frozen=True, allow_inf_nan=False)

    version: Literal[1] = Field(SETTINGS_VERSION, description="Version of this settings format: 1, the only "
                                "one so far; a file that leaves it out is read as version 1.")
    pipeline_id: str | None = Field(None, description="Stable id of the pipeline (default derived from the names).")
    source_catalog: str = Field(description="Catalog of the source tables.")
    destination_catalog: str = Field(description="Catalog of the replicas.")
    schema_name: str = Field(description="Schema replicated (same name in the destination unless destination_schema).")
    destination_schema: str | None = Field(None, description="Schema of the replicas (default: schema_name).")
    tables: list[str] | None = Field(None, description="Tables to mirror; omit for every table, new ones picked up live.")
    exclude_tables: list[str] = Field(default_factory=list, description="Tables never mirrored.")
    checkpoint_volume: str = Field(description="Root directory of stream checkpoints and pipeline state. In local "
                                   "mode a local (or mounted) directory, also when the tables are on S3.")
    trigger_interval_seconds: float = Field(
        5.0, ge=0.001, le=86400, description="Spark's processing-time trigger of the always-on streaming queries "
        "(every table's with apply_workers 0, the gated queries of local mode, an event source's): how often a "
        "query looks for new source commits and starts a micro-batch.")
    turn_interval_seconds: float | None = Field(
        None, ge=0.001, le=86400, description="With apply_workers above 0: the shortest time between the starts "
        "of two turns of one table. Unset: trigger_interval_seconds.")
    apply_workers: int | None = Field(
        None, ge=0, le=1024, description="How many tables apply changes at the same time. Tables with unapplied "
        "commits take turns, the longest-waiting first; a turn applies everything the table accumulated (one "
        "batch of its query, which stays up between turns). 0: one always-on streaming query per table instead "
        "(for drivers with a core or more per table). Unset: in local and databricks mode one for every two of "
        "the driver's cores, at least 1 (the N of runtime.master local[N] in local mode; the machine's cores "
        "otherwise): a warm Spark MERGE keeps about two cores busy. 1 over Spark Connect, where the MERGEs run "
        "on the server and each query's batch function waits for its turns at a gate of files beside its "
        "checkpoint. With replicas on object storage a turn mostly waits for the store: 2 "
        "overlaps two tables' waits (make bench ONLY=production, 4 tables on two cores).")
    allow_schema_evolution: bool = Field(True, description="New source columns reach the replica without a restart by hand.")
    enable_change_data_feed: bool = Field(
        False, description="Opt-in: a source table whose Change Data Feed is off has it turned on by lakemirror "
        "(ALTER TABLE … SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true'): one commit on the source, "
        "logged) when its replica starts, instead of being refused. Changes are recorded from that commit on; "
        "the bootstrap's snapshot is taken after it. false (default): such a table is failed at once (a "
        "configuration error, not retried) with the statement to run.")
    table_overrides: dict[str, TableOverride] = Field(default_factory=dict, description="Per-table keys/columns.")
    audit_catalog: str | None = Field(None, description="Catalog of the checkpoint table (default: destination_catalog).")
    checkpoint_table: str | None = Field(None, description="Full name of the checkpoint table "
                                                           "(default <audit_catalog>.continuous_sync.checkpoints).")
    discover_interval_seconds: float = Field(30.0, gt=0, le=limits.DAY,
                                             description="How often new tables are looked for.")
    lag_interval_seconds: float = Field(2.0, gt=0, le=limits.DAY, description="How often lag is measured per table.")
    change_window_policy: Literal["fail", "resync"] = Field(
        "fail", description="When a source version the replica needs is gone (VACUUM, log cleanup, source "
                            "recreated): fail = the table stops in state failed, saying what happened; "
                            "resync = a new bootstrap at a pinned version with a new epoch and checkpoint.")
    retention_warning_seconds: float = Field(86400.0, gt=0, le=limits.DECADE,
                                             description="Warn when a table's change window (retention headroom) is "
                                                         "closer than this.")
    lag_slo_seconds: float = Field(300.0, gt=0, le=limits.YEAR,
                                   description="/readyz fails when a table lags more than this.")
    drain_timeout_seconds: float = Field(120.0, gt=0, le=limits.DAY,
                                         description="SIGTERM: how long the drain may take (batches in flight, their "
                                                     "checkpoint rows, the queries' stop); what has not finished "
                                                     "then is abandoned, named in the log and replayed at the next "
                                                     "start (exit 124).")
    max_files_per_trigger: int | None = Field(None, gt=0, le=spark_values.JAVA_INT_MAX, description="Cap on source files per micro-batch.")
    max_bytes_per_trigger: str | None = Field(None, description="Soft cap on bytes per micro-batch, e.g. '512m' "
                                              "(units b, k, m, g, t, p) or a number of bytes.")
    replica_properties: dict[str, str] = Field(
        default_factory=dict, description="Delta table properties set on every streamed replica at bootstrap, "
        "e.g. {'delta.enableDeletionVectors': 'true'}: a MERGE then writes only the changed rows instead of "
        "every file they are in; a local replica's batches then mark changed rows deleted in place on the driver "
        "(make bench ONLY=steady_cost measures a cycle with them and without).")
    rewrite_below_bytes: int = Field(
        DEFAULT_REWRITE_BELOW_BYTES, ge=0, description="Replicas no larger than this apply a batch by rewriting "
        "the replica whole in one pass instead of a MERGE's two (faster when changes touch every file, as they do "
        "on small tables; make bench ONLY=apply_cost). Never for replicas with a change data feed or deletion vectors of "
        "their own. 0: always MERGE.")
    driver_apply: bool = Field(
        True, description="Replicas (up to driver_apply_below_bytes) at a path on the driver's own file system, or "
        "at s3a:// locations reached with the session's fs.s3a settings on a store with conditional writes, take "
        "each batch by one delta-rs MERGE on the driver, under the same Delta transaction id, instead of a Spark "
        "write: about three times less work per batch on two cores (make bench ONLY=apply_cost). With turns "
        "(apply_workers >= 1), a table's batches of a few plain source versions are then planned from the source's "
        "commit files and read by delta-rs, without Delta's streaming source (docs/how-it-works.md#stream). Event "
        "sources' Delta replicas at such locations take their guarded batches the same way "
        "(docs/event-sources.md#the-sequence-guard). Needs the deltalake package; catalog-managed replicas (Unity "
        "Catalog), Spark Connect and replicas whose protocol features delta-rs does not write stay with Spark. "
        "false: Spark plans and writes every batch.")
    driver_apply_below_bytes: int = Field(
        DEFAULT_DRIVER_APPLY_BELOW_BYTES, ge=0, description="With driver_apply, replicas up to this size are MERGEd "
        "by delta-rs on the driver even when larger than rewrite_below_bytes: its MERGE streams the replica, so "
        "its memory does not grow with it (it spills to disk past 1 GiB). Larger "
        "replicas take Spark's MERGE.")
    commit_file_batches: bool = Field(
        True, description="With turns (apply_workers >= 1) and driver_apply, a table whose source delta-rs reads "
        "(a local path, or s3a:// with the session's fs.s3a settings) plans each batch of up to 32 plain source "
        "versions from the source's commit files and reads it with delta-rs, without Delta's streaming source and "
        "its two snapshots of the source a batch; the epoch's first batch, a backlog, a schema change and other "
        "commits delta-rs may read differently are planned by Spark (docs/how-it-works.md#stream). false: Spark's "
        "streaming source plans every batch, each table's query stays up and its batches wait for their turns.")
    kernel_change_feed: bool = Field(
        False, description="Opt-in, for testing only: sources at a path (the embedded lakehouse) have their change "
        "feed streamed by Delta's Kernel-based streaming source, reached only through Delta 4.4's "
        "spark.databricks.delta.v2.enableMode=STRICT, which Delta documents as 'should ONLY be enabled for "
        "testing' (set in a session of the table's own). It reads the source's log on the driver instead of "
        "DeltaSource's Spark jobs that rebuild two snapshots of the source every micro-batch when its writer "
        "leaves no checksum files (delta-rs leaves none; docs/BENCHMARKS.md, 'Opt-in: the Kernel-based change "
        "feed'). Tables known by name (Unity Catalog) always use DeltaSource. "
        "false (default): DeltaSource everywhere.")
    destination: Destination = Field(default_factory=DeltaDestination, description="Where replicas go: "
                                     "{kind: delta} (default) or {kind: postgres, host, …}; the fields of each kind follow; docs/postgres.md.")
    source: EventSourceSettings | None = Field(None, description="An event stream (Debezium or simple CDC events, "
                                               "files or Kafka) instead of the Delta change feed; see "
                                               "lakemirror.daemon.settings.event_source.")
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    restart: RestartSettings = Field(default_factory=RestartSettings)
    databricks: DatabricksSettings = Field(default_factory=DatabricksSettings)
    bootstrap: BootstrapSettings = Field(default_factory=BootstrapSettings)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    schedules: list[ScheduleSettings] = Field(
        default_factory=list, description="Batch sub-tasks (clone, incremental, reconcile, metadata, vacuum) the "
                                          "daemon runs on a schedule; see lakemirror.daemon.settings.schedule.")
    replica_maintenance: ReplicaMaintenance = Field(
        default_factory=ReplicaMaintenance, description="Retention, checkpoint interval and a scheduled VACUUM of "
        "the Delta replicas, so that a replica's cost per batch does not grow over hours; see "
        "lakemirror.daemon.settings.maintenance.")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """What is given, only: :func:`load_settings` adds the environment and the file. A pipeline
        posted to the control API is what its body says, not the daemon's ``LAKEMIRROR_*`` variables
        (pydantic runs this for ``model_validate`` too, as ``Settings`` has its own ``__init__``)."""
        return (init_settings,)

    @field_validator("source_catalog", "destination_catalog", "schema_name", "destination_schema", "audit_catalog")
    @classmethod
    def _ident(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else _check_name(v, info.field_name)

    @field_validator("checkpoint_volume")
    @classmethod
    def _checkpoint_folder(cls, v: str) -> str:
        return paths.directory_value(v, "checkpoint_volume")

    @field_validator("checkpoint_table")
    @classmethod
    def _checkpoint_table(cls, v: str | None) -> str | None:
        return None if v is None else limits.table_name(v, "checkpoint_table")

    @field_validator("table_overrides")
    @classmethod
    def _override_names(cls, v: dict[str, TableOverride]) -> dict[str, TableOverride]:
        for name in v:
            _check_name(name, "table name")
        return v

    @field_validator("pipeline_id")
    @classmethod
    def _pid(cls, v: str | None) -> str | None:
        if v is not None and not _PIPELINE_ID.match(v):
            raise ValueError("pipeline_id must be 1-64 characters of letters, digits, '_', '.', '-', "
                             "starting with a letter or digit")
        return v

    @field_validator("tables", "exclude_tables")
    @classmethod
    def _table_names(cls, v: list[str] | None, info: Any) -> list[str] | None:
        if v is None:
            return v
        for name in v:
            _check_name(name, "table name")
        if len(set(v)) != len(v):
            raise ValueError(f"table names repeat: {v}")
        return v

    @field_validator("max_bytes_per_trigger", mode="before")
    @classmethod
    def _max_bytes(cls, v: Any) -> str | None:
        return None if v is None else spark_values.byte_size(v, "max_bytes_per_trigger")[0]

    @field_validator("replica_properties", mode="before")
    @classmethod
    def _property_strings(cls, v: Any) -> Any:
        return _scalar_strings(v)

    @field_validator("replica_properties")
    @classmethod
    def _replica_properties(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if len(key) > spark_values.MAX_CONF_KEY_CHARS or len(value) > spark_values.MAX_CONF_VALUE_CHARS:
                raise ValueError(f"replica_properties: a name has at most {spark_values.MAX_CONF_KEY_CHARS} characters "
                                 f"and a value at most {spark_values.MAX_CONF_VALUE_CHARS}")
            if not key.startswith("delta."):
                raise ValueError(f"replica_properties: {key!r} is not a Delta table property; only 'delta.*' "
                                 f"properties may be set (lakemirror.* ones are lakemirror's own)")
            if key.lower() == TXN_RETENTION_PROPERTY.lower():
                raise ValueError(f"replica_properties: {key} would let Delta forget the transaction ids that make a "
                                 f"replayed batch a no-op (a batch replayed after that long would be applied twice); "
                                 f"remove it")
        return {k: spark_values.delta_property(k, x) for k, x in v.items()}

    @model_validator(mode="after")
    def _cross(self) -> "Settings":
        if self.tables is not None:
            unknown = sorted(set(self.table_overrides) - set(self.tables))
            if unknown:
                raise ValueError(f"table_overrides names tables not in `tables`: {unknown}")
        if self.restart.base_delay_seconds > self.restart.max_delay_seconds:
            raise ValueError("restart.base_delay_seconds is larger than restart.max_delay_seconds")
        if self.checkpoint_table is not None:
            from lakemirror.identifiers import TableName
            TableName.parse(self.checkpoint_table)
        if self.source is None and self.destination.writes_delta \
                and self.source_catalog.casefold() == self.destination_catalog.casefold() \
                and (self.destination_schema or self.schema_name).casefold() == self.schema_name.casefold():
            raise ValueError(f"the replicas would be the source tables themselves: source_catalog and "
                             f"destination_catalog are both {self.source_catalog!r} and the destination schema is "
                             f"the source schema {self.schema_name!r}; set destination_catalog or "
                             f"destination_schema to another one")
        refused = self.destination.source_problem(self.source) if self.source is not None else None
        if refused is not None:
            raise ValueError(refused)
        if self.replica_maintenance.vacuum_trigger() is not None and any(t.name == VACUUM_TASK for t in self.schedules):
            raise ValueError(f"a schedule is named {VACUUM_TASK!r}, the name of the replicas' scheduled VACUUM "
                             f"(replica_maintenance); rename it")
        return self

    # -- derived ----------------------------------------------------------------------------

    @property
    def effective_pipeline_id(self) -> str:
        if self.pipeline_id:
            return self.pipeline_id
        raw = f"{self.source_catalog}.{self.schema_name}-to-{self.destination_catalog}"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)[:64]

    @property
    def effective_apply_workers(self) -> int:
        """``apply_workers``, else the runtime mode's default from the driver's cores
        (:func:`default_apply_workers`, :func:`driver_cores`)."""
        if self.apply_workers is not None:
            return self.apply_workers
        cores = driver_cores(self.runtime.master if self.runtime.mode == "local" else "local[*]", os.cpu_count() or 1)
        return default_apply_workers(self.runtime.mode, cores)

    @property
    def effective_turn_interval_seconds(self) -> float:
        """The shortest time between two turns of one table (``turn_interval_seconds``, else the trigger's)."""
        return self.turn_interval_seconds if self.turn_interval_seconds is not None else self.trigger_interval_seconds

    @property
    def effective_checkpoint_table(self) -> str:
        if self.checkpoint_table:
            return self.checkpoint_table
        return f"{self.audit_catalog or self.destination_catalog}.continuous_sync.checkpoints"


class _DictSource(PydanticBaseSettingsSource):
    """The YAML file's content as the lowest-priority settings source."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


def read_yaml(path: str | Path, known: Collection[str] | None = None) -> dict[str, Any]:
    """The configuration file's top-level mapping (:func:`~lakemirror.daemon.settings.config_file.read_config`)."""
    return config_file.read_config(path, known)


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _origin_of(loc: tuple[Any, ...], file_origin: str, overrides: dict[str, Any]) -> str:
    """Name where a bad value came from: a command-line flag, an environment variable or the file."""
    if not loc:
        return f"{file_origin}: {_loc(loc)}"
    node: Any = overrides
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return f"command line: {_loc(loc)}"
    keys = [str(p) for p in loc if not isinstance(p, int)]
    for depth in range(len(keys), 0, -1):  # the variable may set a whole nested model as JSON
        var = "LAKEMIRROR_" + "__".join(keys[:depth]).upper()
        if any(name.upper() == var for name in os.environ):
            return f"environment variable {var}"
    # a mapping's problem (a Spark conf's value) when a variable sets one of its keys
    under = "LAKEMIRROR_" + "__".join(keys).upper() + "__"
    below = sorted(name for name in os.environ if name.upper().startswith(under))
    if keys and below:
        return f"environment variable {', '.join(below)} (or {file_origin}: {_loc(loc)})"
    return f"{file_origin}: {_loc(loc)}"


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def local_path_problem(value: str) -> str | None:
    """Why a local directory cannot be used (created if missing), or None. URIs are not checked."""
    if _SCHEME.match(value):
        return None
    path = Path(value).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            return f"{path} is a file, not a directory; point it at a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable by this user"
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"{path} cannot be created: {parent} is a file, not a directory"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{path} cannot be created: {parent} is not writable by this user"
            return None
    return None


def object_storage_problem(field: str, value: str) -> str | None:
    """Why a location cannot be used in local mode for ``field`` (``checkpoint_volume`` or
    ``runtime.warehouse``) because of its URI scheme, or None.

    The warehouse may be on S3 through Hadoop's ``s3a://`` (``s3://`` and ``s3n://`` have no file
    system in Spark's Hadoop). ``checkpoint_volume`` holds the daemon's own state files, written
    with atomic local renames, so it must be a local directory even when the tables are on S3."""
    scheme = value.split(":", 1)[0].lower() if _SCHEME.match(value) else ""
    if scheme in ("", "file"):
        return None
    if field == "checkpoint_volume":
        return (f"{value} is not a local directory: checkpoint_volume holds the daemon's state files and stream "
                f"checkpoints, which need a local (or mounted) file system; the tables may be on S3 "
                f"(runtime.warehouse: s3a://bucket/path)")
    if scheme in ("s3", "s3n"):
        return f"{value}: Spark reaches S3 through Hadoop's s3a:// file system; write s3a://{value.split('://', 1)[-1]}"
    if scheme != "s3a":
        return f"{value}: local mode supports a local directory or s3a://bucket/path as the warehouse"
    return None


def checkpoint_problem(settings: Settings, warehouse: str | None = None) -> str | None:
    """Why ``settings.checkpoint_volume`` may not hold checkpoints: inside a Delta table, or (local mode)
    inside the folder of the source's or the replicas' schema under ``warehouse`` (default: the
    settings' own). See :mod:`lakemirror.daemon.settings.paths`."""
    if settings.runtime.mode == "databricks":
        return None
    schemas = [(settings.source_catalog, settings.schema_name),
               (settings.destination_catalog, settings.destination_schema or settings.schema_name)]
    local = settings.runtime.mode == "local"
    return paths.checkpoint_location_problem(settings.checkpoint_volume,
                                             (warehouse or settings.runtime.warehouse) if local else None, schemas)


def _path_problems(settings: Settings, origin: str, overrides: dict[str, Any]) -> list[tuple[str, str]]:
    if settings.runtime.mode != "local":
        return []
    found = []
    for loc, value in ((("checkpoint_volume",), settings.checkpoint_volume),
                       (("runtime", "warehouse"), settings.runtime.warehouse)):
        problem = object_storage_problem(".".join(loc), value) or local_path_problem(value)
        if problem:
            found.append((_origin_of(loc, origin, overrides), problem))
    if not found:
        problem = checkpoint_problem(settings)
        if problem:
            found.append((_origin_of(("checkpoint_volume",), origin, overrides), problem))
    return found


def load_settings(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Settings:
    """Load and validate; raise :class:`ConfigError` listing every problem with its location."""
    data = read_yaml(path, Settings.model_fields) if path is not None else {}
    origin = str(path) if path is not None else "settings"

    class _Bound(Settings):
        @classmethod
        def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                       init_settings: PydanticBaseSettingsSource,
                                       env_settings: PydanticBaseSettingsSource,
                                       dotenv_settings: PydanticBaseSettingsSource,
                                       file_secret_settings: PydanticBaseSettingsSource,
                                       ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, LakemirrorEnvSource(settings_cls), _DictSource(settings_cls, data))

    try:
        bound = _Bound(**(overrides or {}))
    except EnvValueError as exc:
        raise ConfigError([(f"environment variable {var}", msg) for var, msg in exc.problems]) from None
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown setting (check the spelling; see docs/configuration.md)"
            elif err["type"] == "missing":
                msg = "required setting is missing"
            problems.append((_origin_of(tuple(err["loc"]), origin, overrides or {}), msg))
        raise ConfigError(problems) from None
    settings = Settings.model_validate(bound.model_dump())
    warn_unknown_environment(os.environ)
    unusable = _path_problems(settings, origin, overrides or {})
    unusable += [(_origin_of(loc, origin, overrides or {}), msg)
                 for loc, msg in schedule_problems(settings.schedules, settings.tables, settings.exclude_tables)]
    unusable += [(_origin_of(loc, origin, overrides or {}), msg) for loc, msg in settings.destination.problems(settings)]
    if settings.runtime.mode == "local":
        from lakemirror.daemon.spark_classes import missing_class_problems

        unusable += [(_origin_of(("runtime", "spark_conf"), origin, overrides or {}), msg)
                     for _, msg in missing_class_problems(settings.runtime.spark_conf, settings.runtime.jars_dir)]
    if unusable:
        raise ConfigError(unusable)
    return settings


#: Variables with our prefix that are not settings: read elsewhere (jars.py, class_archive.py, the torture harness).
OTHER_VARIABLES = ("LAKEMIRROR_JARS_DIR", "LAKEMIRROR_IVY_CACHE", "LAKEMIRROR_CLASS_ARCHIVE_DIR", "LAKEMIRROR_TEST_KILL_AT")


def warn_unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """Log a warning for each ``LAKEMIRROR_*`` variable that sets nothing (a misspelling is otherwise
    ignored without a word), naming the closest setting; return the warnings."""
    from lakemirror.daemon.env_check import unknown_variables

    warnings = []
    for var, close in unknown_variables(environ, Settings, "LAKEMIRROR_", "__", OTHER_VARIABLES):
        hint = f"; did you mean {close}?" if close else "; see docs/configuration.md"
        warnings.append(f"environment variable {var} is not a lakemirror setting and is ignored{hint}")
    for text in warnings:
        log.warning("%s", text)
    return warnings


def parse_set_flags(values: list[str]) -> dict[str, Any]:
    """``--set a.b=c`` flags as a nested dict (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in values:
        if "=" not in item:
            raise ConfigError([(f"--set {item}", "expected KEY=VALUE, e.g. --set runtime.master=local[4]")])
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        try:
            node[parts[-1]] = yaml_loader.load(raw) if raw else raw
        except yaml.YAMLError as exc:
            raise ConfigError([(f"--set {key}", f"not a valid YAML value: {exc}")]) from None
    return out
