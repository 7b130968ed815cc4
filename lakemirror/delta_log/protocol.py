"""Which Delta protocol features the engines we drive besides Spark handle as Spark does, and the
features a table's protocol lists.

A table's protocol names its features (reader version 3 and writer version 7), or implies them by
its versions (a legacy protocol). Every path that reads or writes a table without Spark (delta-rs's
change feed, a delta-rs MERGE, the driver's deletion vectors) is taken only for a table whose
features all appear here; any other table is read and written by Spark, as if the path did not exist.
"""

from __future__ import annotations

from typing import Any, Sequence

from lakemirror.tables import is_local_table

#: Reader features whose change data delta-rs (1.6) reads as Spark does.
READABLE_FEATURES = frozenset({"deletionVectors", "timestampNtz"})
#: Protocol features a delta-rs (1.6) write handles correctly; a table with any other stays with Spark.
DELTA_RS_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "timestampNtz"})
#: Protocol features a replica may list and still be applied to by the driver's deletion vectors
#: (:mod:`lakemirror.sinks.accelerator.dv_merge`, which refuses a table that turns on what it does not honour:
#: append-only, constraints, invariants, a change data feed).
DV_WRITER_FEATURES = DELTA_RS_WRITER_FEATURES | {"deletionVectors", "changeDataFeed"}

#: The features a legacy protocol version (reader below 3 and writer below 7) supports, each with the
#: lowest reader and writer versions that imply it (Delta's table of protocol versions).
LEGACY_FEATURES: dict[str, tuple[int, int]] = {
    "appendOnly": (1, 2), "invariants": (1, 2), "checkConstraints": (1, 3), "changeDataFeed": (1, 4),
    "generatedColumns": (1, 4), "columnMapping": (2, 5), "identityColumns": (1, 6)}


def protocol_features(reader_version: int, writer_version: int, reader_features: Sequence[str] | None,
                      writer_features: Sequence[str] | None) -> tuple[str, ...]:
    """The table features Spark's ``DESCRIBE DETAIL`` lists for a protocol, sorted (Delta's
    ``Protocol.implicitlyAndExplicitlySupportedFeatures``): a protocol that names features (writer
    version 7, or reader version 3) lists the ones it names; a legacy one those its versions imply.
    Pure."""
    if reader_version >= 3 or writer_version >= 7:
        return tuple(sorted(set(reader_features or ()) | set(writer_features or ())))
    return tuple(sorted(name for name, (reader, writer) in LEGACY_FEATURES.items()
                        if reader <= reader_version and writer <= writer_version))


def readable_by_delta_rs(table: Any) -> str | None:
    """Why delta-rs's change feed of ``table`` (a delta-rs ``DeltaTable``) may differ from Spark's;
    None when it does not."""
    protocol = table.protocol()
    mapping = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    if mapping != "none":
        return f"the source uses column mapping ({mapping})"
    if protocol.min_reader_version >= 3:
        odd = set(protocol.reader_features or ()) - READABLE_FEATURES
        if odd:
            return f"the source has reader features delta-rs is not trusted with ({', '.join(sorted(odd))})"
    return None


def delta_rs_can_write(path: str, storage_options: "dict[str, str] | None" = None) -> bool:
    """Whether delta-rs is installed and writes the Delta table at ``path`` correctly: a local
    path, or with ``storage_options`` a delta-rs URI such as ``s3://…``
    (:func:`lakemirror.object_store.delta_rs_target`)."""
    import importlib.util

    if importlib.util.find_spec("deltalake") is None:
        return False
    from deltalake import DeltaTable

    if not storage_options:
        if not is_local_table(path):
            return False
        protocol = DeltaTable(path).protocol()
    else:
        try:
            protocol = DeltaTable(path, storage_options=storage_options).protocol()
        except Exception:  # noqa: BLE001 (no table there, or delta-rs cannot reach it: Spark writes)
            return False
    if protocol.min_writer_version < 7:
        return protocol.min_writer_version <= 3  # 4 and up: change data feed, generated columns, column mapping
    return set(protocol.writer_features or ()) <= DELTA_RS_WRITER_FEATURES
