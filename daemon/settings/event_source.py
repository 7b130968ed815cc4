"""The ``source:`` block of a pipeline's YAML: an event stream instead of the Delta change feed.

Without it a pipeline mirrors the Delta tables of ``source_catalog.schema_name`` by their change
feed. With it, the pipeline runs ONE Structured Streaming query over the event source and fans each
micro-batch out to one replica per table, in ``destination_catalog.destination_schema``
(``source_catalog`` is then only part of the default pipeline id)::

    source:
      kind: files              # JSON-lines files in a directory (development), or: kafka
      path: /data/cdc-events
      format: debezium         # Debezium envelopes, or: simple (table_name, operation, before/after)
      tables: [customers, orders]
      key_columns: {orders: [order_id, line]}   # for events that carry no key of their own
      tombstone_horizon_seconds: 604800
      history: scd2            # keep every version of every row (SCD type 2); default: current

Validated with the rest of the file: a bad block exits 2 naming the field (``source.path`` …).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lakemirror.daemon.settings import limits
from lakemirror.daemon.settings.real_time import RealTimeSettings
from lakemirror.sources.debezium import FORMAT_DEBEZIUM

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class EventSourceSettings(BaseModel):
    """An event stream (Debezium or simple CDC events) feeding the pipeline's replicas."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["files", "kafka"] = Field(description="files: JSON-lines files in a directory, read by Spark's "
                                            "file streaming source; kafka: Kafka topics (Spark's Kafka source).")
    name: str = Field("events", description="Names the source's query, checkpoint and dead-letter table "
                                            "(_lakemirror_dead_letters_<name> in the destination schema).")
    format: Literal["debezium", "simple"] = Field(
        FORMAT_DEBEZIUM, description="debezium: Debezium envelopes (JSON converter, with or without schemas); "
                                     "simple: the CDC events of Delta Lake's Streaming CDC Pipeline recipe (table_name, operation, "
                                     "before/after as JSON).")
    path: str | None = Field(None, max_length=limits.MAX_PATH_CHARS,
                             description="kind files: the directory new event files are moved into.")
    bootstrap_servers: str | None = Field(None, max_length=limits.MAX_PATH_CHARS,
                                          description="kind kafka: host:port[,host:port].")
    topics: list[str] = Field(default_factory=list, description="kind kafka: topics to read.")
    topic_pattern: str | None = Field(None, max_length=limits.MAX_PATH_CHARS, description="kind kafka: or a Java regex of topics. Spark also "
                                      "subscribes to a topic the pattern is only found in (shop\\.orders takes "
                                      "shop.orders_archive): anchor it, ^…$, to match whole names.")
    tables: list[str] | None = Field(None, description="Event tables to replicate; omit for every table the "
                                                       "events name.")
    key_columns: dict[str, list[str]] = Field(
        default_factory=dict, description="Key columns per table, for events without a key of their own "
                                          "(bare Debezium envelopes, simple events without primary_key).")
    tombstone_horizon_seconds: float = Field(
        7 * 86400.0, gt=0, le=limits.DECADE, description="How long a delete is remembered so a late, older insert "
        "cannot bring the row back. Longer than the worst delivery delay of the source.")
    history: Literal["current", "scd2"] = Field(
        "current", description="current: the replica keeps one row per key, the newest; scd2: one row per key "
                               "version (SCD type 2) with valid_from, valid_to (NULL while current), is_current and "
                               "the positions that opened and closed it, in source position order whatever the "
                               "arrival order. Every table of the source; Delta destinations only; a replica keeps "
                               "the mode it was created with (docs/event-sources.md#history-scd-type-2).")
    purge_interval_seconds: float = Field(3600.0, gt=0, le=limits.YEAR,
                                          description="How often tombstones past the horizon are purged.")
    max_per_trigger: int | None = Field(None, gt=0, description="Cap on files (or Kafka offsets) per micro-batch.")
    table_workers: int = Field(2, ge=1, le=64, description="Delta destinations: how many tables of one micro-batch "
                               "are applied at the same time, each on its own Spark session under its own "
                               "transaction id. 1 applies them one after another.")
    real_time: RealTimeSettings | None = Field(None, description="Kafka into a PostgreSQL destination only: run in "
                                               "Spark's Real-Time Mode (lakemirror.daemon.settings.real_time).")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("name must be 1-64 letters, digits, '_' or '-', starting with a letter or digit")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is None or _SCHEME.match(v):
            return v
        where = Path(v).expanduser()
        if not where.is_dir():
            raise ValueError(f"{where} is not a directory; create it, or point path at the directory the event "
                             f"files are moved into")
        return str(where.absolute())

    @field_validator("tables")
    @classmethod
    def _tables(cls, v: list[str] | None) -> list[str] | None:
        limits.names(v or [], "a table name")
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"table names repeat: {v}")
        return v

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str]) -> list[str]:
        limits.names(v, "a topic name")
        return v

    @field_validator("key_columns")
    @classmethod
    def _key_columns(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        limits.names(v, "a table name")
        for columns in v.values():
            limits.names(columns, "a column name")
        return v

    @model_validator(mode="after")
    def _kind(self) -> "EventSourceSettings":
        if self.kind == "files" and self.path is None:
            raise ValueError("kind files needs path: the directory of JSON-lines event files")
        if self.kind == "kafka":
            if not self.bootstrap_servers:
                raise ValueError("kind kafka needs bootstrap_servers, e.g. 127.0.0.1:9092")
            if bool(self.topics) == bool(self.topic_pattern):
                raise ValueError("kind kafka needs topics or topic_pattern (one of them)")
        if self.real_time is not None and self.kind != "kafka":
            raise ValueError("real_time needs kind kafka: Spark's Real-Time Mode reads Kafka only")
        for table, columns in self.key_columns.items():
            if not columns:
                raise ValueError(f"key_columns.{table} is empty; name the key column(s)")
        return self
