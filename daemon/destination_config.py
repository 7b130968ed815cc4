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
      max_connections: 4          # connections lakemirror opens at once, all tables together
      statement_timeout_seconds: 60

Validated once at start: a bad value or a password that cannot be read stops the daemon with the
field named (exit 2). Whether the server can be reached is found out when a table starts: a table
that cannot connect waits in ``degraded`` and is retried, the others go on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from lakemirror.sinks.postgres.executor import PostgresTarget


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class DeltaDestination(_Strict):
    """Replicas are Delta tables in ``destination_catalog.destination_schema`` (the default)."""

    kind: Literal["delta"] = "delta"


class PostgresDestination(_Strict):
    """Replicas are PostgreSQL tables, one per source table, named as the source table."""

    kind: Literal["postgres"]
    host: str = Field(min_length=1, description="Server host name or address.")
    port: int = Field(5432, ge=1, le=65535, description="Server port.")
    database: str = Field(min_length=1, description="Database holding the replicas.")
    target_schema: str = Field("public", alias="schema", min_length=1, max_length=63,
                               description="Schema of the replicas and of lakemirror_progress / "
                                           "lakemirror_dead_letters; created if missing.")
    user: str = Field(min_length=1, description="Login role; needs USAGE and CREATE on the schema.")
    password: SecretStr | None = Field(None, description="The password (prefer password_env or password_file).")
    password_env: str | None = Field(None, description="Name of an environment variable holding the password.")
    password_file: str | None = Field(None, description="File holding the password (trailing newline ignored).")
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = Field(
        "prefer", description="libpq sslmode.")
    max_connections: int = Field(4, ge=1, le=1000, description="Connections lakemirror opens at once (all tables).")
    statement_timeout_seconds: float = Field(60.0, gt=0, le=86400, description="statement_timeout of every "
                                             "connection: a statement running longer fails the batch, retried.")
    connect_timeout_seconds: int = Field(10, ge=1, le=600, description="libpq connect_timeout.")
    retry_seconds: float = Field(60.0, ge=0, le=3600, description="How long a lost connection is retried "
                                 "inside a batch before the table goes to degraded (and is retried from there).")
    tombstone_horizon_seconds: float = Field(7 * 86400.0, gt=0, description="How long a deleted key is "
                                             "remembered, so that an older change arriving later cannot "
                                             "bring it back.")

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

    def resolved_password(self) -> str | None:
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_env is not None:
            return os.environ[self.password_env]
        if self.password_file is not None:
            return Path(self.password_file).expanduser().read_text(encoding="utf-8").rstrip("\r\n")
        return None

    def target(self) -> PostgresTarget:
        return PostgresTarget(
            host=self.host, port=self.port, database=self.database, schema=self.target_schema, user=self.user,
            password=self.resolved_password(), sslmode=self.sslmode, max_connections=self.max_connections,
            statement_timeout_seconds=self.statement_timeout_seconds,
            connect_timeout_seconds=self.connect_timeout_seconds, retry_seconds=self.retry_seconds,
            tombstone_horizon_seconds=self.tombstone_horizon_seconds)


Destination = Annotated[Union[DeltaDestination, PostgresDestination], Field(discriminator="kind")]
