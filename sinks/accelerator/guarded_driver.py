"""The driver executor of the sequence guard: one batch of an event source's winners applied to a
Delta replica by one delta-rs MERGE on the driver, and its tombstones appended by delta-rs.

Chosen per replica by :func:`lakemirror.sinks.merge.apply_choice.choose_guarded_apply`;
:class:`lakemirror.sinks.events.guard_merge.GuardedDeltaSink` dispatches here and keeps Spark's MERGE
for what this path does not take. The rules are the Spark path's, carried out without a Spark job:

- the tombstone guard: the batch's keys are looked up in the replica's tombstone table (read by
  delta-rs), and a winner that a tombstone of its key or the table's truncate floor is as new as is
  dropped before the MERGE (the Spark path's anti-joins);
- the row guard: the MERGE updates or deletes a matched row only when the winner's position is
  strictly newer than the row's (Delta's struct ordering, compared by DataFusion as Spark does:
  field by field); a winner matching no row inserts unless it is a delete;
- exactly once: the MERGE carries the Delta transaction id (app id, batch id) and the batch's tag,
  as Spark's does, and is skipped when the replica holds that transaction already; a MERGE that
  changed no file commits an empty transaction so its replay is recognised. The tombstones carry a
  transaction id of their own, checked the same way, so a crash between the two commits is repaired
  by the replayed batch whichever engine replays it.

A batch with a truncate (a new table-wide floor) goes to Spark: delta-rs cannot record the floor's
``WHEN NOT MATCHED BY SOURCE`` condition in its commit (:class:`GuardedBatchUnfit`). A MERGE delta-rs
refuses because of a row's value (a ``CHECK`` constraint: "rows failed validation check") is raised as
it is, not as unfit: the replica stays on this path and the caller isolates the row
(:mod:`lakemirror.supervisor.events.dead_letters`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from lakemirror.delta_log.commit_hooks import post_commit_hooks
from lakemirror.sinks.accelerator.driver_apply import DRIVER_MERGE_MEMORY_BYTES, commit_properties, sql_name
from lakemirror.sinks.isolate import refused_by_value
from lakemirror.sinks.events.guard_plan import OP_COLUMN, POSITION_COLUMN, POSITION_FIELDS, SCOPE_COLUMN, SCOPE_KEY, SCOPE_TABLE
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId, counts_from_metrics
from lakemirror.sources.change_event import DELETE, Order

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

S, T = "s", "t"


class GuardedBatchUnfit(Exception):
    """The driver cannot apply this batch and has committed nothing: Spark applies it."""


def _order(position: dict[str, Any] | None) -> Order | None:
    return None if position is None else tuple(int(position[f]) for f in POSITION_FIELDS)  # type: ignore[return-value]


#: How delta-rs reaches a table: its URI and storage options (credentials: never logged), as
#: :func:`lakemirror.object_store.delta_rs_target` answers.
Target = tuple[str, dict[str, str]]


class GuardedDriverMerge:
    """A replica and its tombstone table, written by delta-rs on the driver: at a local path, or in
    S3 through the session's s3a settings."""

    def __init__(self, replica: Target, tombstones: Target) -> None:
        self.replica_path, self._replica_options = replica
        self.tombstones_path, self._tombstone_options = tombstones
        self._tables: dict[str, Any] = {}

    # -- tables ---------------------------------------------------------------------------------

    def _current(self, path: str) -> Any:
        """The delta-rs table at ``path``, brought up to date (only the commits since are read)."""
        from deltalake import DeltaTable

        table = self._tables.get(path)
        if table is not None:
            try:
                table.update_incremental()
                return table
            except Exception:  # noqa: BLE001 (load it afresh)
                pass
        options = self._replica_options if path == self.replica_path else self._tombstone_options
        table = self._tables[path] = DeltaTable(path, storage_options=options or None)
        return table

    def replica(self) -> Any:
        return self._current(self.replica_path)

    def forget(self) -> None:
        """Load both tables afresh next time (after a failure, or a change made by Spark)."""
        self._tables.clear()

    def arrow_schema(self, table: Any) -> "pa.Schema":
        import pyarrow as pa

        return pa.schema(table.schema().to_arrow())

    # -- the guard ------------------------------------------------------------------------------

    def tombstone_orders(self, key_columns: Sequence[str], keys: "pa.Table") -> tuple[dict[tuple[Any, ...], Order], Order | None]:
        """The newest tombstone order of each of ``keys`` that has one, and the truncate floor.

        The scan keeps only the floor rows and the rows whose first key column is one of the batch's
        (Arrow's filter, so memory follows the batch, not the tombstone table); the whole key is then
        compared as Arrow gives values back: NULL equal to NULL, as Spark's ``<=>``."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        first = keys[key_columns[0]].combine_chunks()
        wanted = ds.field(key_columns[0]).isin(first.drop_null())
        if first.null_count:
            wanted = wanted | ds.field(key_columns[0]).is_null()
        scan = (ds.field(SCOPE_COLUMN) == SCOPE_TABLE) | ((ds.field(SCOPE_COLUMN) == SCOPE_KEY) & wanted)
        stones = (self._current(self.tombstones_path).to_pyarrow_dataset()
                  .to_table(columns=[*key_columns, POSITION_COLUMN, SCOPE_COLUMN], filter=scan))
        floor: Order | None = None
        for p in stones.filter(pc.equal(stones[SCOPE_COLUMN], SCOPE_TABLE))[POSITION_COLUMN].to_pylist():
            o = _order(p)
            if o is not None and (floor is None or o > floor):
                floor = o
        keyed = stones.filter(pc.equal(stones[SCOPE_COLUMN], SCOPE_KEY))
        newest: dict[tuple[Any, ...], Order] = {}
        columns = [keyed[k].to_pylist() for k in key_columns]
        for key, p in zip(zip(*columns), keyed[POSITION_COLUMN].to_pylist()):
            o = _order(p)
            if o is not None and (key not in newest or o > newest[key]):
                newest[key] = o
        return newest, floor

    def _unguarded(self, source: "pa.Table", key_columns: Sequence[str]) -> "pa.Table":
        """``source`` without the winners a tombstone of their key, or the truncate floor, is as new as."""
        import pyarrow as pa

        newest, floor = self.tombstone_orders(key_columns, source.select(list(key_columns)))
        if not newest and floor is None:
            return source
        keys = zip(*[source[k].to_pylist() for k in key_columns])
        keep = []
        for key, p in zip(keys, source[POSITION_COLUMN].to_pylist()):
            order = _order(p)
            assert order is not None  # every winner carries its position
            stone = newest.get(key)
            keep.append(not ((stone is not None and stone >= order) or (floor is not None and floor >= order)))
        return source.filter(pa.array(keep, pa.bool_()))

    # -- the writes -----------------------------------------------------------------------------

    def committed(self, table: Any, txn: TxnId) -> bool:
        version = table.transaction_version(txn.app_id)
        return version is not None and version >= txn.version

    def _source(self, replica: Any, rows: Sequence[tuple[Any, ...]], data_columns: Sequence[str]) -> "pa.Table":
        """``rows`` (``data_columns``, the position, the operation) as Arrow in the replica's own types."""
        import pyarrow as pa

        replica_schema = self.arrow_schema(replica)
        if sorted(replica_schema.names) != sorted([*data_columns, POSITION_COLUMN]):
            raise GuardedBatchUnfit("the replica's columns as delta-rs reads them differ from Spark's "
                                    f"({', '.join(replica_schema.names)})")
        fields = [*(replica_schema.field(n) for n in data_columns), replica_schema.field(POSITION_COLUMN),
                  pa.field(OP_COLUMN, pa.string())]
        try:
            return pa.table([pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(fields)],
                            schema=pa.schema(fields))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise GuardedBatchUnfit(f"the batch's values do not convert to Arrow ({exc})") from exc

    def merge(self, rows: Sequence[tuple[Any, ...]], data_columns: Sequence[str], key_columns: Sequence[str],
              txn: TxnId) -> ApplyCounts | None:
        """Apply ``rows`` (each winner's ``data_columns``, position and operation) under ``txn``; None when
        the replica holds ``txn`` already (a replay: nothing written)."""
        replica = self.replica()
        if self.committed(replica, txn):
            return None
        read_version = replica.version()
        source = self._unguarded(self._source(replica, rows, data_columns), key_columns)
        newer = f"({T}.{POSITION_COLUMN} IS NULL OR {S}.{POSITION_COLUMN} > {T}.{POSITION_COLUMN})"
        op = f"{S}.{sql_name(OP_COLUMN)}"
        on = " AND ".join(f"({T}.{sql_name(k)} IS NOT DISTINCT FROM {S}.{sql_name(k)})" for k in key_columns)
        try:
            metrics = dict(replica.merge(source, on, source_alias=S, target_alias=T,
                                         max_spill_size=DRIVER_MERGE_MEMORY_BYTES, commit_properties=commit_properties(txn),
                                         post_commithook_properties=post_commit_hooks(read_version + 1))
                           .when_matched_delete(f"{newer} AND {op} = '{DELETE}'")
                           .when_matched_update_all(newer, except_cols=[OP_COLUMN])
                           .when_not_matched_insert_all(f"{op} <> '{DELETE}'", except_cols=[OP_COLUMN])
                           .execute())
        except Exception as exc:
            self.forget()
            if self.committed(self.replica(), txn):
                raise  # it landed after all: the replayed batch finds it
            if refused_by_value(str(exc)):
                raise  # a row the replica refuses (a CHECK constraint): the caller isolates it, on this path
            raise GuardedBatchUnfit(f"{self.replica_path}: delta-rs could not apply batch {txn.version}: {exc}") from exc
        if replica.version() == read_version:  # nothing changed a file, so delta-rs committed nothing
            replica.create_write_transaction([], "append", replica.schema(), commit_properties=commit_properties(txn),
                                             post_commithook_properties=post_commit_hooks(read_version + 1))
        return counts_from_metrics(metrics)

    def append_tombstones(self, rows: Sequence[dict[str, Any]], txn: TxnId) -> bool:
        """Append ``rows`` (the tombstone table's columns by name) in one commit under ``txn``; False
        when the tombstone table holds ``txn`` already."""
        import pyarrow as pa
        from deltalake import write_deltalake

        table = self._current(self.tombstones_path)
        if self.committed(table, txn):
            return False
        data = pa.Table.from_pylist(list(rows), schema=self.arrow_schema(table))
        write_deltalake(self.tombstones_path, data, mode="append", storage_options=self._tombstone_options or None,
                        commit_properties=commit_properties(txn),
                        post_commithook_properties=post_commit_hooks(table.version() + 1))
        return True
