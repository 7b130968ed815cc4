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
2. the tombstones of the batch's keys and the table's truncate floor are read; winners not newer
   than them are dropped (the guard, on the driver);
3. values are converted to the replica's types; an event whose value does not fit is returned as
   rejected (for the dead letters) and its key is left alone in this batch;
4. one MERGE: matched and newer → update or delete; not matched → insert upserts; with a new
   truncate floor, rows older than it that the batch does not touch → delete (``WHEN NOT MATCHED
   BY SOURCE``);
5. deletes and a new floor → one MERGE into the tombstone table (newer wins there too).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lakemirror import tables
from lakemirror.identifiers import TableName, quote
from lakemirror.sinks.merge.delta_merge import counts_from_answer
from lakemirror.sinks.events.event_rows import convert, infer_type
from lakemirror.sinks.events.guard_plan import (
    DELETED_AT_COLUMN, OP_COLUMN, POSITION_COLUMN, POSITION_FIELDS, RESERVED_COLUMNS, SCOPE_COLUMN, SCOPE_KEY, SCOPE_TABLE, TablePlan,
    row_order,
)
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId, transaction
from lakemirror.sources.change_event import DELETE, ChangeEvent, Order
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

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
    applied: int = 0                                # winners that passed the guard
    stale: int = 0          # winners not newer than their tombstone or the truncate floor (those not newer
                            # than the live row are skipped inside the MERGE and not counted here)
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
    tombstones: TableLocation = field(init=False)

    def __post_init__(self) -> None:
        self.tombstones = tombstones_of(self.replica)

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
                session.sql(f"ALTER TABLE {self.replica.sql} ADD COLUMNS ({cols})")
                log.info("%s: new columns from the events: %s", self.replica, ", ".join(new))
                added = tuple(new)
        schema = self._schema(session, self.replica)
        assert schema is not None
        if self._schema(session, self.tombstones) is None:
            key_types = {f.name: f.dataType.simpleString() for f in schema.fields}
            self._create(session, self.tombstones, [(k, key_types[k]) for k in plan.key_columns]
                         + [(POSITION_COLUMN, position_type), (DELETED_AT_COLUMN, "TIMESTAMP"),
                            (SCOPE_COLUMN, "STRING")])
        return schema, added

    # -- the guard ------------------------------------------------------------------------------

    def _on(self, keys: Sequence[str]) -> str:
        return " AND ".join(f"{T}.{quote(k)} <=> {S}.{quote(k)}" for k in keys)

    def _stored_orders(self, session: "SparkSession", plan: TablePlan,
                       key_schema: "StructType") -> tuple[dict[tuple[Any, ...], Order], Order | None]:
        """The tombstone orders of the batch's keys, and the table's truncate floor."""
        from pyspark.sql import functions as F

        stones = tables.read(session, self.tombstones)
        floor_row = stones.where(F.col(SCOPE_COLUMN) == SCOPE_TABLE).agg(F.max(POSITION_COLUMN).alias("p")).collect()
        floor = row_order(floor_row[0]["p"].asDict()) if floor_row and floor_row[0]["p"] is not None else None
        if not plan.winners:
            return {}, floor
        keys = session.createDataFrame([tuple(self._key_value(w, f.name, f.dataType.simpleString())
                                              for f in key_schema.fields) for w in plan.winners], key_schema)
        found = (stones.where(F.col(SCOPE_COLUMN) == SCOPE_KEY).alias(T)
                 .join(keys.alias(S), F.expr(self._on(plan.key_columns)), "left_semi").collect())
        return ({tuple(r[k] for k in plan.key_columns): row_order(r[POSITION_COLUMN].asDict()) for r in found},  # type: ignore[misc]
                floor)

    @staticmethod
    def _key_value(change: ChangeEvent, name: str, sql_type: str) -> Any:
        return convert(dict(change.keys)[name], sql_type)

    def apply(self, session: "SparkSession", plan: TablePlan, txn: TxnId) -> GuardOutcome:
        """Apply ``plan`` under ``txn`` (its app id names the replica; the version is the batch id)."""
        from pyspark.sql.types import StringType, StructField, StructType

        if not plan.key_columns:  # only a truncate: the keys are those the tombstone table was made with
            stones_schema = self._schema(session, self.tombstones)
            if stones_schema is None:
                log.info("%s: a truncate before any row: nothing to truncate", self.replica)
                return GuardOutcome(ApplyCounts(), False)
            plan = replace(plan, key_columns=tuple(f.name for f in stones_schema.fields
                                                   if f.name not in RESERVED_COLUMNS))
        schema, added = self.ensure(session, plan)
        types = {f.name: f.dataType.simpleString() for f in schema.fields}
        data_fields = [f for f in schema.fields if f.name != POSITION_COLUMN]
        key_schema = StructType([schema[k] for k in plan.key_columns])
        rejected: list[tuple[ChangeEvent, str]] = []
        try:
            stones, stored_floor = self._stored_orders(session, plan, key_schema)
        except ValueError as exc:  # a key value that does not fit the key column: the whole key set is suspect
            return GuardOutcome(ApplyCounts(), False, rejected=tuple((w, f"key does not fit the replica: {exc}")
                                                                      for w in plan.winners), added_columns=added)
        new_floor = plan.truncate if plan.truncate is not None and (
            stored_floor is None or plan.truncate > stored_floor) else None
        floor = max((o for o in (stored_floor, plan.truncate) if o is not None), default=None)
        rows, deletes, stale = [], [], 0
        for w in plan.winners:
            key = tuple(convert(dict(w.keys)[k], types[k]) for k in plan.key_columns)
            guard = max((o for o in (stones.get(key), floor) if o is not None), default=None)
            if guard is not None and w.order() <= guard:
                stale += 1
                continue
            try:
                values = [convert(w.columns.get(f.name), types[f.name]) if w.op != DELETE else
                          (key[plan.key_columns.index(f.name)] if f.name in plan.key_columns else None)
                          for f in data_fields]
            except ValueError as exc:
                rejected.append((w, f"does not fit the replica's schema: {exc}"))
                continue
            rows.append((*values, dict(zip(POSITION_FIELDS, w.order())), w.op))
            if w.op == DELETE:
                deletes.append(w)
        if not rows and new_floor is None:
            return GuardOutcome(ApplyCounts(), False, 0, stale, tuple(rejected), added)
        source_schema = StructType([*data_fields, schema[POSITION_COLUMN], StructField(OP_COLUMN, StringType())])
        source = session.createDataFrame(rows, source_schema)
        with transaction(session, txn):
            answer = self._merge_replica(session, source, plan, data_fields, new_floor).execute().collect()
        counts = counts_from_answer(answer[0].asDict()) if answer else ApplyCounts()
        self.fault("events_after_replica_merge")
        written = self._write_tombstones(session, plan, deletes, new_floor, key_schema,
                                         TxnId(txn.app_id + "/tombstones", txn.version))
        return GuardOutcome(counts, not answer, len(rows), stale, tuple(rejected), added, written)

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
                          new_floor: Order | None, key_schema: "StructType", txn: TxnId) -> int:
        from pyspark.sql.types import StringType, StructField, StructType, TimestampType

        if not deletes and new_floor is None:
            return 0
        stones_schema = tables.read(session, self.tombstones).schema
        now = datetime.fromtimestamp(self.clock(), timezone.utc)
        rows = [(*(self._key_value(d, f.name, f.dataType.simpleString()) for f in key_schema.fields),
                 dict(zip(POSITION_FIELDS, d.order())), now, SCOPE_KEY) for d in deletes]
        if new_floor is not None:
            rows.append((*(None for _ in key_schema.fields), dict(zip(POSITION_FIELDS, new_floor)), now, SCOPE_TABLE))
        source = session.createDataFrame(rows, StructType([*key_schema.fields, stones_schema[POSITION_COLUMN],
                                                           StructField(DELETED_AT_COLUMN, TimestampType()),
                                                           StructField(SCOPE_COLUMN, StringType())]))
        columns = [*plan.key_columns, POSITION_COLUMN, DELETED_AT_COLUMN, SCOPE_COLUMN]
        values: dict[str, str | Column] = {quote(c): f"{S}.{quote(c)}" for c in columns}
        merge = (tables.delta_table(session, self.tombstones).alias(T)
                 .merge(source.alias(S), f"{T}.{SCOPE_COLUMN} = {S}.{SCOPE_COLUMN} AND {self._on(plan.key_columns)}")
                 .whenMatchedUpdate(condition=f"{S}.{POSITION_COLUMN} > {T}.{POSITION_COLUMN}", set=values)
                 .whenNotMatchedInsert(values=values))
        if new_floor is not None:
            merge = merge.whenNotMatchedBySourceDelete(
                condition=f"{T}.{SCOPE_COLUMN} = '{SCOPE_KEY}' AND {T}.{POSITION_COLUMN} < {position_sql(new_floor)}")
        with transaction(session, txn):
            merge.execute()
        return len(rows)

    def purge(self, session: "SparkSession", horizon_seconds: float) -> int:
        """Delete the tombstones of deletes applied longer than ``horizon_seconds`` ago; how many."""
        if not tables.exists(session, self.tombstones):
            return 0
        cutoff = round((self.clock() - horizon_seconds) * 1_000_000)
        answer = session.sql(f"DELETE FROM {self.tombstones.sql} WHERE {SCOPE_COLUMN} = '{SCOPE_KEY}' "
                             f"AND {DELETED_AT_COLUMN} < timestamp_micros({cutoff})").collect()
        return int(answer[0][0]) if answer and answer[0][0] is not None else 0
