"""An error's text: the causes it carries and its most telling line.

Pure: over Spark Connect and Py4J the original Java exception survives only as text, so these read
the exception's class name, its message and its chain of causes, never pyspark's types. The error
taxonomy (:mod:`lakemirror.supervisor.control.classify_errors`) and the dead letters' reasons
(:func:`lakemirror.sinks.isolate.value_refusal`) both say an error in the line these choose.
"""

from __future__ import annotations

import re

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


def causes(exc: BaseException) -> list[str]:
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
