"""A change-feed batch read on the driver by delta-rs: whole source versions, as Arrow.

Spark's read of a batch and its transfer to Python cost the driver path most of a large batch's
time, where delta-rs's ``load_cdf`` reads the same change data straight into Arrow (``make bench
ONLY=catch_up`` drains a backlog of large batches). When the stream's offsets show that a batch
holds whole versions (:mod:`lakemirror.delta_log.stream_offsets`), the same rows can be read here
instead: the change data of those versions, which delta-rs reads from the same files as Spark
(``cdc`` files, or the added and removed files of a commit without them).

Only a source delta-rs reads as Spark does (:func:`lakemirror.delta_log.protocol.readable_by_delta_rs`):
no column mapping (its files name columns by physical ids), and reader features among
:data:`~lakemirror.delta_log.protocol.READABLE_FEATURES`; on the driver's file system, or in S3
through the storage options derived from the session's s3a settings. Anything else, and any error,
leaves the batch to Spark's read: this path may make a batch faster, never different.

The rows come back as the Spark read brings them: ``update_preimage`` rows left out (they are never
applied), ``_change_type`` as a plain string, ``_commit_version`` as int64 and ``_commit_timestamp``
in UTC. delta-rs gives a commit's ``commitInfo`` time where Spark gives its commit file's time, a
few milliseconds later: lag read from these rows is, if anything, a little longer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from lakemirror.delta_log.protocol import readable_by_delta_rs
from lakemirror.delta_log.stream_offsets import VersionRange

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP = "_change_type", "_commit_version", "_commit_timestamp"


def _sql_name(name: str) -> str:
    """A column name as delta-rs's SQL parser reads it (it parses ``columns``): quoted, case kept."""
    return '"' + name.replace('"', '""') + '"'


class FeedTooLarge(Exception):
    """The batch holds more change rows than the caller takes on the driver."""


class FeedUnfit(Exception):
    """delta-rs's change feed of this source may differ from Spark's (the message says why)."""


class DriverFeed:
    """Reads whole versions of the change feed of the Delta table at ``path`` (a local path, or a
    delta-rs URI such as ``s3://…`` with its storage ``options``)."""

    def __init__(self, path: str, options: dict[str, str] | None = None) -> None:
        self.path = path
        self.options = options or None
        self._table: Any = None

    def _source(self) -> Any:
        from deltalake import DeltaTable

        if self._table is None:
            self._table = DeltaTable(self.path, storage_options=self.options)
        else:
            self._table.update_incremental()
        return self._table

    def reload(self) -> None:
        """Load the source afresh next time (its whole log state, not only the commits since)."""
        self._table = None

    def latest(self) -> tuple[int, str]:
        """The source's newest version and its table id (its log read since the last look)."""
        source = self._source()
        return int(source.version()), str(source.metadata().id)

    def unfit(self) -> str | None:
        """Why this source's batches are left to Spark's read; None when they need not be."""
        return readable_by_delta_rs(self._source())

    def _checked_source(self, update: bool = True) -> Any:
        """The source, brought up to date (unless ``update`` is false: it was just now), checked again
        each time: a property change (column mapping turned on, say) need not restart the stream."""
        source = self._source() if update or self._table is None else self._table
        why = readable_by_delta_rs(source)
        if why is not None:
            raise FeedUnfit(why)
        return source

    def read(self, versions: VersionRange, columns: Sequence[str], max_rows: int,
             table_id: str | None = None, update: bool = True) -> "pa.Table":
        """The change rows (preimages left out) of ``versions``: ``columns``, which must include the
        three change-feed columns. Raises :class:`FeedTooLarge` past ``max_rows`` rows, and
        :class:`ValueError` when the table at the path is not ``table_id`` (recreated since Spark
        planned the batch), :class:`FeedUnfit` when delta-rs's read of the source may differ."""
        import pyarrow as pa

        wanted = list(columns)
        if versions.empty:
            return self._normalised(pa.table({c: pa.array([], pa.null()) for c in wanted}), wanted, empty=True)
        source = self._checked_source(update)
        if table_id is not None and source.metadata().id != table_id:
            raise ValueError(f"the table at {self.path} is now {source.metadata().id}, not {table_id}")
        reader = pa.RecordBatchReader.from_stream(source.load_cdf(
            starting_version=versions.first, ending_version=versions.last, columns=[_sql_name(c) for c in wanted],
            predicate=f"{CHANGE_TYPE} != 'update_preimage'"))
        batches, rows = [], 0
        for batch in reader:
            rows += batch.num_rows
            if rows > max_rows:
                raise FeedTooLarge(f"versions {versions.first}-{versions.last} hold more than {max_rows} change rows")
            batches.append(batch)
        return self._normalised(pa.Table.from_batches(batches, schema=reader.schema), wanted)

    @staticmethod
    def _normalised(table: "pa.Table", columns: Sequence[str], empty: bool = False) -> "pa.Table":
        import pyarrow as pa

        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(f"delta-rs's change feed has no column(s) {', '.join(missing)}")
        table = table.select(list(columns))
        if empty:
            return table
        fixed = {CHANGE_TYPE: pa.string(), COMMIT_VERSION: pa.int64(), COMMIT_TIMESTAMP: pa.timestamp("us", tz="UTC")}
        schema = pa.schema([field.with_type(fixed.get(field.name) or spark_arrow_type(field.type))
                            for field in table.schema])
        if schema == table.schema:
            return table
        return table.cast(schema)  # a naive commit time is UTC: cast keeps its instant


def spark_arrow_type(kind: "pa.DataType") -> "pa.DataType":
    """``kind`` with Arrow's view types (delta-rs reads strings and binaries as views) replaced by the
    plain ones Spark hands over: pyarrow's compute functions do not all take views."""
    import pyarrow as pa

    t = pa.types
    if t.is_string_view(kind) or t.is_large_string(kind):
        return pa.string()
    if t.is_binary_view(kind) or t.is_large_binary(kind):
        return pa.binary()
    if t.is_list(kind) or t.is_large_list(kind) or t.is_list_view(kind) or t.is_large_list_view(kind):
        return pa.list_(kind.value_field.with_type(spark_arrow_type(kind.value_type)))
    if t.is_map(kind):
        return pa.map_(kind.key_field.with_type(spark_arrow_type(kind.key_type)),
                       kind.item_field.with_type(spark_arrow_type(kind.item_type)), kind.keys_sorted)
    if t.is_struct(kind):
        return pa.struct([f.with_type(spark_arrow_type(f.type)) for f in kind])
    return kind
