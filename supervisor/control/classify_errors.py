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
from lakemirror.error_text import causes as _causes
from lakemirror.error_text import first_line as first_line
from lakemirror.secrets import redact
from lakemirror.sinks.isolate import value_refusal as value_refusal

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


_TRACEBACK = "Traceback (most recent call last):"
_RAISED = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
#: Where lakemirror's own errors live: a Python worker's traceback names them in full.
_OWN_ERRORS = "lakemirror."
#: Spark's report of an exception raised in a Python worker.
_FROM_PYTHON_WORKER = re.compile(r"PYTHON_EXCEPTION|PythonException")


def python_worker_error(text: str) -> str | None:
    """The error a Python traceback inside ``text`` ends with, or None when there is none.

    Spark reports an exception raised in a Python worker (a ``foreach`` writer on an executor) as
    ``[PYTHON_EXCEPTION] An exception was thrown from the Python worker … Traceback (most recent
    call last): File … <the error>``, wrapped in the JVM's own errors: the first line of that says
    nothing. The telling line is the last traceback's final one (``module.Class: message``, after
    its frames); a lakemirror error is given as its message alone (it names the table and what to
    do), any other as ``Class: message``."""
    found: tuple[str, str] | None = None
    in_traceback = False
    for line in text.splitlines():
        if line.strip().endswith(_TRACEBACK):
            in_traceback = True
            continue
        if not in_traceback or not line.strip() or line[:1].isspace():
            continue  # outside a traceback, or one of its frames (indented)
        raised = _RAISED.match(line.strip())
        if raised is not None:
            found = (raised.group(1), (raised.group(2) or "").strip())
        in_traceback = False
    if found is None:
        return None
    name, message = found
    if name.endswith("Py4JJavaError"):
        return None  # a JVM error seen from Python: its own lines (first_line) tell more
    if name.startswith(_OWN_ERRORS) and message:
        return message
    short = name.rsplit(".", 1)[-1]
    return f"{short}: {message}" if message else short


def stream_error(label: str, exc: BaseException | None) -> str:
    """One line saying why a streaming query stopped: the error a Python worker raised (a
    ``foreach`` writer's), else the most telling line of the JVM's report; credentials redacted."""
    if exc is None:
        return f"{label}: the stream stopped"
    text = redact(f"{type(exc).__name__}: {exc}")
    line = (python_worker_error(text) if _FROM_PYTHON_WORKER.search(text) else None) or first_line(text)
    named = (label, label.split(":", 1)[-1])  # an event source's writers name it without its prefix
    return line if any(line.startswith(f"{n}:") for n in named) else f"{label}: {line}"


def classify(exc: BaseException, *, table: str | None = None) -> LakemirrorError:
    """Return a lakemirror error for ``exc`` (unchanged if it already is one)."""
    if isinstance(exc, LakemirrorError):
        return exc
    # Spark quotes URLs and options, credentials included
    text = redact("\n".join([f"{type(exc).__name__}: {exc}", *_causes(exc)]))
    summary = (python_worker_error(text) if _FROM_PYTHON_WORKER.search(text) else None) or first_line(text)
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
