"""What one event source's query is: :class:`EventStreamSpec` (built from the YAML's ``source:``
block by the daemon's settings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lakemirror.sources.debezium import FORMAT_DEBEZIUM


@dataclass(frozen=True)
class EventStreamSpec:
    """Everything one event source's query needs (built from the YAML's ``source`` block)."""

    name: str
    kind: str                                   # files | kafka
    format: str = FORMAT_DEBEZIUM               # debezium | simple
    path: str | None = None                     # files: the directory of JSON-lines files
    bootstrap_servers: str | None = None        # kafka
    topics: str | None = None                   # kafka: comma-separated topics
    topic_pattern: str | None = None            # kafka: or a pattern
    tables: tuple[str, ...] | None = None       # event tables replicated; None: every table seen
    key_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)  # for events without a key
    tombstone_horizon_seconds: float = 7 * 86400.0
    purge_interval_seconds: float = 3600.0
    allow_schema_evolution: bool = True
    trigger_interval_seconds: float = 5.0
    max_per_trigger: int | None = None          # files or offsets per micro-batch
    history: str = "current"                    # current | scd2 (one row per key version: sinks.events.history_plan)
    table_workers: int = 2                      # tables of one batch applied at the same time
    driver_apply: bool = True                   # local replicas may take a delta-rs MERGE on the driver
