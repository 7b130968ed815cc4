"""The history (SCD type 2) Delta executor: one batch's :class:`~lakemirror.sinks.events.history_plan.HistoryTablePlan`,
folded into the replica's versions with one MERGE under a Delta transaction id.

Thin: what to write comes from :func:`lakemirror.sinks.events.history_plan.plan_history`; this module reads
what the plan needs, converts values to the replica's types and carries the write out.

The replica holds one row per key version: the source's columns, ``valid_from`` / ``valid_to`` (the
source commit times, ``ts_ms``, of the changes that opened and closed the version; ``valid_to`` is
NULL while it is current), ``is_current``, ``_lakemirror_position`` (the order that opened the
version) and ``_lakemirror_end_position`` (the order that closed it). Closes that end no version,
and every truncate, are remembered in the replica's tombstone table
(``<replica>__lakemirror_tombstones``, one row per (scope, key, order), with the close's source time
in ``_lakemirror_ts_ms``); remembered deletes are purged past the tombstone horizon like the
current-rows tombstones.

Per batch:

1. the replica and its tombstone table are created on first use; a replica that already holds
   current rows (no history columns) is refused: history needs a replica of its own;
2. upserts whose values do not fit the replica's types are returned as rejected (dead letters) and
   left out of the fold;
3. read: the versions of the batch's keys that end at or after the batch's oldest order, the
   remembered closes of those keys, the table's truncates and, for a truncate older than stored
   history, the keys with closed versions spanning it;
4. one MERGE on (key, ``_lakemirror_position``): new versions inserted, stored versions given their
   new end; with a new truncate, current versions of other keys that started before it are closed
   (``WHEN NOT MATCHED BY SOURCE``);
5. before that MERGE, the closes to remember: one MERGE (insert if absent) into the tombstone table
   under a transaction id of its own. A remembered close is a fact about the source and changes no
   fold, so writing it first is harmless; written after, a close that the replica's MERGE cuts off a
   version's end (a late, older delete) would be lost by a crash between the two commits. A crash
   after the first commit replays the batch: Delta skips the tombstones' MERGE, the replica's runs.
   A new truncate is remembered after the replica's MERGE (a third commit, under an id of its own),
   because only a truncate not yet remembered closes the current versions of untouched keys.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Sequence

from lakemirror import tables
from lakemirror.identifiers import quote
from lakemirror.sinks.merge.delta_merge import counts_from_answer
from lakemirror.sinks.events.event_rows import convert_row
from lakemirror.sinks.events.guard_merge import S, T, GuardedDeltaSink, GuardOutcome, position_sql
from lakemirror.sinks.events.guard_plan import (
    DELETED_AT_COLUMN, POSITION_COLUMN, POSITION_FIELDS, RESERVED_COLUMNS, SCOPE_COLUMN, SCOPE_KEY, SCOPE_TABLE, Key,
    row_order,
)
from lakemirror.sinks.events.history_plan import (
    END_POSITION_COLUMN, HISTORY_COLUMNS, IS_CURRENT, VALID_FROM, VALID_TO, Close, HistoryTablePlan, HistoryWrite,
    StoredHistory, Version, plan_history,
)
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId, transaction
from lakemirror.sources.change_event import UPSERT, ChangeEvent, Order
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: Tombstone table of a history replica: the source commit time of the remembered close.
TS_MS_COLUMN = "_lakemirror_ts_ms"
_FROM_MS, _TO_MS = "_lakemirror_from_ms", "_lakemirror_to_ms"
POSITION_TYPE = "STRUCT<" + ", ".join(f"{f}: BIGINT" for f in POSITION_FIELDS) + ">"


class HistoryReplicaMismatch(ValueError):
    """The replica exists without history columns: it holds current rows, not versions."""


def _position(order: Order | None) -> dict[str, int] | None:
    return dict(zip(POSITION_FIELDS, order)) if order is not None else None


def _or(conditions: Sequence[str]) -> str:
    return "(" + " OR ".join(conditions) + ")" if conditions else "false"


@dataclass
class HistoryDeltaSink(GuardedDeltaSink):
    """Applies history plans to one Delta replica (one row per key version) and its tombstone table."""

    # -- tables ---------------------------------------------------------------------------------

    def ensure_history(self, session: "SparkSession", plan: HistoryTablePlan) -> tuple["StructType", tuple[str, ...]]:
        existed = tables.exists(session, self.replica)
        schema, added = self.ensure(session, plan)  # type: ignore[arg-type]  # the same shape as a TablePlan
        have = {f.name.lower() for f in schema.fields}
        if not {c.lower() for c in HISTORY_COLUMNS} <= have:
            if existed and tables.read(session, self.replica).limit(1).count():
                raise HistoryReplicaMismatch(
                    f"{self.replica} holds current rows (no {IS_CURRENT} column), not history: history scd2 needs a "
                    f"replica of its own: give the pipeline another destination_schema")
            run_sql(session, f"ALTER TABLE {self.replica.sql} ADD COLUMNS ({VALID_FROM} TIMESTAMP, {VALID_TO} TIMESTAMP, "
                             f"{IS_CURRENT} BOOLEAN, {END_POSITION_COLUMN} {POSITION_TYPE})")
        stones = self._schema(session, self.tombstones)
        if stones is not None and TS_MS_COLUMN not in {f.name for f in stones.fields}:
            run_sql(session, f"ALTER TABLE {self.tombstones.sql} ADD COLUMNS ({TS_MS_COLUMN} BIGINT)")
        widened = self._schema(session, self.replica)
        assert widened is not None
        self._ensured = widened  # what ensure() answers next: the replica with its history columns
        return widened, added

    # -- reading what the plan needs ------------------------------------------------------------

    def _keys_frame(self, session: "SparkSession", keys: Sequence[Key], key_schema: "StructType") -> "DataFrame":
        return session.createDataFrame([tuple(k) for k in keys], key_schema)

    def _version(self, row: Any, key_columns: Sequence[str], data: Sequence[str]) -> Version:
        end = row[END_POSITION_COLUMN]
        return Version(tuple(row[k] for k in key_columns), row_order(row[POSITION_COLUMN].asDict()),  # type: ignore[arg-type]
                       {c: row[c] for c in data}, row_order(end.asDict()) if end is not None else None,
                       row[_FROM_MS], row[_TO_MS])

    def read_stored(self, session: "SparkSession", plan: HistoryTablePlan, key_schema: "StructType",
                    data: Sequence[str]) -> StoredHistory:
        from pyspark.sql import functions as F

        keys = plan.key_columns
        stones = tables.read(session, self.tombstones)
        truncates = [Close(None, row_order(r[POSITION_COLUMN].asDict()), r[TS_MS_COLUMN])  # type: ignore[arg-type]
                     for r in stones.where(F.col(SCOPE_COLUMN) == SCOPE_TABLE).collect()]
        known = {t.order for t in truncates}
        new = sorted(t.order() for t in plan.truncates if t.order() not in known)
        replica = tables.read(session, self.replica)
        wanted = self._keys_frame(session, list(plan.changes), key_schema)
        if new:  # keys whose closed versions span a truncate older than stored history
            spanning = replica.where(F.expr(f"{END_POSITION_COLUMN} IS NOT NULL AND " + _or(
                [f"({POSITION_COLUMN} < {position_sql(o)} AND {END_POSITION_COLUMN} > {position_sql(o)})" for o in new])))
            wanted = wanted.unionByName(spanning.select(*[quote(k) for k in keys])).distinct()
        oldest = plan.oldest()
        versions_frame = replica.alias(T).join(wanted.alias(S), F.expr(self._on(keys)), "left_semi")
        if oldest is not None:
            versions_frame = versions_frame.where(F.expr(f"{END_POSITION_COLUMN} IS NULL OR "
                                                         f"{END_POSITION_COLUMN} >= {position_sql(oldest)}"))
        rows = versions_frame.select(
            *[quote(c) for c in data], POSITION_COLUMN, END_POSITION_COLUMN,
            F.expr(f"unix_millis({VALID_FROM})").alias(_FROM_MS), F.expr(f"unix_millis({VALID_TO})").alias(_TO_MS),
        ).collect()
        versions: dict[Key, list[Version]] = {}
        for r in rows:
            v = self._version(r, keys, data)
            versions.setdefault(v.key, []).append(v)
        closes: dict[Key, list[Close]] = {}
        if plan.changes:
            found = (stones.where(F.col(SCOPE_COLUMN) == SCOPE_KEY).alias(T)
                     .join(self._keys_frame(session, list(plan.changes), key_schema).alias(S),
                           F.expr(self._on(keys)), "left_semi").collect())
            for r in found:
                key = tuple(r[k] for k in keys)
                closes.setdefault(key, []).append(Close(key, row_order(r[POSITION_COLUMN].asDict()),  # type: ignore[arg-type]
                                                        r[TS_MS_COLUMN]))
        return StoredHistory(versions, closes, truncates)

    # -- apply ----------------------------------------------------------------------------------

    def _typed(self, plan: HistoryTablePlan, types: dict[str, str],
               data: Sequence[str]) -> tuple[HistoryTablePlan, list[tuple[ChangeEvent, str]]]:
        """The plan keyed by the replica's key values, its upserts' values converted; misfits rejected."""
        changes: dict[Key, tuple[ChangeEvent, ...]] = {}
        rejected: list[tuple[ChangeEvent, str]] = []
        for key, events in plan.changes.items():
            try:
                typed = convert_row(dict(zip(plan.key_columns, key)), types, plan.key_columns)
                typed_key = tuple(typed[k] for k in plan.key_columns)
            except ValueError as exc:
                rejected += [(e, f"key does not fit the replica: {exc}") for e in events]
                continue
            kept = []
            for e in events:
                if e.op == UPSERT:
                    try:
                        columns = convert_row(e.columns, types, data)
                    except ValueError as exc:
                        rejected.append((e, f"does not fit the replica's schema: {exc}"))
                        continue
                    e = replace(e, columns=columns)
                kept.append(e)
            if kept:
                changes[typed_key] = tuple(kept)
        return replace(plan, changes=changes), rejected

    def apply(self, session: "SparkSession", plan: HistoryTablePlan, txn: TxnId) -> GuardOutcome:  # type: ignore[override]
        """Fold ``plan`` into the replica's history under ``txn`` (app id names the replica, version the batch)."""
        from pyspark.sql.types import StructType

        if not plan.key_columns:  # only truncates: the keys are those the tombstone table was made with
            stones = self._schema(session, self.tombstones)
            if stones is None:
                log.info("%s: a truncate before any row: nothing to truncate", self.replica)
                return GuardOutcome(ApplyCounts(), False)
            plan = replace(plan, key_columns=tuple(f.name for f in stones.fields
                                                   if f.name not in (*RESERVED_COLUMNS, TS_MS_COLUMN)))
        clash = sorted(set(plan.column_names()) & set(HISTORY_COLUMNS))
        if clash:
            reason = f"column(s) {clash} are the replica's history columns; rename them at the source"
            return GuardOutcome(ApplyCounts(), False, rejected=tuple((e, reason) for evs in plan.changes.values()
                                                                     for e in evs))
        schema, added = self.ensure_history(session, plan)
        types = {f.name: f.dataType.simpleString() for f in schema.fields}
        reserved = {POSITION_COLUMN, *HISTORY_COLUMNS}
        data = [f.name for f in schema.fields if f.name not in reserved]
        key_schema = StructType([schema[k] for k in plan.key_columns])
        plan, rejected = self._typed(plan, types, data)
        write = plan_history(plan, self.read_stored(session, plan, key_schema, data))
        # closes first: a remembered close is a fact about the source, harmless before the MERGE, whereas
        # one the MERGE cuts off a version's end would be lost if the process died between the two commits
        # (truncates after it: a truncate already remembered is not new, and only a new one closes the
        # current versions of untouched keys)
        deletes = [c for c in write.closes if c.key is not None]
        written = self._remember(session, plan, deletes, key_schema, TxnId(txn.app_id + "/tombstones", txn.version))
        if not (write.inserts or write.updates or write.truncates):
            return GuardOutcome(ApplyCounts(), False, 0, write.stale, tuple(rejected), added, written)
        if written:
            self.fault("events_after_closes")
        with transaction(session, txn):
            answer = self._merge(session, schema, plan, write, data).execute().collect()
        counts = counts_from_answer(answer[0].asDict()) if answer else ApplyCounts()
        self.fault("events_after_replica_merge")
        written += self._remember(session, plan, [c for c in write.closes if c.key is None], key_schema,
                                  TxnId(txn.app_id + "/truncates", txn.version))
        return GuardOutcome(counts, not answer, len(write.inserts) + len(write.updates), write.stale, tuple(rejected),
                            added, written)

    def _merge(self, session: "SparkSession", schema: "StructType", plan: HistoryTablePlan, write: HistoryWrite,
               data: Sequence[str]) -> Any:
        from pyspark.sql.types import BooleanType, LongType, StructField, StructType

        def row(v: Version, new: bool) -> tuple[Any, ...]:
            key = dict(zip(plan.key_columns, v.key))   # an update sets only the end: its columns stay as stored
            cells = [key[c] if c in key else (v.columns.get(c) if new else None) for c in data]
            return (*cells, _position(v.start), _position(v.end), v.is_current, v.start_ts_ms, v.end_ts_ms)

        rows = [row(v, True) for v in write.inserts] + [row(v, False) for v in write.updates]
        source_schema = StructType([*[schema[c] for c in data], schema[POSITION_COLUMN],
                                    StructField(END_POSITION_COLUMN, schema[POSITION_COLUMN].dataType),
                                    StructField(IS_CURRENT, BooleanType()), StructField(_FROM_MS, LongType()),
                                    StructField(_TO_MS, LongType())])
        source = session.createDataFrame(rows, source_schema)
        ends: dict[str, str | Column] = {VALID_TO: f"timestamp_millis({S}.{_TO_MS})", IS_CURRENT: f"{S}.{IS_CURRENT}",
                END_POSITION_COLUMN: f"{S}.{END_POSITION_COLUMN}"}
        values: dict[str, str | Column] = {quote(c): f"{S}.{quote(c)}" for c in data}
        values.update({POSITION_COLUMN: f"{S}.{POSITION_COLUMN}", VALID_FROM: f"timestamp_millis({S}.{_FROM_MS})",
                       **ends})
        on = f"{self._on(plan.key_columns)} AND {T}.{POSITION_COLUMN} = {S}.{POSITION_COLUMN}"
        merge = (tables.delta_table(session, self.replica).alias(T).merge(source.alias(S), on)
                 .whenMatchedUpdate(set=ends).whenNotMatchedInsert(values=values))
        for t in sorted(write.truncates, key=lambda t: t.order):  # the oldest truncate after a version's start wins
            ts = f"timestamp_millis(CAST({t.ts_ms} AS BIGINT))" if t.ts_ms is not None else "CAST(NULL AS TIMESTAMP)"
            merge = merge.whenNotMatchedBySourceUpdate(
                condition=f"{T}.{IS_CURRENT} AND {T}.{POSITION_COLUMN} < {position_sql(t.order)}",
                set={VALID_TO: ts, IS_CURRENT: "false", END_POSITION_COLUMN: position_sql(t.order)})
        return merge

    def _remember(self, session: "SparkSession", plan: HistoryTablePlan, closes: Sequence[Close],
                  key_schema: "StructType", txn: TxnId) -> int:
        from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

        if not closes:
            return 0
        stones_schema = tables.read(session, self.tombstones).schema
        now = datetime.fromtimestamp(self.clock(), timezone.utc)
        rows = [(*(c.key if c.key is not None else tuple(None for _ in key_schema.fields)), _position(c.order), now,
                 SCOPE_KEY if c.key is not None else SCOPE_TABLE, c.ts_ms) for c in closes]
        source = session.createDataFrame(rows, StructType([
            *key_schema.fields, stones_schema[POSITION_COLUMN], StructField(DELETED_AT_COLUMN, TimestampType()),
            StructField(SCOPE_COLUMN, StringType()), StructField(TS_MS_COLUMN, LongType())]))
        columns = [*plan.key_columns, POSITION_COLUMN, DELETED_AT_COLUMN, SCOPE_COLUMN, TS_MS_COLUMN]
        on = (f"{T}.{SCOPE_COLUMN} = {S}.{SCOPE_COLUMN} AND {self._on(plan.key_columns)} "
              f"AND {T}.{POSITION_COLUMN} = {S}.{POSITION_COLUMN}")
        with transaction(session, txn):
            (tables.delta_table(session, self.tombstones).alias(T).merge(source.alias(S), on)
             .whenNotMatchedInsert(values={quote(c): f"{S}.{quote(c)}" for c in columns}).execute())
        return len(rows)
