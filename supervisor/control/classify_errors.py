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
from lakemirror.sinks.isolate import refused_by_value

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
#: The last qualified Java exception named inside a line ("... most recent failure: Lost task ...:
#: java.io.FileNotFoundException: File ... does not exist").
_INNER_EXCEPTION = re.compile(r".*[\s:(]((?:[a-z_][\w$]*\.)+\w*(?:Exception|Error)\b:?\s*.*)$")
#: Lines that only say another exception happened: the cause is further down the chain.
_WRAPPERS = ("Exception thrown in awaitResult", "[STREAM_FAILED]", "Job aborted due to stage failure",
             "An error occurred while calling", "Job aborted.", "Task failed while writing rows")
_CAUSED_BY = re.compile(r"^(Caused by|Suppressed):\s*")
#: How many causes of an exception are followed (a cycle or a very deep chain ends the walk).
MAX_CAUSES = 16


def _own_line(line: str) -> str | None:
    """``line`` as a candidate for the telling line: a wrapper only through the exception it names."""
    if not any(w in line for w in _WRAPPERS):
        return line
    inner = _INNER_EXCEPTION.match(line)
    if inner is None or any(w in inner.group(1) for w in _WRAPPERS):
        return None
    return inner.group(1)


def _short(line: str) -> str:
    m = _JAVA_EXCEPTION.match(line)
    return f"{m.group(1)}: {m.group(3)}".rstrip(": ") if m else line


def first_line(text: str, limit: int = 500) -> str:
    """The most telling line of an error: its root cause, not a wrapper.

    The deepest line naming an error class, else the deepest Java exception line (``Caused by:``
    lines come after the exception they cause), else the first line. Lines that only wrap another
    exception (``SparkException: Exception thrown in awaitResult``, ``[STREAM_FAILED]``, a failed
    Py4J call) count only through the exception they name inline."""
    raw = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("at ")]
    lines = [_CAUSED_BY.sub("", ln) for ln in raw if not ln.startswith("...")]
    own = [o for o in (_own_line(ln) for ln in lines) if o]
    classed = [ln for ln in own if _ERROR_CLASS.search(ln)]
    java = [ln for ln in own if _JAVA_EXCEPTION.match(ln)]
    if classed:
        line = _short(classed[-1])
    elif java:
        line = _short(java[-1])
    else:
        line = own[0] if own else (lines[0] if lines else text.strip())
    line = line.lstrip(": ")
    return line if len(line) <= limit else line[: limit - 1] + "…"


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


def _causes(exc: BaseException) -> list[str]:
    """The texts of ``exc``'s causes, outermost first: Python's chain, pyspark's converted cause, and
    the Java cause chain of a Py4J error (its text holds only what the JVM printed)."""
    out: list[str] = []
    seen = {id(exc)}
    current: object = exc
    for _ in range(MAX_CAUSES):
        nxt = (getattr(current, "_cause", None) or getattr(current, "__cause__", None)
               or getattr(current, "__context__", None))
        if not isinstance(nxt, BaseException) or id(nxt) in seen:
            break
        seen.add(id(nxt))
        out.append(f"Caused by: {type(nxt).__name__}: {nxt}")
        current = nxt
    java = getattr(exc, "java_exception", None)
    try:
        cause = java.getCause() if java is not None else None
        for _ in range(MAX_CAUSES):
            if cause is None:
                break
            out.append(f"Caused by: {cause.toString()}")
            cause = cause.getCause()
    except Exception:  # noqa: BLE001 (a JVM gone or unreachable: the text we have must do)
        pass
    return out


def value_refusal(exc: BaseException) -> str | None:
    """The engine's reason when ``exc`` is a write refused because of a value it was given
    (:data:`lakemirror.sinks.isolate.VALUE_REFUSALS`), else None: the error is not one that a single item of the batch causes."""
    if isinstance(exc, LakemirrorError):
        return None
    text = redact("\n".join([f"{type(exc).__name__}: {exc}", *_causes(exc)]))
    return first_line(text) if refused_by_value(text) else None


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
