"""Translate errors from Spark and Delta into lakemirror's taxonomy, once, at the boundary.

Pure: it looks at the exception's class name and message text (over Spark Connect and Py4J the
original Java exception only survives as text), never imports pyspark.
"""

from __future__ import annotations

from lakemirror.errors import (
    ChangeWindowExpired, LakemirrorError, SchemaChangeRestart, SchemaIncompatible, TerminalError,
    TransientError,
)

_WINDOW = ("DELTA_MISSING_FILES_UNEXPECTED_VERSION", "DELTA_MISSING_CHANGE_DATA",
           "DELTA_FILE_NOT_FOUND_DETAILED", "VersionNotFoundException", "DELTA_VERSION_NOT_FOUND",
           "DELTA_CHANGE_DATA_FEED_NOT_ENABLED_FOR_VERSION", "DELTA_CANNOT_TIME_TRAVEL_VIEWS")
_ADDITIVE = ("DELTA_SCHEMA_CHANGED", "DELTA_SCHEMA_CHANGED_WITH_VERSION",
             "DELTA_SCHEMA_CHANGED_WITH_STARTING_OPTIONS")
_BREAKING = ("DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE", "DELTA_STREAMING_METADATA_EVOLUTION",
             "DELTA_STREAMING_CANNOT_CONTINUE_PROCESSING_POST_SCHEMA_EVOLUTION",
             "DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE_USE_SCHEMA_LOG",
             "DELTA_BLOCK_COLUMN_MAPPING_AND_CDC_OPERATION", "DELTA_UNSUPPORTED_COLUMN_MAPPING_SCHEMA_CHANGE")
_RETRYABLE = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
              "ConcurrentTransactionException", "ConcurrentWriteException", "MetadataChangedException",
              "ProtocolChangedException", "DELTA_CONCURRENT_", "Connection reset", "SocketTimeout")


def first_line(text: str, limit: int = 500) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text.strip())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def classify(exc: BaseException, *, table: str | None = None) -> LakemirrorError:
    """Return a lakemirror error for ``exc`` (unchanged if it already is one)."""
    if isinstance(exc, LakemirrorError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    summary = first_line(text)
    if any(code in text for code in _BREAKING):
        return SchemaIncompatible(
            f"{table}: the source schema changed in a way the stream cannot follow ({summary}). "
            f"Resync the table (a new bootstrap), or revert the change on the source.", table=table)
    if any(code in text for code in _ADDITIVE):
        return SchemaChangeRestart(f"{table}: the source schema changed; restarting the stream to read it "
                                   f"({summary})", table=table)
    if any(code in text for code in _WINDOW):
        return ChangeWindowExpired(
            f"{table}: a source version the replica still needs is no longer available ({summary}). "
            f"The change window expired (VACUUM or log retention); resync the table.", table=table)
    if any(code in text for code in _RETRYABLE):
        return TransientError(f"{table}: {summary}", table=table)
    return TerminalError(f"{table}: {summary}", table=table, code="failed")
