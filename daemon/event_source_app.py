"""Composition of a pipeline fed by an event source (the YAML's ``source:`` block).

The supervisor runs one entry, ``events:<name>``, whose runner is the source's single query
(:class:`lakemirror.supervisor.event_stream.EventStreamRunner`); restarts, backoff, drain and
metrics are the supervisor's as for any table.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from lakemirror.daemon.config import Settings
from lakemirror.daemon.event_source_config import EventSourceSettings
from lakemirror.identifiers import TableName
from lakemirror.sources.catalog import Catalog
from lakemirror.supervisor.event_stream import RUNNER_PREFIX, EventStreamRunner, EventStreamSpec
from lakemirror.supervisor.observer import Observer
from lakemirror.supervisor.spec import PipelineSpec
from lakemirror.supervisor.state import RestartPolicy
from lakemirror.supervisor.supervisor import Supervisor

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEAD_LETTER_PREFIX = "_lakemirror_dead_letters_"


def event_stream_spec(source: EventSourceSettings, settings: Settings) -> EventStreamSpec:
    return EventStreamSpec(
        name=source.name, kind=source.kind, format=source.format, path=source.path,
        bootstrap_servers=source.bootstrap_servers, topics=",".join(source.topics) or None,
        topic_pattern=source.topic_pattern, tables=tuple(source.tables) if source.tables is not None else None,
        key_columns={t: tuple(c) for t, c in source.key_columns.items()},
        tombstone_horizon_seconds=source.tombstone_horizon_seconds,
        purge_interval_seconds=source.purge_interval_seconds,
        allow_schema_evolution=settings.allow_schema_evolution,
        trigger_interval_seconds=settings.trigger_interval_seconds, max_per_trigger=source.max_per_trigger)


def event_source_supervisor(settings: Settings, spec: PipelineSpec, spark: Callable[[], "SparkSession"],
                            catalog: Catalog, observer: Observer) -> Supervisor:
    """A supervisor whose one runner streams ``settings.source`` into the destination schema."""
    source = settings.source
    assert source is not None
    stream = event_stream_spec(source, settings)
    folder = Path(spec.checkpoint_root) / spec.pipeline_id / "events" / source.name

    def runner(_: str) -> EventStreamRunner:
        session = spark()
        catalog.ensure_schema(session, spec.destination_catalog, spec.destination_schema)
        return EventStreamRunner(
            stream, session, spec.pipeline_id, folder,
            lambda table: catalog.locate(TableName(spec.destination_catalog, spec.destination_schema, table)),
            catalog.locate(TableName(spec.destination_catalog, spec.destination_schema, DEAD_LETTER_PREFIX + source.name)))

    r = settings.restart
    return Supervisor(runner_factory=runner, list_tables=lambda: [RUNNER_PREFIX + source.name],  # type: ignore[arg-type]
                      policy=RestartPolicy(r.base_delay_seconds, r.max_delay_seconds, 2.0, r.jitter),
                      observer=observer, lag_interval_seconds=settings.lag_interval_seconds, apply_workers=0)
