"""Translate errors from Spark and Delta into lakemirror's taxonomy, once, at the boundary.

Pure: it looks at the exception's class name and message text (over Spark Connect and Py4J the
original Java exception only survives as text), never imports pyspark.
"""

from __future__ import annotations

import re

from lakemirror.errors import (
    ChangeWindowExpired, LakemirrorError, SchemaChangeRestart, SchemaIncompatible, TerminalError,
    TransientError,
)
from lakemirror.secrets import redact

_WINDOW = ("DELTA_MISSING_FILES_UNEXPECTED_VERSION", "DELTA_MISSING_CHANGE_DATA",
           "DELTA_FILE_NOT_FOUND_DETAILED", "VersionNotFoundException", "DELTA_VERSION_NOT_FOUND",
           "DELTA_CHANGE_DATA_FEED_NOT_ENABLED_FOR_VERSION", "DELTA_CANNOT_TIME_TRAVEL_VIEWS",
           "DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION",
           "DELTA_CHANGE_DATA_FILE_NOT_FOUND",
           # a vacuumed data or _change_data file, seen by the streaming CDF reader
           "FAILED_READ_FILE.FILE_NOT_EXIST", "java.io.FileNotFoundException",
           # Delta's Kernel-based streaming source and Delta Kernel name no error class
           "Cannot time travel Delta table to version", "No recreatable commits found at path",
           "but no log file found for version", "no log files found in the requested version range",
           "as the transaction log has been truncated")
_ADDITIVE = ("DELTA_SCHEMA_CHANGED", "DELTA_SCHEMA_CHANGED_WITH_VERSION",
             "DELTA_SCHEMA_CHANGED_WITH_STARTING_OPTIONS")
_BREAKING = ("DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE", "DELTA_STREAMING_METADATA_EVOLUTION",
             "DELTA_STREAMING_CANNOT_CONTINUE_PROCESSING_POST_SCHEMA_EVOLUTION",
             "DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE_USE_SCHEMA_LOG",
             "DELTA_BLOCK_COLUMN_MAPPING_AND_CDC_OPERATION", "DELTA_UNSUPPORTED_COLUMN_MAPPING_SCHEMA_CHANGE")
_RETRYABLE = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
              "ConcurrentTransactionException", "ConcurrentWriteException", "MetadataChangedException",
              "ProtocolChangedException", "DELTA_CONCURRENT_", "Connection reset", "SocketTimeout")


_ERROR_CLASS = re.compile(r"\[[A-Z][A-Z0-9_.]+\]")
_JAVA_EXCEPTION = re.compile(r"^:?\s*[a-z][\w.]*\.(\w*(Exception|Error))\b:?\s*(.*)$")


def first_line(text: str, limit: int = 500) -> str:
    """The most telling line of an error: the one naming an error class, else a Java exception
    line, else the first line. (A Py4J error's first line only names the failed Py4J call.)"""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("at ")]
    line = next((ln for ln in lines if _ERROR_CLASS.search(ln)), None)
    if line is not None and (m := _JAVA_EXCEPTION.match(line)):
        line = f"{m.group(1)}: {m.group(3)}"
    if line is None:
        for ln in lines:
            m = _JAVA_EXCEPTION.match(ln)
            if m:
                line = f"{m.group(1)}: {m.group(3)}".rstrip(": ")
                break
    if line is None:
        line = lines[0] if lines else text.strip()
    line = line.lstrip(": ")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def classify(exc: BaseException, *, table: str | None = None) -> LakemirrorError:
    """Return a lakemirror error for ``exc`` (unchanged if it already is one)."""
    if isinstance(exc, LakemirrorError):
        return exc
    text = redact(f"{type(exc).__name__}: {exc}")  # Spark quotes URLs and options, credentials included
    summary = first_line(text)
    who = f"{table}: " if table else ""
    if any(code in text for code in _BREAKING):
        return SchemaIncompatible(
            f"{who}the source schema changed in a way the stream cannot follow ({summary}). "
            f"Resync the table (a new bootstrap), or revert the change on the source.", table=table)
    if any(code in text for code in _ADDITIVE):
        return SchemaChangeRestart(f"{who}the source schema changed; restarting the stream to read it "
                                   f"({summary})", table=table)
    if any(code in text for code in _WINDOW):
        return ChangeWindowExpired(
            f"{who}a source version the replica still needs is no longer available ({summary}). "
            f"The change window expired (VACUUM or log retention); resync the table.", table=table)
    if any(code in text for code in _RETRYABLE):
        return TransientError(f"{who}{summary}", table=table)
    return TerminalError(f"{who}{summary}", table=table, code="failed")
