"""Finding the items that make a write fail, by bisection, so that the rest of the batch applies.

Pure: no pyspark import. A batch's write may be refused because of one item's value in a way no
check before the write can see (a ``CHECK`` constraint an operator added to the replica, a value an
engine refuses that fits the declared type). :func:`bisect` then applies halves of the batch, and
halves of the halves that are refused again, until each refused part is a single item: that item is
poison (the caller dead-letters it with the engine's reason), everything else is applied.

Exactness: every attempt is a write of its own under a transaction id derived from the batch's
(:func:`attempt_txn`: the batch's app id with ``/isolate/<attempt>``, the batch id as the version).
Attempts are numbered in the order the bisection makes them, and the bisection depends only on the
items and on which writes are refused, so a batch replayed after a crash makes the same attempts
under the same ids: Delta skips those already committed, and the refused ones are refused again.
Each attempt has an app id of its own because Delta skips every version up to the last one an app
id committed: numbered versions under one app id would pass a refused attempt off as committed
(and lose its dead letter) once a later attempt has committed. The app ids an isolation adds to a
replica's log are at most twice the largest batch it ever bisected. Only an error that :func:`is_refusal` says a value caused starts a
bisection; anything else (the store, the network, a conflict) is raised as it is, so a transient
failure never turns a good item into a dead letter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

from lakemirror.error_text import causes, first_line
from lakemirror.errors import LakemirrorError
from lakemirror.secrets import redact
from lakemirror.sinks.txn import TxnId

T = TypeVar("T")
R = TypeVar("R")

#: A write refused because of a value in the data it writes (a number out of its column's range, a
#: constraint of the replica violated, a value the engine cannot convert), not because of the store,
#: the network or a conflict: one item of the batch, found by bisection, can be dead-lettered.
VALUE_REFUSALS = (
    # Spark and Delta
    "NUMERIC_VALUE_OUT_OF_RANGE", "NUMERIC_OUT_OF_SUPPORTED_RANGE", "CAST_OVERFLOW", "CAST_INVALID_INPUT",
    "ARITHMETIC_OVERFLOW", "DATETIME_OVERFLOW", "DELTA_CAST_OVERFLOW_IN_TABLE_WRITE",
    "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES", "DELTA_NOT_NULL_CONSTRAINT_VIOLATED", "DELTA_INVARIANT_VIOLATION",
    "NOT_NULL_ASSERT_VIOLATION", "DELTA_MISSING_NOT_NULL_COLUMN_VALUE",
    # pyspark's checks of the rows handed to createDataFrame
    "CANNOT_ACCEPT_OBJECT_IN_TYPE", "VALUE_OUT_OF_BOUNDS", "FIELD_NOT_NULLABLE", "FIELD_DATA_TYPE_UNACCEPTABLE",
    # delta-rs (the driver's executor): a CHECK constraint or a NOT NULL column refused rows
    "rows failed validation check", "declared as non-nullable but contains null", "Invariant violations",
)


def refused_by_value(text: str) -> bool:
    """Whether an error's text says a write was refused because of a value it was given."""
    return any(code in text for code in VALUE_REFUSALS)


def value_refusal(exc: BaseException) -> str | None:
    """The engine's reason when ``exc`` is a write refused because of a value it was given
    (:data:`VALUE_REFUSALS`), else None: the error is not one that a single item of the batch causes.
    The reason is the most telling line of the error and its causes, credentials redacted."""
    if isinstance(exc, LakemirrorError):
        return None
    text = redact("\n".join([f"{type(exc).__name__}: {exc}", *causes(exc)]))
    return first_line(text) if refused_by_value(text) else None

def attempt_txn(txn: TxnId, attempt: int) -> TxnId:
    """The transaction id of a bisection's ``attempt``-th write (numbered from 0) for batch ``txn``."""
    if attempt < 0:
        raise ValueError(f"attempt {attempt} is out of range")
    return TxnId(f"{txn.app_id}/isolate/{attempt}", txn.version)


@dataclass
class Isolated(Generic[T, R]):
    """What a bisection applied (one result per committed attempt) and what it refused."""

    applied: list[R] = field(default_factory=list)
    refused: list[tuple[T, str]] = field(default_factory=list)   # (item, the engine's reason)
    attempts: int = 0


def bisect(items: Sequence[T], write: Callable[[Sequence[T], TxnId], R], txn: TxnId,
           is_refusal: Callable[[BaseException], str | None], reason: str) -> Isolated[T, R]:
    """Apply ``items``, whose write as a whole was refused for ``reason``, by halves until every
    refused write is a single item.

    ``write(part, txn)`` applies ``part`` under ``txn`` (an attempt's id) and returns its result or
    raises; ``is_refusal(exc)`` answers the reason when a value of the part caused ``exc``, else None
    (then ``exc`` is raised from here unchanged). ``items`` must come in the same order whenever the
    same batch is applied again.
    """
    out: Isolated[T, R] = Isolated()

    def attempt(part: Sequence[T]) -> None:
        number = out.attempts
        out.attempts += 1
        try:
            out.applied.append(write(part, attempt_txn(txn, number)))
        except Exception as exc:
            reason = is_refusal(exc)
            if reason is None:
                raise
            if len(part) == 1:
                out.refused.append((part[0], reason))
                return
            split(part)

    def split(part: Sequence[T]) -> None:
        middle = len(part) // 2
        attempt(part[:middle])
        attempt(part[middle:])

    if len(items) == 1:
        out.refused.append((items[0], reason))
    elif items:
        split(items)
    return out
