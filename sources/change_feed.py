"""The Delta Change Data Feed as a source: snapshots at a version, change streams, commit times.

Never sets ``failOnDataLoss=false`` or ``ignoreMissingFiles``: those make Delta drop changes
silently (CDC_SEMANTICS.md §1). A missing version surfaces as an error the supervisor handles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from lakemirror import tables
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def snapshot(spark: "SparkSession", loc: TableLocation, version: int) -> "DataFrame":
    """The table exactly as of ``version`` (``VERSION AS OF``)."""
    return tables.read(spark, loc, versionAsOf=version)


def change_stream(spark: "SparkSession", loc: TableLocation, after_version: int,
                  options: Mapping[str, Any] | None = None) -> "DataFrame":
    """A streaming DataFrame of the change rows of every version after ``after_version``.

    The stream starts AT ``after_version`` (which exists: it is the snapshot's version; Delta
    refuses a starting version beyond the latest) and drops that version's own rows, so a
    snapshot at V followed by this stream has no gap and no overlap.
    """
    opts = {"readChangeFeed": "true", "startingVersion": str(after_version)}
    for k, v in (options or {}).items():
        if k.lower() in ("failondataloss", "ignoremissingfiles"):
            raise ValueError(f"the stream option {k!r} would silently drop changes; it is not allowed")
        opts[k] = str(v)
    stream = tables.read_stream(spark, loc, **opts)
    return stream.where(stream["_commit_version"] > after_version)


@dataclass(frozen=True)
class SourceHead:
    latest_version: int
    commit_times: dict[int, float]  # epoch seconds, for the versions fetched


def source_head(spark: "SparkSession", loc: TableLocation, since_version: int,
                window: int = 32) -> SourceHead:
    """The latest version and the commit times of versions after ``since_version``.

    Reads only the newest ``window`` commits of the log unless the table is further behind;
    then it reads back to the commit ``since_version + 1`` that lag is measured from (never the
    whole history).
    """
    history = tables.delta_table(spark, loc).history(window).select("version", "timestamp").collect()
    times = {int(r["version"]): r["timestamp"].timestamp() for r in history}
    latest = max(times)
    needed = since_version + 1
    if latest >= needed and needed not in times:
        rows = (tables.delta_table(spark, loc).history(latest - needed + 1)
                .where(f"version = {int(needed)}").select("version", "timestamp").collect())
        times.update({int(r["version"]): r["timestamp"].timestamp() for r in rows})
    return SourceHead(latest, times)
