"""The ``bootstrap:`` block of a pipeline's configuration: how new replicas are copied.

A new replica is copied from the source in chunks (key ranges, or groups of the source's data
files), one replica commit each, while the source's change feed after the pinned version is
captured beside the copy, so a copy longer than the source's retention loses no change
(:mod:`lakemirror.sinks.batch.chunked_bootstrap`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lakemirror.daemon.settings import limits
from lakemirror.sinks.batch.bootstrap_plan import BootstrapPolicy
from lakemirror.sources.chunks import DEFAULT_CHUNK_BYTES


class BootstrapSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_bytes: int = Field(
        DEFAULT_CHUNK_BYTES, gt=0, description="Target size of one bootstrap chunk (bytes of the source's data "
        "files at the snapshot's version; a file is never split). Each chunk is one replica commit under a Delta "
        "transaction id of its own: a killed bootstrap resumes at the first uncommitted chunk and redoes at most "
        "the chunks it was writing. A table no larger than this is copied in one commit, as a plain snapshot.")
    parallel_chunks: int = Field(
        2, ge=1, le=64, description="Chunks copied at the same time, over all tables of the pipeline. Keep it at "
        "about the cores Spark has: each chunk is a Spark job.")
    chunk_budget_seconds: float | None = Field(
        None, gt=0, le=limits.YEAR, description="Also capture the source's change feed between chunks after this much copying "
        "time. Unset: the change feed is captured beside the copy at the pace the source's change window sets "
        "(headroom_fraction, capture_poll_seconds), which is all a bootstrap needs.")
    headroom_fraction: float = Field(
        0.25, gt=0, le=0.5, description="A bootstrapping table captures its source's change feed once the oldest "
        "change not yet captured has used this share of the source's change window (the shorter of "
        "delta.deletedFileRetentionDuration and delta.logRetentionDuration).")
    safety_factor: float = Field(
        2.0, ge=1, le=1000, description="The change window must outlast this many times the age a change has reached when "
        "its capture begins: a capture is started at once when the window would close within this many times a "
        "capture's time, and a window shorter than this many times the ages measured is reported in status and "
        "the log, once, with the retention the bootstrap needs.")
    capture_poll_seconds: float | None = Field(
        None, gt=0, le=limits.DAY, description="How often a bootstrapping table looks at its source's log for changes to "
        "capture. Unset: an eighth of the source's change window, between 0.5 and 60 seconds.")
    internal_file_reads: bool = Field(
        False, description="Read chunks as groups of the source's data files through Delta's INTERNAL Scala API "
        "(DeltaLog.createDataFrame over py4j), which may change in any Delta release. It needs no planning scan and "
        "splits any table by files; used only where the session has a JVM of its own (never over Spark Connect). "
        "Off (the default): a chunk is a range of the first key column, read through the public API as VERSION AS "
        "OF with a range filter, and Delta's data skipping prunes the files; planning costs one aggregate over the "
        "key column, and a table whose files' key ranges all overlap (or whose first key is not an integer, "
        "decimal, string or date) is copied as one chunk.")

    def policy(self) -> BootstrapPolicy:
        return BootstrapPolicy(chunk_bytes=self.chunk_bytes, parallel_chunks=self.parallel_chunks,
                               chunk_budget_seconds=self.chunk_budget_seconds,
                               headroom_fraction=self.headroom_fraction, safety_factor=self.safety_factor,
                               capture_poll_seconds=self.capture_poll_seconds,
                               internal_file_reads=self.internal_file_reads)
