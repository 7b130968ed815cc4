"""The planner's winning-change rule on an Arrow table of change-feed rows (no Spark).

The driver path (:mod:`lakemirror.sinks.driver_apply`) brings a batch to the driver as Arrow and
picks the winning change per key here. The rule is the planner's (:mod:`lakemirror.sinks.planner`,
CDC_SEMANTICS.md §1-3), and a unit test holds the two to the same answers:

- ``update_preimage`` rows are never applied;
- per key, the latest change wins: highest ``_commit_version``, and inside one version a delete
  ranks below an insert or postimage (an overwrite deletes, then re-inserts the key);
- keys compare null-safe: NULL is a key value like any other (an Arrow group-by groups NULLs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from lakemirror.sinks.planner import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, DELETE, OP_COLUMN, UPDATE_PRE
from lakemirror.sinks.txn import BatchStats

if TYPE_CHECKING:
    import pyarrow as pa

_RANK = "__lm_rank"
_ROW = "__lm_row"


def batch_stats(changes: "pa.Table") -> BatchStats:
    """Rows, version range and newest commit time of a batch, as the Spark path's statistics."""
    import pyarrow.compute as pc

    if changes.num_rows == 0:
        return BatchStats(0, None, None, None)
    versions = pc.min_max(changes[COMMIT_VERSION]).as_py()
    newest = pc.max(changes[COMMIT_TIMESTAMP]).as_py()
    return BatchStats(changes.num_rows, versions["min"], versions["max"],
                      newest.timestamp() if newest is not None else None)


def winning_changes(changes: "pa.Table", keys: Sequence[str], columns: Sequence[str]) -> "pa.Table":
    """One row per key, the winning change: ``columns`` and its change type as ``__lm_op``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    applicable = changes.filter(pc.not_equal(changes[CHANGE_TYPE], UPDATE_PRE))
    rank = pc.if_else(pc.equal(applicable[CHANGE_TYPE], DELETE), 0, 1)
    ordered = (applicable.append_column(_RANK, rank)
               .sort_by([(COMMIT_VERSION, "ascending"), (_RANK, "ascending")]))
    ordered = ordered.append_column(_ROW, pa.array(range(ordered.num_rows), pa.int64()))
    last = ordered.group_by(list(keys), use_threads=False).aggregate([(_ROW, "max")])[f"{_ROW}_max"]
    winners = ordered.take(last)
    return (winners.select([*columns, CHANGE_TYPE])
            .rename_columns([*columns, OP_COLUMN]))
