"""The guarded Delta executor: one batch's :class:`~lakemirror.sinks.events.guard_plan.TablePlan`, applied
to a replica with one MERGE under a Delta transaction id.

Thin: the winners, the guard's rule and the tombstone semantics come from
:mod:`lakemirror.sinks.events.guard_plan`; this module only carries them out on Delta.

Where tombstones live: in a side Delta table of their own (``<replica>__lakemirror_tombstones``),
not as hidden rows of the replica. The replica then holds exactly the live rows, so every reader
(SQL, delta-rs, a BI tool, the replica's own change feed, a downstream Postgres sink) is right
without knowing about a view or a flag; its only extra column is ``_lakemirror_position``, the
order that wrote the row, which the guard compares. The price is a second commit, on the side
table, in batches that delete or truncate; it runs after the replica's MERGE, under a transaction
id of its own, so a crash between the two is repaired by the replayed batch (Delta skips the
replica's MERGE as a replay and runs the tombstones' one).

Per batch:

1. the replica and its tombstone table are created on first use (types inferred from the events,
   :mod:`lakemirror.sinks.events.event_rows`); columns that appear later are added when schema
   evolution is on;
2. values are converted to the replica's types; an event whose value does not fit is returned as
   rejected (for the dead letters) and its key is left alone in this batch;
3. one MERGE whose source is the winners without those a tombstone of their key or the table's
   truncate floor is as new as (anti-joins against the tombstone table, inside the MERGE's own
   job: the driver reads no tombstones): matched and newer → update or delete; not matched →
   insert upserts; with a new truncate floor, rows older than it that the batch does not touch →
   delete (``WHEN NOT MATCHED BY SOURCE``). A winner that changed no row is counted as stale;
4. deletes and a new floor → appended to the tombstone table in one commit (an append needs no scan
   of the table; older rows of a key stay until the horizon purges them and never win the guard).

Steps 3 and 4 are Spark's unless the replica takes the driver's executor
(:mod:`lakemirror.sinks.accelerator.guarded_driver`: the same rules by delta-rs, no Spark job), as
:func:`lakemirror.sinks.merge.apply_choice.choose_guarded_apply` decides once both tables exist. A
batch with a new truncate floor is Spark's in any case.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lakemirror import tables
from lakemirror.delta_log.protocol import delta_rs_can_write
from lakemirror.identifiers import TableName, quote
from lakemirror.object_store import delta_rs_target
from lakemirror.sinks.accelerator.guarded_driver import GuardedBatchUnfit, GuardedDriverMerge
from lakemirror.sinks.merge.apply_choice import choose_guarded_apply
from lakemirror.sinks.merge.delta_merge import counts_from_answer
from lakemirror.sinks.events.event_rows import convert, convert_row, infer_type
from lakemirror.sinks.events.guard_plan import (
    DELETED_AT_COLUMN, OP_COLUMN, POSITION_COLUMN, POSITION_FIELDS, RESERVED_COLUMNS, SCOPE_COLUMN, SCOPE_KEY, SCOPE_TABLE, TablePlan,
    row_order,
)
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId, transaction
from lakemirror.sources.change_event import DELETE, ChangeEvent, Order
from lakemirror.tables import TableLocation
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructField, StructType

log = logging.getLogger(__name__)

S, T = "s", "t"
TOMBSTONE_SUFFIX = "__lakemirror_tombstones"


def tombstones_of(replica: TableLocation) -> TableLocation:
    """Where a replica's tombstones live: a sibling table, or a sibling folder for a path table."""
    name = TableName(replica.name.catalog, replica.name.schema, replica.name.table + TOMBSTONE_SUFFIX)
    return TableLocation(name, replica.path.rstrip("/") + TOMBSTONE_SUFFIX if replica.path else None)


def position_sql(order: Order) -> str:
    return "named_struct(" + ", ".join(f"'{f}', CAST({v} AS BIGINT)" for f, v in zip(POSITION_FIELDS, order)) + ")"


@dataclass(frozen=True)
class GuardOutcome:
    counts: ApplyCounts
    replayed: bool                                  # Delta skipped the replica's MERGE: already committed
    applied: int = 0                                # winners that changed a row
    stale: int = 0          # winners that changed none: not newer than their row, tombstone or the truncate
                            # floor (replays, redeliveries, late events), or deletes of keys the replica lacks
    rejected: tuple[tuple[ChangeEvent, str], ...] = ()   # values that do not fit the replica's schema
    added_columns: tuple[str, ...] = ()
    tombstones: int = 0                             # tombstone rows written (deletes, floor)


@dataclass
class GuardedDeltaSink:
    """Applies guarded change plans to one Delta replica and its tombstone table."""

    replica: TableLocation
    allow_schema_evolution: bool = True
    clock: Callable[[], float] = time.time
    #: The crash-test hook, called once the replica's MERGE is committed and before its tombstones
    #: (``events_after_replica_merge``); a no-op unless the torture harness arms it.
    fault: Callable[[str], None] = lambda point: None
    #: Replicas the driver's delta-rs reaches (local paths, ``s3a://``) take their batches by a delta-rs
    #: MERGE on the driver (:func:`lakemirror.sinks.merge.apply_choice.choose_guarded_apply`).
    driver_apply: bool = True
    tombstones: TableLocation = field(init=False)
    #: The driver executor once the choice made it (after the tables exist); None: Spark's MERGE.
    _driver: "GuardedDriverMerge | None" = field(default=None, init=False, repr=False)
    _chosen: bool = field(default=False, init=False, repr=False)
    #: The replica's schema as :meth:`ensure` last saw or made it, with its tombstone table in place
    #: (lakemirror is the replica's one writer); forgotten when an apply fails.
    _ensured: "StructType | None" = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.tombstones = tombstones_of(self.replica)

    @property
    def applies_on_driver(self) -> bool:
        """Whether batches (but those with a truncate) reach the replica by delta-rs on the driver."""
        return self._driver is not None

    # -- tables ---------------------------------------------------------------------------------

    def _schema(self, session: "SparkSession", loc: TableLocation) -> "StructType | None":
        return tables.read(session, loc).schema if tables.exists(session, loc) else None

    def _create(self, session: "SparkSession", loc: TableLocation, columns: Sequence[tuple[str, str]]) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(session)
        builder = builder.location(loc.path) if loc.path else builder.tableName(loc.name.sql)
        for name, sql_type in columns:
            builder = builder.addColumn(name, sql_type)
        builder.execute()

    def ensure(self, session: "SparkSession", plan: TablePlan) -> tuple["StructType", tuple[str, ...]]:
        """The replica's schema (created or widened for ``plan``) and the columns it gained."""
        position_type = "STRUCT<" + ", ".join(f"{f}: BIGINT" for f in POSITION_FIELDS) + ">"
        wanted = plan.column_names()
        known = self._ensured
        if known is not None and {c.lower() for c in wanted} <= {f.name.lower() for f in known.fields}:
            return known, ()

        def typed(name: str) -> str:
            declared = next((w.types[name] for w in plan.winners if name in w.types), None)
            if declared is not None:  # the source's own type (Connect schemas): never a guess
                return declared
            return infer_type(w.columns.get(name) for w in plan.upserts) if plan.upserts else \
                infer_type(w.keys[plan.key_columns.index(name)][1] for w in plan.winners)

        schema = self._schema(session, self.replica)
        added: tuple[str, ...] = ()
        if schema is None:
            self._create(session, self.replica, [(c, typed(c)) for c in wanted] + [(POSITION_COLUMN, position_type)])
            log.info("%s: created the replica with columns %s", self.replica, ", ".join(wanted))
            added = wanted
        else:
            have = {f.name.lower() for f in schema.fields}
            new = [c for c in wanted if c.lower() not in have]
            if new and self.allow_schema_evolution:
                cols = ", ".join(f"{quote(c)} {typed(c)}" for c in new)
                run_sql(session, f"ALTER TABLE {self.replica.sql} ADD COLUMNS ({cols})")
                log.info("%s: new columns from the events: %s", self.replica, ", ".join(new))
                added = tuple(new)
        schema = self._schema(session, self.replica)
        assert schema is not None
        if self._schema(session, self.tombstones) is None:
            key_types = {f.name: f.dataType.simpleString() for f in schema.fields}
            self._create(session, self.tombstones, [(k, key_types[k]) for k in plan.key_columns]
                         + [(POSITION_COLUMN, position_type), (DELETED_AT_COLUMN, "TIMESTAMP"),
                            (SCOPE_COLUMN, "STRING")])
        self._ensured = schema
        return schema, added

    # -- the guard ------------------------------------------------------------------------------

    def _on(self, keys: Sequence[str]) -> str:
        return " AND ".join(f"{T}.{quote(k)} <=> {S}.{quote(k)}" for k in keys)

    def _stored_floor(self, session: "SparkSession") -> Order | None:
        """The table's truncate floor: the newest order of the tombstone table's 'table' rows."""
        from pyspark.sql import functions as F

        rows = (tables.read(session, self.tombstones).where(F.col(SCOPE_COLUMN) == SCOPE_TABLE)
                .agg(F.max(POSITION_COLUMN).alias("p")).collect())
        return row_order(rows[0]["p"].asDict()) if rows and rows[0]["p"] is not None else None

    def _guarded(self, session: "SparkSession", source: "DataFrame", key_columns: Sequence[str]) -> "DataFrame":
        """``source`` without the changes a tombstone of their key, or the truncate floor, is as new as:
        the guard against deleted rows, evaluated inside the MERGE that reads it (no read of the
        tombstones on the driver). Tombstones are appended, so a key may have several; any one as new
        as the change drops it."""
        from pyspark.sql import functions as F

        stones = tables.read(session, self.tombstones)
        not_newer = f"{T}.{POSITION_COLUMN} >= {S}.{POSITION_COLUMN}"
        keyed = stones.where(F.col(SCOPE_COLUMN) == SCOPE_KEY).alias(T)
        floors = stones.where(F.col(SCOPE_COLUMN) == SCOPE_TABLE).alias(T)
        past_keys = source.alias(S).join(keyed, F.expr(f"{self._on(key_columns)} AND {not_newer}"), "left_anti")
        return past_keys.alias(S).join(floors, F.expr(not_newer), "left_anti")

    @staticmethod
    def _key_value(change: ChangeEvent, name: str, sql_type: str) -> Any:
        return convert(dict(change.keys)[name], sql_type)

    def apply(self, session: "SparkSession", plan: TablePlan, txn: TxnId) -> GuardOutcome:
        """Apply ``plan`` under ``txn`` (its app id names the replica; the version is the batch id)."""
        try:
            return self._apply(session, plan, txn)
        except Exception:
            self._ensured = None  # the replica may have changed under the failed batch: look again next time
            raise

    def _apply(self, session: "SparkSession", plan: TablePlan, txn: TxnId) -> GuardOutcome:
        from pyspark.sql.types import StringType, StructField, StructType

        if not plan.key_columns:  # only a truncate: the keys are those the tombstone table was made with
            stones = self._schema(session, self.tombstones)
            if stones is None:
                log.info("%s: a truncate before any row: nothing to truncate", self.replica)
                return GuardOutcome(ApplyCounts(), False)
            plan = replace(plan, key_columns=tuple(f.name for f in stones.fields if f.name not in RESERVED_COLUMNS))
        schema, added = self.ensure(session, plan)
        driver = self._driver_for(session)
        types = {f.name: f.dataType.simpleString() for f in schema.fields}
        data_fields = [f for f in schema.fields if f.name != POSITION_COLUMN]
        key_schema = StructType([schema[k] for k in plan.key_columns])
        new_floor = None
        if plan.truncate is not None:
            stored_floor = self._stored_floor(session)
            new_floor = plan.truncate if stored_floor is None or plan.truncate > stored_floor else None
        rows, deletes, rejected = [], [], []
        names = [f.name for f in data_fields]
        for w in plan.winners:
            try:
                typed_key = convert_row(dict(w.keys), types, plan.key_columns)
                typed = convert_row(w.columns, types, names) if w.op != DELETE else typed_key
                values = [typed.get(n) for n in names]
            except ValueError as exc:
                rejected.append((w, f"does not fit the replica's schema: {exc}"))
                continue
            rows.append((*values, dict(zip(POSITION_FIELDS, w.order())), w.op))
            if w.op == DELETE:
                deletes.append(w)
        if not rows and new_floor is None:
            return GuardOutcome(ApplyCounts(), False, 0, 0, tuple(rejected), added)
        if driver is not None and new_floor is None:  # a new floor's MERGE is Spark's (guarded_driver)
            try:
                counts_on_driver = self._apply_on_driver(driver, plan, schema, rows, txn)
            except GuardedBatchUnfit as exc:
                log.warning("%s: %s; Spark's MERGE applies this replica from now on", self.replica, exc)
                self._driver = None
            else:
                return self._outcome(session, plan, deletes, None, key_schema, schema, txn, counts_on_driver,
                                     len(rows), rejected, added, driver)
        source_schema = StructType([*data_fields, schema[POSITION_COLUMN], StructField(OP_COLUMN, StringType())])
        source = self._guarded(session, session.createDataFrame(rows, source_schema), plan.key_columns)
        with transaction(session, txn):
            answer = self._merge_replica(session, source, plan, data_fields, new_floor).execute().collect()
        if self._driver is not None:
            self._driver.forget()  # Spark wrote the replica: delta-rs reloads it
        return self._outcome(session, plan, deletes, new_floor, key_schema, schema, txn,
                             counts_from_answer(answer[0].asDict()) if answer else None, len(rows), rejected, added)

    def _outcome(self, session: "SparkSession", plan: TablePlan, deletes: Sequence[ChangeEvent],
                 new_floor: Order | None, key_schema: "StructType", schema: "StructType", txn: TxnId,
                 counts: ApplyCounts | None, rows: int, rejected: Sequence[tuple[ChangeEvent, str]],
                 added: tuple[str, ...], driver: "GuardedDriverMerge | None" = None) -> GuardOutcome:
        """After the replica's MERGE (``counts`` None: skipped as a replay): the tombstones, and the
        outcome. A winner that changed no row was not newer than the row, its tombstone or the floor
        (or deleted a key the replica does not hold); a new floor's deletions count among the deletes."""
        self.fault("events_after_replica_merge")
        stones_txn = TxnId(txn.app_id + "/tombstones", txn.version)
        if driver is not None:
            written = self._append_tombstones_on_driver(driver, deletes, key_schema, stones_txn)
        else:
            written = self._write_tombstones(session, plan, deletes, new_floor, key_schema, schema[POSITION_COLUMN],
                                             stones_txn)
        if counts is None:
            return GuardOutcome(ApplyCounts(), True, rows, 0, tuple(rejected), added, written)
        stale = max(0, rows - counts.inserted - counts.updated - counts.deleted)
        return GuardOutcome(counts, False, rows - stale, stale, tuple(rejected), added, written)

    # -- the driver path ------------------------------------------------------------------------

    def _driver_for(self, session: "SparkSession") -> "GuardedDriverMerge | None":
        """The driver executor if the replica takes that path (chosen once, when both tables exist)."""
        if not self._chosen:
            import importlib.util

            self._chosen = True
            engine = importlib.util.find_spec("deltalake") is not None
            replica, stones = ((delta_rs_target(session, loc.path) if engine and loc.path is not None
                                and tables.has_own_jvm(session) else None) for loc in (self.replica, self.tombstones))
            writable = (replica is not None and stones is not None
                        and delta_rs_can_write(*replica) and delta_rs_can_write(*stones))
            choice = choose_guarded_apply(driver_apply=self.driver_apply, driver_engine=engine,
                                          reachable=replica is not None and stones is not None, writable=writable)
            log.info("%s %s", self.replica, choice.reason)
            if choice.driver and replica is not None and stones is not None:
                self._driver = GuardedDriverMerge(replica, stones)
        return self._driver

    def _apply_on_driver(self, driver: "GuardedDriverMerge", plan: TablePlan, schema: "StructType",
                         rows: Sequence[tuple[Any, ...]], txn: TxnId) -> ApplyCounts | None:
        """``rows`` (the Spark path's source rows: data columns, position, operation) MERGEd by delta-rs."""
        data = [f.name for f in schema.fields if f.name != POSITION_COLUMN]
        return driver.merge(rows, data, plan.key_columns, txn)

    def _append_tombstones_on_driver(self, driver: "GuardedDriverMerge", deletes: Sequence[ChangeEvent],
                                     key_schema: "StructType", txn: TxnId) -> int:
        if not deletes:
            return 0
        names = [*(f.name for f in key_schema.fields), POSITION_COLUMN, DELETED_AT_COLUMN, SCOPE_COLUMN]
        rows = [dict(zip(names, row)) for row in self._tombstone_rows(deletes, None, key_schema)]
        driver.append_tombstones(rows, txn)
        return len(rows)

    def _merge_replica(self, session: "SparkSession", source: "DataFrame", plan: TablePlan,
                       data_fields: Sequence[Any], new_floor: Order | None) -> Any:
        newer = f"({T}.{POSITION_COLUMN} IS NULL OR {S}.{POSITION_COLUMN} > {T}.{POSITION_COLUMN})"
        values: dict[str, str | Column] = {quote(f.name): f"{S}.{quote(f.name)}" for f in data_fields}
        values[POSITION_COLUMN] = f"{S}.{POSITION_COLUMN}"
        merge = (tables.delta_table(session, self.replica).alias(T)
                 .merge(source.alias(S), self._on(plan.key_columns))
                 .whenMatchedDelete(condition=f"{newer} AND {S}.{OP_COLUMN} = '{DELETE}'")
                 .whenMatchedUpdate(condition=newer, set=values)
                 .whenNotMatchedInsert(condition=f"{S}.{OP_COLUMN} <> '{DELETE}'", values=values))
        if new_floor is not None:
            merge = merge.whenNotMatchedBySourceDelete(
                condition=f"{T}.{POSITION_COLUMN} IS NULL OR {T}.{POSITION_COLUMN} < {position_sql(new_floor)}")
        return merge

    def _write_tombstones(self, session: "SparkSession", plan: TablePlan, deletes: Sequence[ChangeEvent],
                          new_floor: Order | None, key_schema: "StructType", position: "StructField",
                          txn: TxnId) -> int:
        """Append the batch's tombstones (one row per deleted key, one for a new truncate floor) in one
        commit under ``txn``. Appended, not merged: the guard drops a change that any tombstone of its
        key is as new as (:meth:`_guarded`), so an older row of a key is harmless and the write needs
        no scan of the table; rows older than the horizon are purged (:meth:`purge`). A delete that
        changed nothing (not newer than the row) is remembered too: its order is below what the key
        already holds, so it never drops a change the row itself would not."""
        from pyspark.sql.types import StringType, StructField, StructType, TimestampType

        if not deletes and new_floor is None:
            return 0
        rows = self._tombstone_rows(deletes, new_floor, key_schema)
        source = session.createDataFrame(rows, StructType([*key_schema.fields, position,
                                                           StructField(DELETED_AT_COLUMN, TimestampType()),
                                                           StructField(SCOPE_COLUMN, StringType())]))
        with transaction(session, txn):  # the txn action and the commit's tag, as on the replica's MERGE
            tables.write(source, self.tombstones, "append")
        return len(rows)

    def _tombstone_rows(self, deletes: Sequence[ChangeEvent], new_floor: Order | None,
                        key_schema: "StructType") -> list[tuple[Any, ...]]:
        """The tombstone table's rows for ``deletes`` and a new floor: key columns, position, deletion
        time, scope (the table's column order; either executor writes them)."""
        now = datetime.fromtimestamp(self.clock(), timezone.utc)
        rows = [(*(self._key_value(d, f.name, f.dataType.simpleString()) for f in key_schema.fields),
                 dict(zip(POSITION_FIELDS, d.order())), now, SCOPE_KEY) for d in deletes]
        if new_floor is not None:
            rows.append((*(None for _ in key_schema.fields), dict(zip(POSITION_FIELDS, new_floor)), now, SCOPE_TABLE))
        return rows

    def purge(self, session: "SparkSession", horizon_seconds: float) -> int:
        """Delete the tombstones of deletes applied longer than ``horizon_seconds`` ago; how many."""
        if not tables.exists(session, self.tombstones):
            return 0
        cutoff = round((self.clock() - horizon_seconds) * 1_000_000)
        answer = run_sql(session, f"DELETE FROM {self.tombstones.sql} WHERE {SCOPE_COLUMN} = '{SCOPE_KEY}' "
                                  f"AND {DELETED_AT_COLUMN} < timestamp_micros({cutoff})").collect()
        return int(answer[0][0]) if answer and answer[0][0] is not None else 0
