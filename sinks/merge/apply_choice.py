"""How a table's change batches reach its replica: a MERGE, a rewrite of the whole replica, or a
MERGE by delta-rs on the driver.

Pure: no pyspark import. The runner gathers :class:`ReplicaFacts` when it prepares a table and
the chooser decides; the executors are :mod:`lakemirror.sinks.merge.delta_merge`,
:mod:`lakemirror.sinks.merge.delta_rewrite` and :mod:`lakemirror.sinks.accelerator.driver_apply`.

A Delta MERGE makes two passes over the replica: one join finds the files that hold a changed key,
a second join rewrites those files. On a small replica with changes spread over its keys every
file holds one, so both passes read all of it. A rewrite reads it once and replaces it in one
commit, which is why small replicas are rewritten (``make bench ONLY=apply_cost`` times both paths).

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

A replica on the driver's own file system is applied on the driver (``driver_apply``, on by
default): the batch is planned by the table's Structured Streaming query (and read by delta-rs
when it holds whole source versions), and its winning changes reach the replica through one
delta-rs MERGE under the same Delta transaction id, with no Spark job for the write. Spark's Delta
writer has a fixed cost per commit (planning, jobs, the commit itself) whatever the batch, which
dominates a small batch; the driver path has none of it (``make bench ONLY=apply_cost`` times each
path). delta-rs's MERGE streams the replica, so the driver path takes replicas up to
``driver_apply_below_bytes`` (4 GiB by default), past ``rewrite_below_bytes``: it rewrites only the
files holding a changed key, where Spark's MERGE also pays its two joins
(``make bench ONLY=steady_cost`` compares a cycle's CPU with a full refresh's). A large replica
delta-rs refuses goes to Spark's MERGE, a small one to the rewrite. A replica with
deletion vectors on (which delta-rs does not write) is taken by :mod:`lakemirror.sinks.accelerator.dv_merge`
instead, which marks changed rows deleted in place (on the driver's file system only: it replays the
replica's log from its files); it falls back to Spark's MERGE. On top of the
rewrite's conditions (but its size) the driver path needs:

- ``driver_apply`` on and the ``deltalake`` package importable;
- the replica where the driver's delta-rs writes it (:func:`lakemirror.object_store.delta_rs_unreachable`):
  at a path on the driver's file system, or on S3 (``s3a://``) through the session's own s3a settings,
  on a store with conditional writes (each commit a put with ``If-None-Match``); not a
  catalog-managed table (Unity Catalog hands credentials to its own engines only), another store,
  or a remote session (Spark Connect);
- only protocol features delta-rs writes (:data:`lakemirror.delta_log.protocol.DELTA_RS_WRITER_FEATURES`);
- the replica's column names exactly the batch's (delta-rs matches names case-sensitively);
- key columns of plain types (the winning change per key is picked with an Arrow group-by).

A batch larger than the driver's share of memory (:data:`DRIVER_BATCH_BYTES`) is applied by Spark
instead, that batch only.

A table keeps the choice while it runs; a rewriting table whose replica grows past the limit
(judged from its row count, observed by each rewrite, times the bytes per row measured when it was
prepared) switches to MERGE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from lakemirror.delta_log.protocol import DELTA_RS_WRITER_FEATURES, DV_WRITER_FEATURES

MERGE, REWRITE, DRIVER = "merge", "rewrite", "driver"
#: Key types an Arrow group-by handles (a type name's start: ``decimal(10,2)`` is a decimal).
DRIVER_KEY_TYPES = ("tinyint", "smallint", "int", "bigint", "long", "short", "byte", "integer", "string",
                    "varchar", "char", "date", "timestamp", "boolean", "decimal", "binary")
#: A batch is brought to the driver only if its rows, at the replica's bytes per row (on disk,
#: compressed) times four, fit in this; a larger one is applied by Spark.
DRIVER_BATCH_BYTES = 512 * 1024 * 1024
DRIVER_BATCH_MAX_ROWS = 5_000_000
#: Bytes of replica per file a rewrite writes (at the default limit: at most four files).
REWRITE_FILE_BYTES = 16 * 1024 * 1024
DEFAULT_REWRITE_BELOW_BYTES = 64 * 1024 * 1024
#: Replicas up to this size (on disk) are MERGEd on the driver when it can take them, whatever
#: ``rewrite_below_bytes``: delta-rs's MERGE streams the replica rather than loading it whole, and its
#: memory is bounded by :data:`DRIVER_MERGE_MEMORY_BYTES`.
DEFAULT_DRIVER_APPLY_BELOW_BYTES = 4 * 1024 * 1024 * 1024
CDF_PROPERTY = "delta.enableChangeDataFeed"
DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"


@dataclass(frozen=True)
class ReplicaFacts:
    size_bytes: int
    rows: int
    columns: tuple[str, ...]
    properties: Mapping[str, str]
    observable: bool  # the session reports a write's observed metrics (classic PySpark)
    local: bool = False  # the replica is a path on the driver's file system
    #: The replica is on object storage (S3) that the driver's delta-rs writes with the session's
    #: settings, by conditional puts (:func:`lakemirror.object_store.delta_rs_unreachable` found nothing against it).
    object_store: bool = False
    #: Why the driver's delta-rs does not reach the replica, when it is neither local nor on such a store.
    unreachable: str = "the replica is not a path on the driver's file system"
    #: Protocol features of the replica (reader and writer); None when unknown.
    features: tuple[str, ...] | None = None
    driver_engine: bool = False  # the deltalake package is importable


@dataclass(frozen=True)
class ApplyChoice:
    path: str  # MERGE, REWRITE or DRIVER
    reason: str
    bytes_per_row: float = 0.0
    limit_bytes: int = 0
    #: A driver choice's fallback when delta-rs refuses the table: a rewrite up to this size, else MERGE.
    rewrite_limit_bytes: int = 0
    #: A driver choice for a replica with deletion vectors on: changed rows are marked deleted
    #: (:mod:`lakemirror.sinks.accelerator.dv_merge`), and the fallback is Spark's MERGE, never a rewrite.
    deletion_vectors: bool = False

    @property
    def rewrite(self) -> bool:
        return self.path == REWRITE

    @property
    def driver(self) -> bool:
        return self.path == DRIVER

    def driver_batch_rows(self) -> int:
        """The most change rows of one batch the driver path takes (more: Spark applies it)."""
        if self.bytes_per_row <= 0:
            return DRIVER_BATCH_MAX_ROWS
        return max(10_000, min(DRIVER_BATCH_MAX_ROWS, int(DRIVER_BATCH_BYTES / (4 * self.bytes_per_row))))

    def without_driver(self, rows: int) -> "ApplyChoice | None":
        """What a driver choice falls back to for a replica of ``rows`` rows: the rewrite while the
        replica is within ``rewrite_below_bytes``, otherwise None (MERGE)."""
        if self.deletion_vectors or rows * self.bytes_per_row > self.rewrite_limit_bytes:
            return None
        return replace(self, path=REWRITE, reason=self.reason + "; delta-rs refused it, so Spark rewrites it",
                       limit_bytes=self.rewrite_limit_bytes)

    def still_small(self, rows: int) -> bool:
        """Whether a replica of ``rows`` rows is still within the rewrite limit."""
        return rows * self.bytes_per_row <= self.limit_bytes

    def files_for(self, rows: int) -> int:
        """How many files a rewrite of ``rows`` rows writes."""
        return max(1, math.ceil(rows * self.bytes_per_row / REWRITE_FILE_BYTES))


def _mib(n: float) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def _plain_type(type_name: str) -> bool:
    return type_name.strip().lower().startswith(DRIVER_KEY_TYPES) and "<" not in type_name


def _why_not_driver(facts: ReplicaFacts, batch_columns: Sequence[str], key_types: Sequence[str],
                    writable: frozenset[str] = DELTA_RS_WRITER_FEATURES, local_only: bool = False) -> str | None:
    """Why the driver path cannot take this replica, or None when it can (``local_only``: only on the
    driver's own file system)."""
    if not facts.driver_engine:
        return "the deltalake package is not installed"
    if not facts.local and (local_only or not facts.object_store):
        if facts.object_store:
            return "the replica is on object storage, and deletion vectors are written on the driver only for " \
                   "replicas on its file system"
        return facts.unreachable
    if facts.features is None:
        return "the replica's protocol features are unknown"
    other = sorted(set(facts.features) - writable)
    if other:
        return f"the replica uses protocol features the driver does not write ({', '.join(other)})"
    if sorted(facts.columns) != sorted(batch_columns):
        return "the replica's column names differ in case from the replicated ones"
    odd = [t for t in key_types if not _plain_type(t)]
    if odd:
        return f"a key column has a type the driver does not group by ({', '.join(odd)})"
    return None


def choose_apply(facts: ReplicaFacts, batch_columns: Sequence[str], rewrite_below_bytes: int, *,
                 driver_apply: bool = False, key_types: Sequence[str] = (),
                 driver_apply_below_bytes: int = DEFAULT_DRIVER_APPLY_BELOW_BYTES) -> ApplyChoice:
    """MERGE, rewrite or the driver's MERGE, with the reason in words (the runner logs it)."""
    merge = "applies by MERGE: "
    if rewrite_below_bytes <= 0:
        return ApplyChoice(MERGE, merge + "rewrites are off (rewrite_below_bytes: 0)")
    limit = max(rewrite_below_bytes, driver_apply_below_bytes if driver_apply else 0)
    if facts.size_bytes > limit:
        return ApplyChoice(MERGE, merge + f"the replica ({_mib(facts.size_bytes)}) is larger than "
                                          f"rewrite_below_bytes ({_mib(rewrite_below_bytes)})"
                                          + (f" and driver_apply_below_bytes ({_mib(driver_apply_below_bytes)})"
                                             if driver_apply else ""))
    if str(facts.properties.get(CDF_PROPERTY, "false")).lower() == "true":
        return ApplyChoice(MERGE, merge + "the replica has a change data feed of its own, which a rewrite "
                                          "would fill with every row")
    dv = str(facts.properties.get(DELETION_VECTORS_PROPERTY, "false")).lower() == "true"
    dv_merge = merge + "the replica has deletion vectors on, so a MERGE writes only the changed rows where a " \
                       "rewrite would write every row"
    if dv and not driver_apply:
        return ApplyChoice(MERGE, dv_merge + " (driver_apply is off)")
    if sorted(c.lower() for c in facts.columns) != sorted(c.lower() for c in batch_columns):
        return ApplyChoice(MERGE, merge + "the replica's columns differ from the replicated ones "
                                          f"({', '.join(facts.columns)} against {', '.join(batch_columns)})")
    if not facts.observable:
        return ApplyChoice(MERGE, merge + "the session does not report observed metrics (Spark Connect)")
    if facts.rows <= 0:
        return ApplyChoice(MERGE, merge + "the replica is empty, so its size per row (which bounds a growing "
                                          "replica's rewrites) is unknown")
    per_row = facts.size_bytes / facts.rows
    if dv:
        not_driver = _why_not_driver(facts, batch_columns, key_types, DV_WRITER_FEATURES, local_only=True)
        if not_driver is not None:
            return ApplyChoice(MERGE, dv_merge + f", and {not_driver}")
        size = f"{_mib(facts.size_bytes)}, at most {_mib(limit)} (driver_apply_below_bytes)"
        return ApplyChoice(DRIVER, f"applies on the driver by deletion vectors (changed rows marked deleted, new "
                                   f"ones appended): {size}", per_row, limit, deletion_vectors=True)
    not_driver = _why_not_driver(facts, batch_columns, key_types) if driver_apply else "driver_apply is off"
    if not_driver is None:
        size = f"{_mib(facts.size_bytes)}, at most {_mib(limit)} (driver_apply_below_bytes)"
        where = "" if facts.local else " on object storage, committed by conditional put (If-None-Match)"
        return ApplyChoice(DRIVER, f"applies on the driver by a delta-rs MERGE{where}: {size}", per_row, limit,
                           rewrite_below_bytes)
    if facts.size_bytes > rewrite_below_bytes:
        return ApplyChoice(MERGE, merge + f"the replica ({_mib(facts.size_bytes)}) is larger than "
                                          f"rewrite_below_bytes ({_mib(rewrite_below_bytes)}) and {not_driver}")
    size = f"{_mib(facts.size_bytes)}, at most {_mib(rewrite_below_bytes)} (rewrite_below_bytes)"
    return ApplyChoice(REWRITE, f"applies by rewriting the replica with Spark ({not_driver}): {size}", per_row,
                       rewrite_below_bytes)


def choose_guarded_apply(*, driver_apply: bool, driver_engine: bool, reachable: bool, writable: bool) -> ApplyChoice:
    """How an event source's guarded batches reach one Delta replica
    (:class:`lakemirror.sinks.events.guard_merge.GuardedDeltaSink`): Spark's MERGE with the tombstone
    anti-joins, or one delta-rs MERGE on the driver
    (:mod:`lakemirror.sinks.accelerator.guarded_driver`), with the reason in words.

    ``reachable``: delta-rs on the driver reaches both tables: paths on its file system, or ``s3a://``
    locations through the session's s3a settings on a store with conditional writes
    (:func:`lakemirror.object_store.delta_rs_target`). ``writable``: delta-rs writes
    both the replica and its tombstone table correctly (their protocol
    features, :func:`lakemirror.delta_log.protocol.delta_rs_can_write`). A batch with a truncate goes to Spark
    whichever path the replica takes; history (SCD type 2) replicas are always applied by Spark
    (:class:`lakemirror.sinks.events.history_merge.HistoryDeltaSink`)."""
    merge = "applies by Spark's MERGE: "
    if not driver_apply:
        return ApplyChoice(MERGE, merge + "driver_apply is off")
    if not driver_engine:
        return ApplyChoice(MERGE, merge + "the deltalake package is not installed")
    if not reachable:
        return ApplyChoice(MERGE, merge + "the driver's delta-rs does not reach the replica (neither a path on the "
                                          "driver's file system nor s3a:// with the session's s3a settings on a "
                                          "store with conditional writes: a catalog table, another store, or "
                                          "Spark Connect)")
    if not writable:
        return ApplyChoice(MERGE, merge + "the replica or its tombstone table uses protocol features the driver "
                                          "does not write")
    return ApplyChoice(DRIVER, "applies on the driver by a delta-rs MERGE under the sequence guard")
