"""The planner's winning-change rule on an Arrow table of change-feed rows (no Spark).

The driver path (:mod:`lakemirror.sinks.accelerator.driver_apply`) brings a batch to the driver as Arrow and
picks the winning change per key here. The rule is the planner's (:mod:`lakemirror.sinks.merge.planner`:
Delta's change data feed semantics, as Databricks' AUTO CDC applies a Delta changelog), and a unit
test holds the two to the same answers:

- ``update_preimage`` rows are never applied;
- per key, the latest change wins: highest ``_commit_version``, and inside one version a delete
  ranks below an insert or postimage (an overwrite deletes, then re-inserts the key);
- keys compare null-safe: NULL is a key value like any other (an Arrow group-by groups NULLs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from lakemirror.sinks.merge.planner import (CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, DELETE, OP_COLUMN, UPDATE_POST,
                                      UPDATE_PRE)
from lakemirror.sinks.txn import BatchStats

if TYPE_CHECKING:
    import pyarrow as pa

_ROW = "__lm_row"


def batch_stats(changes: "pa.Table", preimages_dropped: bool = False) -> BatchStats:
    """Rows, version range and newest commit time of a batch, as the Spark path's statistics.

    ``preimages_dropped``: the batch was read without its ``update_preimage`` rows (the driver path
    leaves them in Spark; they are never applied). Delta writes an update's preimage and postimage
    as a pair, so each postimage counts for its preimage too and ``rows_read`` stays the change
    feed's own count; the versions and times are the pair's, and so unchanged."""
    import pyarrow.compute as pc

    if changes.num_rows == 0:
        return BatchStats(0, None, None, None)
    rows = changes.num_rows
    if preimages_dropped:
        rows += pc.sum(pc.equal(changes[CHANGE_TYPE], UPDATE_POST)).as_py() or 0
    versions = pc.min_max(changes[COMMIT_VERSION]).as_py()
    times = pc.min_max(changes[COMMIT_TIMESTAMP]).as_py()
    newest, oldest = times["max"], times["min"]
    return BatchStats(rows, versions["min"], versions["max"],
                      newest.timestamp() if newest is not None else None,
                      oldest.timestamp() if oldest is not None else None)


def winning_changes(changes: "pa.Table", keys: Sequence[str], columns: Sequence[str]) -> "pa.Table":
    """One row per key, the winning change: ``columns`` and its change type as ``__lm_op``.

    Only the keys, versions and change types are sorted and grouped, as row numbers; the winning
    rows are taken from ``changes`` once, so wide rows are copied once, not three times."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kinds = changes[CHANGE_TYPE]
    applicable = pc.indices_nonzero(pc.not_equal(kinds, UPDATE_PRE))
    kinds = kinds.take(applicable)
    # One sort key, version * 2 + rank (a delete ranks below an insert or postimage of its version):
    # a single int64 column sorts an order of magnitude faster than the pair.
    rank = pc.if_else(pc.equal(kinds, DELETE), 0, 1).cast(pa.int64())
    order = pc.add(pc.multiply(changes[COMMIT_VERSION].take(applicable).cast(pa.int64()), 2), rank)
    rows = applicable.take(pc.sort_indices(order))
    # In ascending (version, rank) order a key's winner is its last row: the highest position in
    # that order, whatever order the group-by meets the rows in. Positions 0..n-1, vectorised:
    positions = pc.indices_nonzero(pc.is_valid(rows))
    in_order = pa.table({**{k: changes[k].take(rows) for k in keys}, _ROW: positions})
    last = in_order.group_by(list(keys), use_threads=False).aggregate([(_ROW, "max")])[f"{_ROW}_max"]
    return (changes.take(rows.take(last)).select([*columns, CHANGE_TYPE])
            .rename_columns([*columns, OP_COLUMN]))
