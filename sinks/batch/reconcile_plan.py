"""The reconciliation planner: how to prove a replica equals its source, as data and SQL text.

Pure: no pyspark import. The Spark executor (:mod:`lakemirror.sinks.batch.reconcile`) runs the SQL
this module writes; unit tests check the text and the classification logic without Spark.

The check, per table:

1. **Canonical encoding** of every row: ``to_json(named_struct(...))`` over the compared columns,
   named in lower case and sorted, with ``ignoreNullFields = false`` (so ``NULL`` encodes as
   ``null`` and ``''`` as ``""``), microsecond timestamps, and JSON's typing (a string ``"1"`` is
   not the number ``1``). Column order and the case of column names do not matter; the type
   widening ``INT`` -> ``BIGINT`` does not change an encoding (the schema diff reports it).
2. **Digest**: SHA-256 of the encoding, kept as two signed 64-bit lanes (128 bits). The key is
   encoded the same way, and its bucket is ``pmod(xxhash64(key encoding), buckets)``.
3. **Bucket pass**: per bucket, on each side, ``count(*)``, ``bit_xor(lane 1)`` and
   ``sum(lane 2)`` (as a decimal, so it never overflows). Equal tables cost exactly this one
   aggregate pass per side and ``buckets`` small rows on the driver.
4. **Key pass**, only inside the buckets that differ: per key, the row count and digest of each
   side, joined on the key encoding, classified as missing (in the source only), extra (in the
   replica only) or different (digests differ, or the key repeats in the replica).

Only keys leave the executor, never row contents (they may be personal data).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from lakemirror.identifiers import quote, sql_string
from lakemirror.schema import Column
from lakemirror.sinks.merge.planner import SchemaDiff, diff_schema

#: Columns the executor adds to each side's rows.
KEY_COLUMN = "__lm_key"
BUCKET_COLUMN = "__lm_bucket"
LANE1_COLUMN = "__lm_d1"
LANE2_COLUMN = "__lm_d2"
ROWS_COLUMN = "__lm_rows"

MISSING = "missing"      # key in the source, not in the replica
EXTRA = "extra"          # key in the replica, not in the source
DIFFERENT = "different"  # key on both sides, contents differ (or the key repeats in the replica)

DEFAULT_BUCKETS = 1024
MAX_BUCKETS = 1 << 16

_JSON_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
}


def json_encoding_sql(columns: Sequence[str]) -> str:
    """``to_json(named_struct(...))`` of ``columns``: lower-cased names, sorted, NULLs kept."""
    if not columns:
        raise ValueError("an encoding needs at least one column")
    ordered = sorted(columns, key=lambda c: (c.lower(), c))
    fields = ", ".join(f"{sql_string(c.lower())}, {quote(c)}" for c in ordered)
    options = ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in _JSON_OPTIONS.items())
    return f"to_json(named_struct({fields}), map({options}))"


def lane_sql(digest_hex: str, lane: int) -> str:
    """Signed 64-bit lane ``lane`` (0 or 1) of a hex SHA-256 digest expression."""
    if lane not in (0, 1):
        raise ValueError("a digest has two 64-bit lanes: 0 and 1")
    return f"CAST(conv(substr({digest_hex}, {1 + 16 * lane}, 16), 16, -10) AS BIGINT)"


@dataclass(frozen=True)
class ReconcilePlan:
    """The SQL of one table's reconciliation. Every expression runs unchanged on both sides."""

    keys: tuple[str, ...]
    compared: tuple[str, ...]          # columns whose contents are compared (keys included)
    buckets: int
    schema: SchemaDiff                 # replica vs source, for the report
    key_sql: str                       # the key's canonical encoding (the join key)
    row_sql: str                       # the row's canonical encoding
    bucket_sql: str                    # the bucket of a row, from its key encoding

    @property
    def digest_sql(self) -> str:
        return f"sha2({self.row_sql}, 256)"

    def projection(self) -> list[str]:
        """SELECT list turning a side's rows into (key, bucket, lane 1, lane 2)."""
        return [f"{self.key_sql} AS {quote(KEY_COLUMN)}",
                f"{self.bucket_sql} AS {quote(BUCKET_COLUMN)}",
                f"{lane_sql(self.digest_sql, 0)} AS {quote(LANE1_COLUMN)}",
                f"{lane_sql(self.digest_sql, 1)} AS {quote(LANE2_COLUMN)}"]

    def bucket_aggregates(self) -> list[str]:
        """Aggregates per bucket; equal buckets give equal values on both sides."""
        return [f"count(1) AS {quote(ROWS_COLUMN)}",
                f"bit_xor({quote(LANE1_COLUMN)}) AS {quote(LANE1_COLUMN)}",
                f"sum(CAST({quote(LANE2_COLUMN)} AS DECIMAL(20, 0))) AS {quote(LANE2_COLUMN)}"]

    def key_aggregates(self) -> list[str]:
        """Aggregates per key inside the differing buckets."""
        return [f"count(1) AS {quote(ROWS_COLUMN)}",
                f"min({quote(LANE1_COLUMN)}) AS {quote(LANE1_COLUMN)}",
                f"min({quote(LANE2_COLUMN)}) AS {quote(LANE2_COLUMN)}"]

    def in_buckets_sql(self, buckets: Iterable[int]) -> str:
        """Predicate keeping the rows of ``buckets`` (on the projected ``__lm_bucket``)."""
        chosen = sorted({int(b) for b in buckets})
        if not chosen:
            return "false"
        if any(b < 0 or b >= self.buckets for b in chosen):
            raise ValueError(f"bucket numbers must be in [0, {self.buckets})")
        return f"{quote(BUCKET_COLUMN)} IN ({', '.join(str(b) for b in chosen)})"


def plan_reconcile(source: Sequence[Column], replica: Sequence[Column], keys: Sequence[str],
                   *, buckets: int = DEFAULT_BUCKETS, exclude: Sequence[str] = ()) -> ReconcilePlan:
    """Plan the comparison of ``replica`` with ``source`` on ``keys``.

    Compared columns: the source's, minus ``exclude``, that the replica also has (matched
    case-insensitively, as Spark resolves names). Columns on one side only show in the schema
    diff instead. A key column missing from either side is an error: keys cannot be compared.
    """
    if not keys:
        raise ValueError("reconciliation needs at least one key column")
    if not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"buckets must be between 1 and {MAX_BUCKETS}, got {buckets}")
    src = {c.name.lower(): c for c in source}
    rep = {c.name.lower(): c for c in replica}
    excluded = {e.lower() for e in exclude}
    for k in keys:
        if k.lower() not in src:
            raise ValueError(f"key column {k!r} is not a column of the source ({', '.join(src)})")
        if k.lower() not in rep:
            raise ValueError(f"key column {k!r} is not a column of the replica ({', '.join(rep)})")
        if k.lower() in excluded:
            raise ValueError(f"key column {k!r} cannot be excluded from reconciliation")
    kept_source = [c for c in source if c.name.lower() not in excluded]
    kept_replica = [c for c in replica if c.name.lower() not in excluded]
    compared = tuple(c.name for c in kept_source if c.name.lower() in rep)
    key_names = tuple(src[k.lower()].name for k in keys)
    key_sql = json_encoding_sql(key_names)
    return ReconcilePlan(
        keys=key_names, compared=compared, buckets=buckets,
        schema=diff_schema(kept_source, kept_replica),
        key_sql=key_sql, row_sql=json_encoding_sql(compared),
        bucket_sql=f"CAST(pmod(xxhash64({key_sql}), {buckets}) AS INT)",
    )


BucketStats = tuple[int, int, int]  # (rows, xor of lane 1, sum of lane 2)


def differing_buckets(source: Mapping[int, BucketStats], replica: Mapping[int, BucketStats]) -> list[int]:
    """Buckets whose aggregates differ (a bucket absent on one side counts as empty there)."""
    return sorted(b for b in set(source) | set(replica) if source.get(b) != replica.get(b))


@dataclass(frozen=True)
class KeyDigest:
    rows: int
    lane1: int
    lane2: int


def classify(source: KeyDigest | None, replica: KeyDigest | None) -> str | None:
    """The kind of mismatch of one key, or None when both sides hold the same single row."""
    if source is None and replica is None:
        return None
    if replica is None:
        return MISSING
    if source is None:
        return EXTRA
    if replica.rows != 1 or source.rows != 1 or (source.lane1, source.lane2) != (replica.lane1, replica.lane2):
        return DIFFERENT
    return None


def classify_sql(source_alias: str = "s", replica_alias: str = "r") -> str:
    """The SQL twin of :func:`classify` over a full outer join of per-key aggregates."""
    s, r = source_alias, replica_alias
    rows, l1, l2 = quote(ROWS_COLUMN), quote(LANE1_COLUMN), quote(LANE2_COLUMN)
    return (f"CASE WHEN {r}.{rows} IS NULL THEN '{MISSING}' "
            f"WHEN {s}.{rows} IS NULL THEN '{EXTRA}' "
            f"WHEN {r}.{rows} <> 1 OR {s}.{rows} <> 1 OR {s}.{l1} <> {r}.{l1} OR {s}.{l2} <> {r}.{l2} "
            f"THEN '{DIFFERENT}' END")


@dataclass(frozen=True)
class ReconcileResult:
    """What one table's reconciliation found. Keys only, as canonical JSON of the key columns."""

    source: str
    replica: str
    source_version: int | None
    source_rows: int
    replica_rows: int
    schema: SchemaDiff
    buckets: int
    buckets_differing: int
    missing: int
    extra: int
    different: int
    sample_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> keys (capped)
    keys_truncated: bool = False
    repaired: bool = False
    compared_columns: tuple[str, ...] = ()

    @property
    def mismatched_keys(self) -> int:
        """The number a metrics layer exports per table (missing + extra + different)."""
        return self.missing + self.extra + self.different

    @property
    def equal(self) -> bool:
        return self.mismatched_keys == 0 and self.source_rows == self.replica_rows and self.schema.is_empty

    @property
    def status(self) -> str:
        if self.equal:
            return "equal"
        if not self.schema.is_additive:
            return "schema_breaking"
        return "different"

    def metric_samples(self) -> dict[str, int]:
        """Per-kind counts for a gauge such as ``lakemirror_reconcile_mismatched_keys{kind=…}``."""
        return {MISSING: self.missing, EXTRA: self.extra, DIFFERENT: self.different}


#: Spark DDL of the reconciliation table (one row per table per run).
RECONCILIATION_DDL = ", ".join([
    "run_id STRING", "checked_at TIMESTAMP", "source_table STRING", "replica_table STRING",
    "source_version BIGINT", "status STRING", "source_rows BIGINT", "replica_rows BIGINT",
    "missing_keys BIGINT", "extra_keys BIGINT", "different_keys BIGINT",
    "schema_additive BOOLEAN", "schema_diff STRING", "buckets INT", "buckets_differing INT",
    "sample_missing ARRAY<STRING>", "sample_extra ARRAY<STRING>", "sample_different ARRAY<STRING>",
    "keys_truncated BOOLEAN", "repaired BOOLEAN", "compared_columns ARRAY<STRING>",
])
