"""What the supervisor is asked to replicate: plain frozen data, built by the daemon's config."""

from __future__ import annotations

from dataclasses import dataclass, field

from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.bootstrap_plan import BootstrapPolicy
from lakemirror.sinks.merge.apply_choice import DEFAULT_DRIVER_APPLY_BELOW_BYTES, DEFAULT_REWRITE_BELOW_BYTES


@dataclass(frozen=True)
class TableOptions:
    """Per-table overrides. Empty ``keys`` means infer (see :mod:`lakemirror.sources.keys`)."""

    keys: tuple[str, ...] = ()
    include_columns: tuple[str, ...] = ()
    exclude_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class PipelineSpec:
    pipeline_id: str
    source_catalog: str
    destination_catalog: str
    schema_name: str
    destination_schema: str
    checkpoint_root: str
    tables: tuple[str, ...] | None = None       # None: every table of the schema, discovered live
    exclude_tables: tuple[str, ...] = ()
    options: dict[str, TableOptions] = field(default_factory=dict)
    trigger_interval_seconds: float = 5.0
    apply_workers: int = 1                      # tables applied at once, taking turns; 0: always-on queries
    allow_schema_evolution: bool = True
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: str | None = None
    replica_properties: dict[str, str] = field(default_factory=dict)  # delta.* properties set at bootstrap
    change_window_policy: str = "fail"          # fail | resync: when a needed source version is gone
    retention_warning_seconds: float = 86400.0  # warn when the change window is closer than this
    rewrite_below_bytes: int = DEFAULT_REWRITE_BELOW_BYTES  # replicas this small are rewritten, not MERGEd
    driver_apply: bool = True                   # ... or, at a local path, MERGEd by delta-rs on the driver
    driver_apply_below_bytes: int = DEFAULT_DRIVER_APPLY_BELOW_BYTES  # ... as are local replicas up to this size
    kernel_change_feed: bool = False            # opt-in (Delta: testing only): Kernel-based change-feed source
    enable_change_data_feed: bool = False       # opt-in: turn a source's change data feed on instead of refusing it
    commit_file_batches: bool = True            # small batches planned from the source's commit files (turns, driver)
    bootstrap: BootstrapPolicy = field(default_factory=BootstrapPolicy)  # chunked, time-boxed bootstraps

    def source(self, table: str) -> TableName:
        return TableName(self.source_catalog, self.schema_name, table)

    def destination(self, table: str) -> TableName:
        return TableName(self.destination_catalog, self.destination_schema, table)

    def options_for(self, table: str) -> TableOptions:
        return self.options.get(table, TableOptions())
