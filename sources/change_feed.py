"""The Delta Change Data Feed as a source: snapshots at a version, change streams, commit times.

Never sets ``failOnDataLoss=false`` or ``ignoreMissingFiles``: with them, a stream whose next version
VACUUM or log cleanup removed skips the missing changes silently instead of failing with
``DELTA_MISSING_FILES_UNEXPECTED_VERSION``. A missing version surfaces as an error the supervisor
handles (a resync or a failed table, by ``change_window_policy``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from lakemirror import tables
from lakemirror.tables import TableLocation, has_own_jvm

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def snapshot(spark: "SparkSession", loc: TableLocation, version: int) -> "DataFrame":
    """The table exactly as of ``version`` (``VERSION AS OF``)."""
    return tables.read(spark, loc, versionAsOf=version)


#: Delta's switch for its Kernel-based connector (Delta 4.4, ``DeltaV2Mode``): ``STRICT`` serves every
#: catalog table a session reads through it, streams included; ``AUTO`` only Unity Catalog managed ones.
KERNEL_MODE = "spark.databricks.delta.v2.enableMode"
#: The prefix of the session catalog's entries that name a path-based source for that connector.
FEED_TABLE_PREFIX = "lakemirror_feed_"


def change_stream(spark: "SparkSession", loc: TableLocation, after_version: int,
                  options: Mapping[str, Any] | None = None, kernel: bool = False) -> "DataFrame":
    """A streaming DataFrame of the change rows of every version after ``after_version``.

    The stream starts AT ``after_version`` (which exists: it is the snapshot's version; Delta
    refuses a starting version beyond the latest) and drops that version's own rows, so a
    snapshot at V followed by this stream has no gap and no overlap.

    ``kernel``: a path-based source in a session with its own JVM is streamed by Delta's
    Kernel-based source (:func:`kernel_stream`); otherwise, and always for tables known by name,
    by Delta's ``DeltaSource``.
    """
    opts = {"readChangeFeed": "true", "startingVersion": str(after_version)}
    for k, v in (options or {}).items():
        if k.lower() in ("failondataloss", "ignoremissingfiles"):
            raise ValueError(f"the stream option {k!r} would silently drop changes; it is not allowed")
        opts[k] = str(v)
    if kernel and loc.path is not None and has_own_jvm(spark):
        stream = kernel_stream(spark, loc.path, opts)
    else:
        stream = tables.read_stream(spark, loc, **opts)
    return stream.where(stream["_commit_version"] > after_version)


def kernel_stream(spark: "SparkSession", path: str, options: Mapping[str, str]) -> "DataFrame":
    """The change stream of the Delta table at ``path`` through Delta's Kernel-based source.

    Delta's ``DeltaSource`` builds two snapshots of the source per micro-batch (the latest, and
    the batch's start version, rebuilt from scratch), each a Spark job over the commits since the
    last checkpoint where the writer left no checksum files (delta-rs leaves none); the
    Kernel-based source reads the log in the driver with no Spark job. That source
    reads tables known to the catalog only, and only in a session whose :data:`KERNEL_MODE` is
    ``STRICT``, which also sends that session's batch reads and writes of Delta tables to it.
    So the path is named in the session catalog (:func:`feed_table`), and the stream is read in
    a session of its own; its query runs in a copy of that session made at its start, which the
    batch function hands back to Delta's usual connector (:func:`leave_kernel_mode`) before it
    touches any table. Same offsets as ``DeltaSource`` (``reservoirVersion``, ``index``).
    """
    name = feed_table(spark, path)
    session = spark.newSession()
    session.conf.set(KERNEL_MODE, "STRICT")
    reader = session.readStream.format("delta")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.table(name)


def feed_table(spark: "SparkSession", path: str) -> str:
    """The session catalog's name for the Delta table at ``path`` (an external table in the
    ``default`` database, registered on first use; the catalog of a local session lives as long
    as its JVM, so a restarted daemon registers it again)."""
    name = f"default.{FEED_TABLE_PREFIX}{hashlib.sha256(path.encode()).hexdigest()[:24]}"
    if not spark.catalog.tableExists(name):
        try:
            spark.catalog.createTable(name, path=path, source="delta")
        except Exception:  # a concurrent start registered it first; anything else is raised
            if not spark.catalog.tableExists(name):
                raise
    return name


def leave_kernel_mode(session: "SparkSession") -> None:
    """Send ``session``'s reads and writes of Delta tables to Delta's usual connector (a no-op
    for a session that never left it). A running query's source is not affected: it was made
    when the query started."""
    session.conf.unset(KERNEL_MODE)


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
    def newest(n: int) -> dict[int, float]:
        rows = tables.history(spark, loc, n).select("version", "timestamp").collect()
        return {int(r["version"]): r["timestamp"].timestamp() for r in rows}
    return head_from_history(newest, since_version, window)


#: How often the read back to the needed commit is repeated when the source commits meanwhile.
HISTORY_RETRIES = 5


def head_from_history(newest: Callable[[int], dict[int, float]], since_version: int,
                      window: int) -> SourceHead:
    """:func:`source_head` over ``newest(n)``, the commit times of the newest ``n`` versions.

    A history read is "the newest n commits": when the source commits between the first read and
    the read back to ``since_version + 1``, the second read ends one commit short of it. The needed
    commit must never be reported missing for that reason (a missing commit means its change
    window has closed), so the read back is repeated with the newer head until it reaches the
    needed commit or shows that the log no longer holds it, each time reaching further back."""
    times = newest(window)
    latest = max(times)
    needed = since_version + 1
    for attempt in range(HISTORY_RETRIES):
        if latest < needed or needed in times:
            break
        back = newest(latest - needed + 1 + 8 * 2 ** attempt)  # room for commits landing meanwhile
        times.update(back)
        if needed in times or not back or max(back) <= latest:
            break  # found, or the log no longer holds it: no newer commit cut the read short
        latest = max(back)
    return SourceHead(max(times), times)
