"""A replica file's key of several integer columns, kept as one integer per row.

Row by row, a batch's keys cost a hash lookup per row of the file, every batch, where a key of
one integer column is found by index or binary search, as
:class:`~lakemirror.sinks.accelerator.key_match.FileKeys` keeps it direct or sorted
(``make bench ONLY=key_lookup`` compares the two for a key of two integers). Where every part of
the key is an integer column without NULLs in the file (a date or timestamp counts as the integer
underneath it: ``integer_type``), and the parts' ranges there multiply to at most :data:`CODE_LIMIT`, each row's key is encoded as one integer:
its parts' offsets from their smallest values, in mixed radix. Two keys are equal exactly when
their codes are (each part lies within its range), so the codes are kept as a ``FileKeys``, and a
batch's keys are encoded with the file's ranges (a key outside them is in no row of the file) and
looked up there.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pyarrow as pa

from lakemirror.sinks.accelerator.key_match import FileKeys, KeyLookup, as_integers, from_integers, integer_type, key_probe

#: The largest product of a file's key ranges that is encoded (codes, and the arithmetic that
#: makes them, then fit in int64).
CODE_LIMIT = 2**62


def encode(parts: Sequence[np.ndarray], lows: Sequence[int], spans: Sequence[int]) -> np.ndarray:
    """One code per row for ``parts`` (int64, each within ``[low, low + span)``)."""
    code = np.zeros(len(parts[0]), dtype=np.int64)
    for part, low, span in zip(parts, lows, spans):
        code *= span
        code += part - low
    return code


def decode(code: np.ndarray, lows: Sequence[int], spans: Sequence[int]) -> list[np.ndarray]:
    """The parts (int64) :func:`encode` made ``code`` from."""
    rest = code.copy()
    parts: list[np.ndarray] = []
    for low, span in zip(reversed(lows), reversed(spans)):
        parts.append(rest % span + low)
        rest //= span
    return parts[::-1]


class CompositeKeys:
    """A file's key of several integer columns, as :class:`FileKeys` of one code a row."""

    def __init__(self, schema: pa.Schema, lows: list[int], spans: list[int], codes: FileKeys) -> None:
        self.schema = schema
        self.rows = codes.rows
        self._lows = lows
        self._spans = spans
        self._codes = codes

    @classmethod
    def of(cls, keys: pa.Table) -> "CompositeKeys | None":
        """``keys`` encoded, or None: fewer than two columns, no rows, a column that is not matched
        as an integer or has a NULL, or ranges too wide to encode."""
        columns = keys.columns
        if (len(columns) < 2 or not keys.num_rows
                or any(integer_type(c.type) is None or c.null_count for c in columns)):
            return None
        parts = [as_integers(c) for c in columns]
        lows = [int(p.min()) for p in parts]
        spans = [int(p.max()) - low + 1 for p, low in zip(parts, lows)]
        if math.prod(spans) > CODE_LIMIT:
            return None
        return cls(keys.schema, lows, spans, FileKeys(pa.array(encode(parts, lows, spans))))

    @property
    def layout(self) -> str:
        return f"composite {self._codes.layout}"

    @property
    def nbytes(self) -> int:
        return self._codes.nbytes

    def find(self, lookup: KeyLookup) -> tuple[np.ndarray, pa.Array]:
        """The rows (positions, uint32) whose key the batch changes, and those rows' keys as the
        batch's probe has them."""
        if lookup.parts is None or lookup.part_rows is None or len(lookup.parts) != len(self._lows):
            return lookup.row_by_row(self._probe())  # a batch keyed otherwise than the file: never in practice
        inside = np.ones(len(lookup.part_rows), dtype=bool)
        for part, low, span in zip(lookup.parts, self._lows, self._spans):
            inside &= (part >= low) & (part <= low + span - 1)
        if not inside.any():
            return np.zeros(0, dtype=np.uint32), lookup.probe.slice(0, 0)
        codes = encode([part[inside] for part in lookup.parts], self._lows, self._spans)
        order = np.argsort(codes)
        codes = codes[order]
        positions, matched = self._codes.find(KeyLookup(pa.array(codes)))
        batch_rows = lookup.part_rows[inside][order]
        return positions, lookup.probe.take(pa.array(batch_rows[np.searchsorted(codes, matched.to_numpy())]))

    def _probe(self) -> pa.Array:
        """The file's keys in row order as :func:`key_probe` makes them."""
        parts = decode(self._codes.in_row_order().to_numpy(), self._lows, self._spans)
        return key_probe(pa.table([from_integers(p, f.type) for p, f in zip(parts, self.schema)], schema=self.schema))

