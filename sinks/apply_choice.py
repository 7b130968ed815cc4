"""How a table's change batches reach its replica: MERGE, or a rewrite of the whole replica.

Pure: no pyspark import. The runner gathers :class:`ReplicaFacts` when it prepares a table and
the chooser decides; the executors are :mod:`lakemirror.sinks.delta_merge` and
:mod:`lakemirror.sinks.delta_rewrite`.

A Delta MERGE makes two passes over the replica: one join finds the files that hold a changed key,
a second join rewrites those files. On a small replica with changes spread over its keys every
file holds one, so both passes read all of it. A rewrite reads it once and replaces it in one
commit. ``make bench`` (apply cost) measured 1.56 s against 2.05 s per warm batch on a 100k-row
replica (docs/BENCHMARKS.md).

A rewrite is chosen only when it gives the same replica and history a reader can rely on:

- the replica is no larger than ``rewrite_below_bytes`` (above it, a MERGE's file pruning on
  clustered changes and deletion vectors win; ``0`` turns rewrites off);
- the replica has no change data feed of its own (a rewrite would record every row as changed),
  and no deletion vectors (turned on so that a MERGE writes only the changed rows: a rewrite
  would write every row again);
- the replica has exactly the columns the batches carry (a MERGE keeps a column it does not set;
  a rewrite would not);
- the session reports observed metrics (classic PySpark: local or Databricks). Over Spark
  Connect the rewrite could not tell its own write from a replay Delta skipped, so it MERGEs.

A table keeps the choice while it runs; a rewriting table whose replica grows past the limit
(judged from its row count, observed by each rewrite, times the bytes per row measured when it was
prepared) switches to MERGE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

#: Bytes of replica per file a rewrite writes (at the default limit: at most four files).
REWRITE_FILE_BYTES = 16 * 1024 * 1024
DEFAULT_REWRITE_BELOW_BYTES = 64 * 1024 * 1024
CDF_PROPERTY = "delta.enableChangeDataFeed"
DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"


@dataclass(frozen=True)
class ReplicaFacts:
    size_bytes: int
    rows: int
    columns: tuple[str, ...]
    properties: Mapping[str, str]
    observable: bool  # the session reports a write's observed metrics (classic PySpark)


@dataclass(frozen=True)
class ApplyChoice:
    rewrite: bool
    reason: str
    bytes_per_row: float = 0.0
    limit_bytes: int = 0

    def still_small(self, rows: int) -> bool:
        """Whether a replica of ``rows`` rows is still within the rewrite limit."""
        return rows * self.bytes_per_row <= self.limit_bytes

    def files_for(self, rows: int) -> int:
        """How many files a rewrite of ``rows`` rows writes."""
        return max(1, math.ceil(rows * self.bytes_per_row / REWRITE_FILE_BYTES))


def _mib(n: float) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def choose_apply(facts: ReplicaFacts, batch_columns: Sequence[str], rewrite_below_bytes: int) -> ApplyChoice:
    """Rewrite or MERGE, with the reason in words (the runner logs it)."""
    merge = "applies by MERGE: "
    if rewrite_below_bytes <= 0:
        return ApplyChoice(False, merge + "rewrites are off (rewrite_below_bytes: 0)")
    if facts.size_bytes > rewrite_below_bytes:
        return ApplyChoice(False, merge + f"the replica ({_mib(facts.size_bytes)}) is larger than "
                                          f"rewrite_below_bytes ({_mib(rewrite_below_bytes)})")
    if str(facts.properties.get(CDF_PROPERTY, "false")).lower() == "true":
        return ApplyChoice(False, merge + "the replica has a change data feed of its own, which a rewrite "
                                          "would fill with every row")
    if str(facts.properties.get(DELETION_VECTORS_PROPERTY, "false")).lower() == "true":
        return ApplyChoice(False, merge + "the replica has deletion vectors on, so a MERGE writes only the changed "
                                          "rows where a rewrite would write every row")
    if sorted(c.lower() for c in facts.columns) != sorted(c.lower() for c in batch_columns):
        return ApplyChoice(False, merge + "the replica's columns differ from the replicated ones "
                                          f"({', '.join(facts.columns)} against {', '.join(batch_columns)})")
    if not facts.observable:
        return ApplyChoice(False, merge + "the session does not report observed metrics (Spark Connect)")
    if facts.rows <= 0:
        return ApplyChoice(False, merge + "the replica is empty, so its size per row (which bounds a growing "
                                          "replica's rewrites) is unknown")
    per_row = facts.size_bytes / facts.rows
    return ApplyChoice(True, f"applies by rewriting the replica: {_mib(facts.size_bytes)}, at most "
                             f"{_mib(rewrite_below_bytes)} (rewrite_below_bytes)", per_row, rewrite_below_bytes)
