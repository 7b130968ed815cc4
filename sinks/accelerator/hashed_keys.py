"""A replica file's string keys (and keys of several columns that are not all integers, or have a
NULL part), kept as a 64-bit hash per row beside the keys themselves.

Row by row, a batch's keys cost a hash-set lookup per row of the file, every batch, where an
integer key is found by index or binary search (:class:`~lakemirror.sinks.accelerator.key_match.FileKeys`;
``make bench ONLY=key_lookup`` compares the two for string keys). Here each row's
:func:`~lakemirror.sinks.accelerator.key_match.key_probe` is hashed once, when the file is first read, and the
hashes are kept sorted as a ``FileKeys``; a batch's probes are hashed once per batch, their
hashes found in each file in one step, and every row found is then compared with the batch's key
itself (null-safely, as the MERGE's ``<=>``). A hash decides nothing alone: two keys that collide
are told apart by that comparison, so a collision costs time, never a wrong row.

The hash (:func:`hash64`) is a polynomial over the key's bytes modulo 2**64, computed for a whole
column at once from prefix sums, with its length and a final bit mix (splitmix64's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakemirror.sinks.accelerator.key_match import FileKeys, KeyLookup

_MASK = (1 << 64) - 1
#: The polynomial's base (odd, so it has an inverse modulo 2**64).
_BASE = 0x9E3779B97F4A7C15
#: How each key's length enters its hash (after its bytes: an empty key does not hash to 0).
_LENGTH = 0xD6E8FEB86659FD93
#: The hash of a NULL key.
NULL_HASH = 0x5BD1E9955BD1E995
#: Bytes of keys hashed per step (bounds the step's temporary arrays: about 40 bytes per byte).
CHUNK_BYTES = 1 << 22


def _inverse(odd: int) -> int:
    """``odd``'s inverse modulo 2**64 (Newton's iteration doubles the correct bits each step)."""
    inverse = odd
    for _ in range(6):
        inverse = (inverse * (2 - odd * inverse)) & _MASK
    return inverse


def _powers(base: int, count: int) -> np.ndarray:
    """``base**0 .. base**(count - 1)`` modulo 2**64 (numpy's unsigned products wrap)."""
    factors = np.full(count, base, dtype=np.uint64)
    factors[0] = 1
    return np.cumprod(factors, dtype=np.uint64)


_DOWN = _powers(_inverse(_BASE), CHUNK_BYTES + 1)
_UP = _powers(_BASE, CHUNK_BYTES + 1)


def hashable(kind: pa.DataType) -> bool:
    """Whether :func:`hash64` takes values of type ``kind`` (strings and binary of any layout)."""
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)
                or pa.types.is_string_view(kind) or pa.types.is_binary_view(kind))


def as_binary(values: pa.Array) -> pa.Array:
    """``values`` (:func:`hashable`) as ``large_binary``: one layout to hash and compare."""
    if pa.types.is_string_view(values.type):
        values = values.cast(pa.large_string())
    elif pa.types.is_binary_view(values.type) or pa.types.is_fixed_size_binary(values.type):
        values = values.cast(pa.binary())
    return values.cast(pa.large_binary())


def hash64(values: pa.Array) -> np.ndarray:
    """One 64-bit hash (uint64) per value of ``values`` (:func:`hashable`); equal values, equal
    hashes, whatever their layout; NULL hashes to :data:`NULL_HASH`.

    For a key of bytes b_0 .. b_(m-1) the polynomial is sum(b_j * B**-j) * B**0: with S the prefix
    sums of b_j * B**-j over a step's bytes, a key starting at s and ending at e has
    (S[e] - S[s]) * B**s, from two gathers whatever its length."""
    values = as_binary(values)
    count = len(values)
    hashes = np.empty(count, dtype=np.uint64)
    if not count:
        return hashes
    _, offset_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int64)[values.offset:values.offset + count + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    first = 0
    while first < count:
        # The rows from ``first`` whose bytes fit in one step (at least one row, however long).
        end = int(np.searchsorted(offsets, offsets[first] + CHUNK_BYTES, "right")) - 1
        end = min(max(end, first + 1), count)
        base = int(offsets[first])
        width = int(offsets[end]) - base
        down = _DOWN if width <= CHUNK_BYTES else _powers(_inverse(_BASE), width + 1)
        up = _UP if width <= CHUNK_BYTES else _powers(_BASE, width + 1)
        sums = np.zeros(width + 1, dtype=np.uint64)
        np.cumsum(data[base:base + width] * down[:width], out=sums[1:])
        starts = offsets[first:end] - base
        ends = offsets[first + 1:end + 1] - base
        step = (sums[ends] - sums[starts]) * up[starts]
        step += (ends - starts + 1).astype(np.uint64) * np.uint64(_LENGTH)
        hashes[first:end] = step
        first = end
    hashes = _mix(hashes)
    if values.null_count:
        hashes[pc.is_null(values).to_numpy(zero_copy_only=False)] = NULL_HASH
    return hashes


def _mix(hashes: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of the polynomial reaches every bit of the hash."""
    hashes ^= hashes >> np.uint64(30)
    hashes *= np.uint64(0xBF58476D1CE4E5B9)
    hashes ^= hashes >> np.uint64(27)
    hashes *= np.uint64(0x94D049BB133111EB)
    hashes ^= hashes >> np.uint64(31)
    return hashes


@dataclass(frozen=True)
class HashedBatch:
    """A batch's probes by hash, made once per batch (:func:`hashed_batch`)."""

    #: The batch's distinct hashes, as int64, for ``FileKeys.find``.
    lookup: KeyLookup
    #: The batch's hashes (int64) sorted, and the batch row of each.
    hashes: np.ndarray
    rows: np.ndarray
    #: Whether two of the batch's rows share a hash (equal keys, or a collision): their rows are
    #: then compared with every key of the batch, not just the one their hash names.
    shared: bool


def hashed_batch(lookup: KeyLookup) -> HashedBatch | None:
    """``lookup``'s probes hashed (kept on it: every file of the batch uses them), or None where
    they are not strings or binary."""
    if lookup.hashed is None and hashable(lookup.probe.type):
        hashes = hash64(lookup.probe).view(np.int64)
        rows = np.argsort(hashes, kind="stable")
        ordered = hashes[rows]
        shared = bool(len(ordered) > 1 and (ordered[1:] == ordered[:-1]).any())
        lookup.hashed = HashedBatch(KeyLookup(pa.array(ordered)), ordered, rows, shared)
    return lookup.hashed


class HashedKeys:
    """A file's key probes with their hashes kept sorted (see the module docstring)."""

    def __init__(self, probe: pa.Array) -> None:
        self.probe = probe
        self.rows = len(probe)
        self._hashes = FileKeys(pa.array(hash64(probe).view(np.int64)))

    @classmethod
    def of(cls, probe: pa.Array) -> "HashedKeys | None":
        """``probe`` (a file's :func:`key_probe`, in row order) hashed, or None where it is not
        strings or binary, or has no rows."""
        return cls(probe) if len(probe) and hashable(probe.type) else None

    @property
    def layout(self) -> str:
        return "hashed"

    @property
    def nbytes(self) -> int:
        return int(self.probe.nbytes) + self._hashes.nbytes

    def find(self, lookup: KeyLookup) -> tuple[np.ndarray, pa.Array]:
        """The rows (positions, uint32) whose key the batch changes, and those rows' keys."""
        batch = hashed_batch(lookup)
        if batch is None:
            return lookup.row_by_row(self.probe)  # a batch keyed otherwise than the file: never in practice
        positions, found = self._hashes.find(batch.lookup)
        if not len(positions):
            return positions, self.probe.slice(0, 0)
        candidates = self.probe.take(pa.array(positions))
        if batch.shared:
            same = pc.is_in(as_binary(candidates), value_set=as_binary(lookup.probe), skip_nulls=False)
        else:
            named = batch.rows[np.searchsorted(batch.hashes, found.to_numpy())]
            same = _same(as_binary(candidates), as_binary(lookup.probe.take(pa.array(named))))
        keep = same.to_numpy(zero_copy_only=False)
        return positions[keep], candidates.filter(same)


def _same(left: pa.Array, right: pa.Array) -> pa.Array:
    """Element-wise null-safe equality (NULL equals NULL), never NULL itself."""
    equal = pc.fill_null(pc.equal(left, right), False)
    if left.null_count and right.null_count:
        equal = pc.or_(equal, pc.and_(pc.is_null(left), pc.is_null(right)))
    return equal
