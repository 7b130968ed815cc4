"""A table's Delta replica as a :class:`~lakemirror.sinks.contract.TableReplica`, written by Spark.

The bootstrap writes the snapshot in one commit that also stamps the replica with the pipeline,
source, epoch and bootstrap version (:mod:`lakemirror.sinks.batch.snapshot_copy`); preparing adds the
source's new columns when the pipeline allows it (:func:`evolution`, pure); each epoch's batches go
through one :class:`~lakemirror.sinks.merge.delta_merge.DeltaMergeSink`, whose path (MERGE, rewrite of a
small replica, or the driver's delta-rs MERGE) is chosen as the stream starts
(:func:`~lakemirror.sinks.merge.apply_choice.choose_apply`). A replica on the driver's file system
has its columns and facts read from its log by delta-rs (:mod:`.local_replica`), with no Spark job.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping, Sequence

from lakemirror import tables
from lakemirror.errors import DestinationConflict, SchemaIncompatible
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.batch import snapshot_copy
from lakemirror.sinks.merge.apply_choice import ApplyChoice, choose_apply
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.local_replica import LocalReplica
from lakemirror.sinks.merge.feed_letters import FEED_DEAD_LETTERS, FeedDeadLetters, FeedLetter
from lakemirror.sinks.merge.row_isolation import IsolatingMergeSink
from lakemirror.sinks.merge.planner import MergePlan, diff_schema
from lakemirror.sources.catalog import Catalog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApplyLimits:
    """The pipeline's settings for choosing a small replica's apply path (:mod:`.apply_choice`)."""

    rewrite_below_bytes: int
    driver_apply: bool
    driver_apply_below_bytes: int


def evolution(label: str, plan: MergePlan, replica: tuple[Column, ...], allow: bool) -> tuple[Column, ...]:
    """The columns to add so the replica follows ``plan`` (pure); raises when it cannot or may not."""
    diff = diff_schema(plan.columns, replica)
    if diff.is_empty:
        return ()
    if not diff.is_additive:
        raise SchemaIncompatible(
            f"{label}: the replica cannot follow the source schema ({diff.describe()}). "
            f"Resync the table to rebuild the replica, or revert the change on the source.", table=label)
    if not allow:
        raise SchemaIncompatible(
            f"{label}: the source has new columns ({diff.describe()}) and allow_schema_evolution "
            f"is false. Set allow_schema_evolution: true, or exclude the columns.", table=label)
    return tuple(diff.added)


def conflict_message(replica: str, pipeline_id: str, owner: str | None, *, is_source: bool,
                     setting: str = "destination_catalog or destination_schema") -> str:
    """Why a pipeline refuses to write into the existing table ``replica`` it did not create. Never
    advises dropping it: it may be a source (this pipeline's, or anyone's) or another pipeline's replica."""
    if is_source:
        return (f"{replica} is the source table itself: a replica must be another table; set {setting} to another "
                f"one")
    whose = (f"it is the replica of pipeline {owner!r}" if owner else
             "it was not created by lakemirror and may be a table something else reads or writes")
    return (f"{replica} already exists and was not created by pipeline {pipeline_id!r} ({whose}); lakemirror "
            f"writes only into replicas it created: set {setting} to another one")


@dataclass
class DeltaReplica:
    """The Delta table ``name`` (located by ``catalog``) as the replica of the source ``source``."""

    spark: "SparkSession"
    catalog: Catalog
    name: TableName
    source: str
    pipeline_id: str
    limits: ApplyLimits
    replica_properties: Mapping[str, str] = field(default_factory=dict)
    #: The crash-test hook (``supervisor/change_feed/table_runner.py``, ``FAULT_POINTS``); a no-op unless armed.
    fault: Callable[[str], None] = lambda point: None
    #: Told of the changes a batch dead-lettered, once they are recorded (the pipeline's counts).
    on_letters: Callable[[Sequence[FeedLetter]], None] = lambda letters: None

    #: A Delta table: its log records each batch's transaction id.
    delta_log: ClassVar[bool] = True

    def server_wait(self) -> None:
        """Nothing: Spark and delta-rs write the replica, no server call waits."""
        return None

    def on_server(self) -> bool:
        return False

    def claim(self, epoch: int) -> None:
        dst = self.catalog.locate(self.name)
        if epoch == 0 and tables.exists(self.spark, dst):
            owner = snapshot_copy.replica_properties(self.spark, dst).get(snapshot_copy.PIPELINE_PROPERTY)
            if owner != self.pipeline_id:
                raise DestinationConflict(conflict_message(str(self.name), self.pipeline_id, owner,
                                                           is_source=self._is_source(dst.path)), table=self.source)

    def _is_source(self, replica_path: str | None) -> bool:
        """Whether the replica's name or location is the source's (a pipeline into its own schema)."""
        if str(self.name).casefold() == self.source.casefold():
            return True
        try:
            source_path = self.catalog.locate(TableName.parse(self.source)).path
        except ValueError:
            return False
        if source_path is None or replica_path is None:
            return False
        here, there = tables.local_dir(source_path), tables.local_dir(replica_path)
        if here is not None and there is not None:  # one folder under two names (a link, a mount)
            return here.resolve() == there.resolve()
        return source_path.rstrip("/") == replica_path.rstrip("/")

    def bootstrap(self, plan: MergePlan, snapshot: "DataFrame", version: int, epoch: int,
                  source_properties: Mapping[str, str]) -> None:
        self.catalog.ensure_schema(self.spark, self.name.catalog, self.name.schema)
        log.info("table %s: bootstrapping %s from source version %d (epoch %d)", self.source, self.name, version, epoch)
        snapshot_copy.write_snapshot(
            snapshot, self.catalog.locate(self.name), plan.columns,
            {**self.replica_properties,
             snapshot_copy.PIPELINE_PROPERTY: self.pipeline_id,
             snapshot_copy.SOURCE_PROPERTY: self.source,
             snapshot_copy.EPOCH_PROPERTY: str(epoch),
             snapshot_copy.BOOTSTRAP_VERSION_PROPERTY: str(version)}, source_properties)

    def prepare(self, plan: MergePlan, allow_evolution: bool) -> bool:
        dst = self.catalog.locate(self.name)
        local = LocalReplica.open(dst.path)
        if local is not None and diff_schema(plan.columns, local.columns()).is_empty:
            return False  # the replica's log, read on the driver, has the plan's columns: nothing to add
        added = evolution(self.source, plan, snapshot_copy.replica_columns(self.spark, dst), allow_evolution)
        if not added:
            return False
        snapshot_copy.add_columns(self.spark, dst, added)
        log.info("table %s: added columns to %s: %s", self.source, self.name, ", ".join(c.name for c in added))
        return True

    def batch_sink(self, plan: MergePlan, epoch: int) -> IsolatingMergeSink:
        """Each batch through one MERGE (or the path the first batch chooses, which for a replica the
        driver's delta-rs reaches may be its MERGE on the driver); a batch the replica refuses because of
        a row's value is applied without that row, which is dead-lettered in ``_lakemirror_dead_letters``
        beside the replica (:mod:`~lakemirror.sinks.merge.row_isolation`)."""
        from lakemirror.object_store import delta_rs_target

        letters = self.dead_letters()
        target = self.catalog.locate(self.name)
        return IsolatingMergeSink(DeltaMergeSink(target, plan, stable_source=True, choose=lambda: self.choose_apply(plan),
                                                 driver_target=lambda: (delta_rs_target(self.spark, target.path)
                                                                        if target.path is not None else None),
                                                 fault=self.fault),
                                  letters, self.source, time.time, on_letters=self.on_letters)

    def dead_letters(self) -> FeedDeadLetters:
        """Where the changes this replica refuses are dead-lettered: ``_lakemirror_dead_letters`` beside it."""
        return FeedDeadLetters(self.catalog.locate(TableName(self.name.catalog, self.name.schema, FEED_DEAD_LETTERS)),
                               self.pipeline_id)

    def choose_apply(self, plan: MergePlan) -> tuple[ApplyChoice, int]:
        """MERGE, rewrite or the driver's MERGE, chosen from the replica's facts: read from its log on
        the driver where it can (:mod:`.local_replica`), else by two Spark jobs on the replica."""
        target = self.catalog.locate(self.name)
        local = LocalReplica.open(target.path)
        facts = local.facts(observable=hasattr(self.spark, "_jsparkSession")) if local is not None else None
        if facts is None:
            facts = snapshot_copy.replica_facts(self.spark, target)
        choice = choose_apply(facts, plan.column_names, self.limits.rewrite_below_bytes,
                              driver_apply=self.limits.driver_apply,
                              driver_apply_below_bytes=self.limits.driver_apply_below_bytes,
                              key_types=[c.type for c in plan.columns if c.name in plan.keys])
        log.info("table %s: %s", self.source, choice.reason)
        return choice, facts.rows
