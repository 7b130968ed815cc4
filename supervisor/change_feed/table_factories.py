"""The default factories of a table runner's two seams: where its changes come from and where they go.

The composition root hands every :class:`~lakemirror.supervisor.change_feed.table_runner.TableRunner` two factories,
from the pipeline's destination (:mod:`lakemirror.daemon.destinations`): ``source_for(table,
session)``, the table's :class:`~lakemirror.sources.contract.TableChangeSource`, and
``replica_for(table, session)``, its :class:`~lakemirror.sinks.contract.TableReplica`. The runner
calls each once, on first use, with the table's own Spark session, and never asks which kind it got.
These are the factories of the default destination, Delta, which a
:class:`~lakemirror.supervisor.change_feed.table_runner.RunnerContext` takes when it is given none: the Delta change
feed of the source table, and a Delta table in the destination schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from lakemirror.sinks.contract import ReplicaFactory, TableReplica
from lakemirror.sinks.merge.delta_replica import ApplyLimits, DeltaReplica
from lakemirror.sinks.merge.feed_letters import FeedLetter
from lakemirror.sources.catalog import Catalog
from lakemirror.sources.contract import TableChangeSource
from lakemirror.sources.delta_source import DeltaChangeFeed
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: How the runners get a table's change source: ``source_for(table, session)``.
SourceFactory = Callable[[str, Any], TableChangeSource[Any]]


def delta_change_feeds(catalog: Catalog, spec: PipelineSpec) -> SourceFactory:
    """Each table's Delta change feed, read in the table's session."""
    def source(table: str, session: "SparkSession") -> TableChangeSource[Any]:
        return DeltaChangeFeed(session, catalog, spec.source(table), kernel=spec.kernel_change_feed)
    return source


def delta_table_replicas(catalog: Catalog, spec: PipelineSpec, fault: Callable[[str], None] = lambda point: None,
                         on_letters: Callable[[Sequence[FeedLetter]], None] = lambda found: None) -> ReplicaFactory:
    """Each table's Delta replica in the destination schema, written in the table's session;
    ``on_letters`` is told of the changes a batch dead-lettered (the pipeline's counts)."""
    limits = ApplyLimits(spec.rewrite_below_bytes, spec.driver_apply, spec.driver_apply_below_bytes)

    def replica(table: str, session: "SparkSession") -> TableReplica[Any]:
        return DeltaReplica(session, catalog, spec.destination(table), str(spec.source(table)), spec.pipeline_id,
                            limits, spec.replica_properties, fault=fault, on_letters=on_letters)
    return replica
