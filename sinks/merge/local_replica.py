"""A Delta replica on the driver's file system, read from its log by delta-rs: its columns, and the
facts its apply path is chosen from (:class:`~lakemirror.sinks.merge.apply_choice.ReplicaFacts`),
with no Spark job.

Read through Spark, both rebuild the replica's snapshot (a Spark job on a replica written by
delta-rs, which leaves no checksum files), and the facts count its rows (another); every table's
launch paid them, on a restarted daemon's cold JVM. delta-rs reads the same log: the protocol and
metadata actions, and each file's size and row count from its statistics. Where it cannot tell
exactly what Spark would answer, the answer is None and Spark is asked as before: a file without a
row count, a file with a deletion vector (Spark's count leaves its deleted rows out).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from typing import Any

from lakemirror import tables
from lakemirror.delta_log.protocol import protocol_features
from lakemirror.schema import Column, columns_from_delta_schema
from lakemirror.sinks.merge.apply_choice import ReplicaFacts

log = logging.getLogger(__name__)


class LocalReplica:
    """The log of the Delta replica at ``path`` (a local directory), as delta-rs reads it."""

    def __init__(self, path: str, table: Any) -> None:
        self.path = path
        self._table = table

    @classmethod
    def open(cls, path: str | None) -> "LocalReplica | None":
        """None unless ``path`` is a Delta table on the driver's file system that delta-rs reads."""
        if path is None or not tables.is_local_table(path) or importlib.util.find_spec("deltalake") is None:
            return None
        from deltalake import DeltaTable

        folder = tables.local_dir(path)
        try:
            return cls(path, DeltaTable(str(folder)))
        except Exception as exc:  # noqa: BLE001 (a log delta-rs cannot read: Spark reads it)
            log.debug("replica %s: delta-rs cannot read its log: %s", path, exc)
            return None

    def columns(self) -> tuple[Column, ...]:
        """The replica's columns, typed as Spark names them."""
        return columns_from_delta_schema(json.loads(self._table.schema().to_json()))

    def facts(self, *, observable: bool) -> ReplicaFacts | None:
        """What choosing the apply path needs (``observable``: the session reports observed metrics);
        None where delta-rs cannot tell it exactly as Spark would (see the module docstring)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        protocol = self._table.protocol()
        features = protocol_features(protocol.min_reader_version, protocol.min_writer_version,
                                     protocol.reader_features, protocol.writer_features)
        files = pa.table(self._table.get_add_actions(flatten=True))
        vectors = [name for name in files.column_names if name.lower().startswith(("deletion_vector", "deletionvector"))]
        if any(files.column(name).null_count < files.num_rows for name in vectors):
            return None  # rows marked deleted: Spark's count leaves them out
        if "deletionVectors" in features and not vectors and files.num_rows:
            return None  # files of a table with deletion vectors, and no way to see whether they have one
        records = files.column("num_records") if "num_records" in files.column_names else None
        if records is None or records.null_count:
            return None  # a file without a row count in its statistics
        return ReplicaFacts(size_bytes=int(pc.sum(files.column("size_bytes")).as_py() or 0),
                            rows=int(pc.sum(records).as_py() or 0),
                            columns=tuple(c.name for c in self.columns()),
                            properties=dict(self._table.metadata().configuration or {}),
                            observable=observable, local=True, features=features, driver_engine=True)
