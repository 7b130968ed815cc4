"""Where the replicas go: ``destination:`` in the pipeline YAML. Delta tables unless told otherwise.

::

    destination:
      kind: postgres
      host: 127.0.0.1
      port: 5432
      database: app
      schema: replicas            # created if missing
      user: lakemirror
      password_env: PGPASSWORD    # or password: … (kept secret) or password_file: /run/secrets/pg
      sslmode: prefer
      max_connections: 4          # the cap: connections lakemirror holds at once, executors and daemon together
      pool_connections: 2         # the daemon's own share (default: what Real-Time Mode's tasks leave)
      statement_timeout_seconds: 60
      mode: continuous            # continuous | triggered | snapshot (Lakebase synced-table modes)
      table_modes: {archive: snapshot}   # per table, overriding `mode`
      every_seconds: 600          # or daily_at: "02:30" (UTC): when triggered / snapshot cycles run
      snapshot_above_fraction: 0.64 # triggered: a cycle loads a snapshot when this share of rows changed

Validated once at start: a bad value or a password that cannot be read stops the daemon with the
field named (exit 2), as does a connection budget that does not fit ``max_connections``
(:mod:`.postgres_checks`). Whether the server can be reached is found out when a table starts: a table
that cannot connect waits in ``degraded`` and is retried, the others go on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from lakemirror.daemon.settings import limits
from lakemirror.sinks.postgres.modes import DEFAULT_SNAPSHOT_ABOVE, Mode
from lakemirror.daemon.settings.schedule import DailyAtText, Problem
from lakemirror.supervisor.subtasks.scheduler import DailyAt, Every, Trigger

if TYPE_CHECKING:
    from lakemirror.daemon.settings.event_source import EventSourceSettings
    from lakemirror.daemon.settings.pipeline import Settings
    from lakemirror.sinks.postgres.executor import PostgresTarget
    from lakemirror.supervisor.subtasks.service import Subtask

#: A replica kept by the table's stream (the only mode of a destination without cycles).
CONTINUOUS = "continuous"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _DestinationModel(_Strict):
    """What the daemon's generic settings code asks of every kind's model, so that it never names a
    kind: the defaults are a destination whose replicas are Delta tables kept by their streams."""

    #: The replicas are Delta tables in the catalog (they could be the source tables themselves; the
    #: scheduled VACUUM keeps them; an SCD2 history can be written to them).
    writes_delta: ClassVar[bool] = True

    def mode_of(self, table: str) -> str:
        """How ``table``'s replica is kept: ``continuous`` (its stream), or a mode of scheduled cycles."""
        return CONTINUOUS

    def moded_tables(self) -> tuple[str, ...]:
        """The tables the destination's settings give a mode of their own."""
        return ()

    def cycle_subtasks(self, pipeline_id: str) -> list["Subtask"]:
        """The scheduled sub-tasks of the tables kept by cycles (none without cycles)."""
        return []

    def cycle_mode(self, operations: tuple[str, ...]) -> str | None:
        """The mode whose cycles a sub-task of ``operations`` runs (None: a sub-task of ``schedules``)."""
        return None

    def problems(self, settings: "Settings") -> list[Problem]:
        """Problems of the destination against the rest of the pipeline, each with its location."""
        return []

    def source_problem(self, source: "EventSourceSettings") -> str | None:
        """Why the destination cannot take what the event source ``source`` asks of it, or None."""
        if source.history == "scd2" and not self.writes_delta:
            return (f"source.history scd2 needs a Delta destination (destination kind is {getattr(self, 'kind')}); "
                    f"remove history or write to Delta")
        return None

    def letters_elsewhere(self) -> str | None:
        """Where the change-feed tables' dead letters are when the daemon does not keep them, in words
        (None: the daemon lists, skips and replays them)."""
        return None


class DeltaDestination(_DestinationModel):
    """Replicas are Delta tables in ``destination_catalog.destination_schema`` (the default)."""

    kind: Literal["delta"] = "delta"

    def source_problem(self, source: "EventSourceSettings") -> str | None:
        if source.real_time is not None:
            return ("source.real_time needs destination kind postgres: open-source Spark runs Real-Time Mode into "
                    "foreach sinks only, not Delta; remove real_time or write to PostgreSQL")
        return super().source_problem(source)


class PostgresDestination(_DestinationModel):
    """Replicas are PostgreSQL tables, one per source table, named as the source table."""

    kind: Literal["postgres"]
    host: str = Field(min_length=1, max_length=limits.MAX_NAME_CHARS, description="Server host name or address.")
    port: int = Field(5432, ge=1, le=65535, description="Server port.")
    database: str = Field(min_length=1, max_length=63, description="Database holding the replicas.")
    target_schema: str = Field("public", alias="schema", min_length=1, max_length=63,
                               description="Schema of the replicas and of lakemirror_progress / "
                                           "lakemirror_dead_letters; created if missing.")
    user: str = Field(min_length=1, max_length=63, description="Login role; needs USAGE and CREATE on the schema.")
    password: SecretStr | None = Field(None, description="The password (prefer password_env or password_file).")
    password_env: str | None = Field(None, max_length=limits.MAX_NAME_CHARS,
                                     description="Name of an environment variable holding the password.")
    password_file: str | None = Field(None, max_length=limits.MAX_PATH_CHARS,
                                      description="File holding the password (trailing newline ignored).")
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = Field(
        "prefer", description="libpq sslmode.")
    max_connections: int = Field(4, ge=1, le=1000, description="The cap: connections lakemirror holds on the server "
                                 "at once, Real-Time Mode's executor tasks and the daemon's own pool together "
                                 "(checked at start: tasks × 1 + pool_connections must fit).")
    pool_connections: int | None = Field(None, ge=1, le=1000, description="The daemon's own connections at once "
                                         "(all tables' batches, cycles and bootstraps); default: what Real-Time "
                                         "Mode's tasks leave of max_connections (all of it without Real-Time Mode).")
    statement_timeout_seconds: float = Field(60.0, gt=0, le=86400, description="statement_timeout of every "
                                             "connection: a statement running longer fails the batch, retried.")
    connect_timeout_seconds: int = Field(10, ge=1, le=600, description="libpq connect_timeout.")
    retry_seconds: float = Field(60.0, ge=0, le=3600, description="How long a lost connection is retried "
                                 "inside a batch before the table goes to degraded (and is retried from there).")
    tombstone_horizon_seconds: float = Field(7 * 86400.0, gt=0, le=limits.DECADE,
                                             description="How long a deleted key is remembered, so that an older "
                                                         "change arriving later cannot bring it back.")

    mode: Mode = Field("continuous", description="How replicas are kept (Lakebase synced-table modes): continuous "
                       "(the change feed streamed in micro-batches), triggered (on the schedule, the changes since "
                       "the last cycle, or a snapshot when many rows changed), snapshot (on the schedule, a full "
                       "copy swapped in atomically).")
    table_modes: dict[str, Mode] = Field(default_factory=dict, description="Per table, a mode other than `mode`.")
    every_seconds: float | None = Field(None, gt=0, le=31 * 86400, description="triggered / snapshot: run a cycle "
                                        "this often (the first one interval after the daemon starts).")
    daily_at: DailyAtText = Field(None, description="triggered / snapshot: or once a day at HH:MM, UTC.")
    snapshot_above_fraction: float = Field(
        DEFAULT_SNAPSHOT_ABOVE, ge=0, le=1000, description="triggered: a cycle loads a fresh snapshot instead of "
        "applying the changes when change rows since the last cycle / source rows is at least this (the crossover "
        "measured by bench/postgres_modes.py).")
    cycle_timeout_seconds: float = Field(3600.0, gt=0, le=limits.YEAR,
                                         description="triggered / snapshot: per table and cycle.")

    @field_validator("password")
    @classmethod
    def _password(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            limits.secret(v.get_secret_value(), "password")
        return v

    @field_validator("table_modes")
    @classmethod
    def _table_names(cls, v: dict[str, Mode]) -> dict[str, Mode]:
        limits.names(v, "a table name")
        return v

    @field_validator("target_schema")
    @classmethod
    def _schema(cls, v: str) -> str:
        if "\x00" in v or not v.strip():
            raise ValueError("schema cannot be blank or contain NUL")
        return v

    @model_validator(mode="after")
    def _one_password(self) -> "PostgresDestination":
        given = [n for n in ("password", "password_env", "password_file") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of password, password_env, password_file (got {', '.join(given)})")
        if self.password_env is not None and self.password_env not in os.environ:
            raise ValueError(f"password_env: environment variable {self.password_env} is not set")
        if self.password_file is not None:
            path = Path(self.password_file).expanduser()
            if not path.is_file() or not os.access(path, os.R_OK):
                raise ValueError(f"password_file: {path} is not a readable file")
        return self

    @model_validator(mode="after")
    def _schedule(self) -> "PostgresDestination":
        cycled = self.cycled_modes()
        given = [n for n in ("every_seconds", "daily_at") if getattr(self, n) is not None]
        if cycled and len(given) != 1:
            raise ValueError(f"{' and '.join(sorted(cycled))} replicas run on a schedule: give exactly one of "
                             f"every_seconds or daily_at" + (f" (got {', '.join(given)})" if given else ""))
        if not cycled and given:
            raise ValueError(f"{given[0]} schedules triggered / snapshot cycles, but every table is continuous; "
                             f"set mode (or table_modes) or remove {given[0]}")
        return self

    writes_delta: ClassVar[bool] = False

    def mode_of(self, table: str) -> Mode:
        """The mode of ``table``'s replica."""
        return self.table_modes.get(table, self.mode)

    def moded_tables(self) -> tuple[str, ...]:
        return tuple(self.table_modes)

    def cycle_subtasks(self, pipeline_id: str) -> list["Subtask"]:
        """The cycles of triggered and snapshot replicas, one sub-task per mode, on the destination's
        schedule. ``tables`` None: every pipeline table whose mode it is."""
        from lakemirror.sinks.postgres.cycles import operation_of
        from lakemirror.supervisor.subtasks.batch_runner import TaskSettings
        from lakemirror.supervisor.subtasks.service import Subtask

        trigger = self.trigger()
        if trigger is None:
            return []
        out = []
        for mode in sorted(self.cycled_modes()):
            settings = TaskSettings(operations=(operation_of(mode),), timeout_seconds=self.cycle_timeout_seconds,
                                    config={"pipeline_id": pipeline_id, "destination_mode": mode,
                                            "snapshot_above_fraction": self.snapshot_above_fraction})
            tables = None if self.mode == mode else tuple(sorted(t for t, m in self.table_modes.items() if m == mode))
            out.append(Subtask(f"postgres-{mode}", trigger, settings, tables))
        return out

    def cycle_mode(self, operations: tuple[str, ...]) -> str | None:
        from lakemirror.sinks.postgres.cycles import OPERATIONS

        return OPERATIONS.get(operations[0]) if len(operations) == 1 else None

    def problems(self, settings: "Settings") -> list[Problem]:
        from lakemirror.daemon.settings.postgres_checks import postgres_problems

        return postgres_problems(settings)

    def letters_elsewhere(self) -> str | None:
        from lakemirror.sinks.postgres.destination import letters_elsewhere

        return letters_elsewhere(self.target_schema)

    def cycled_modes(self) -> set[Mode]:
        """The modes other than continuous that some table uses."""
        return {m for m in (self.mode, *self.table_modes.values()) if m != "continuous"}

    def trigger(self) -> Trigger | None:
        """When cycles run (None: every table is continuous)."""
        if self.every_seconds is not None:
            return Every(self.every_seconds)
        return DailyAt.parse(self.daily_at) if self.daily_at is not None else None

    def pool_size(self, executor_connections: int = 0) -> int:
        """The daemon's own connections: ``pool_connections``, else what the executors leave (at least 1)."""
        if self.pool_connections is not None:
            return self.pool_connections
        return max(1, self.max_connections - executor_connections)

    def resolved_password(self) -> str | None:
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_env is not None:
            return os.environ[self.password_env]
        if self.password_file is not None:
            return Path(self.password_file).expanduser().read_text(encoding="utf-8").rstrip("\r\n")
        return None

    def target(self, executor_connections: int = 0) -> "PostgresTarget":
        """The server, with the daemon's pool sized for ``executor_connections`` held by executors."""
        from lakemirror.sinks.postgres.executor import PostgresTarget

        return PostgresTarget(
            host=self.host, port=self.port, database=self.database, schema=self.target_schema, user=self.user,
            password=self.resolved_password(), sslmode=self.sslmode, max_connections=self.max_connections,
            pool_connections=self.pool_size(executor_connections),
            statement_timeout_seconds=self.statement_timeout_seconds,
            connect_timeout_seconds=self.connect_timeout_seconds, retry_seconds=self.retry_seconds,
            tombstone_horizon_seconds=self.tombstone_horizon_seconds)


Destination = Annotated[Union[DeltaDestination, PostgresDestination], Field(discriminator="kind")]
