"""Matching a batch's keys against a replica file's, null-safely, and the key columns kept between
batches (:mod:`lakemirror.sinks.accelerator.dv_merge`).

A MERGE matches keys with ``<=>``: a NULL key part equals NULL. :func:`key_probe` makes one
comparable value per row, and :class:`KeyLookup` says which of a file's rows the batch changes;
:func:`outside` skips a file whose statistics rule it out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import numpy.typing as npt

    from lakemirror.sinks.accelerator.hashed_keys import HashedBatch


def key_probe(keys: pa.Table) -> pa.Array:
    """One comparable value per row for ``keys``: the column itself for one key, else a binary
    encoding of the parts in which equal keys (NULL parts equal) and only they are equal."""
    if keys.num_columns == 1:
        return keys.column(0).combine_chunks()
    pieces = []
    for column in keys.columns:
        column = column.combine_chunks()
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            text = pc.cast(column, pa.large_binary())
        else:
            text = pc.cast(pc.cast(column, pa.large_string()), pa.large_binary())
        length = pc.cast(pc.cast(pc.binary_length(text), pa.large_string()), pa.large_binary())
        value = pc.binary_join_element_wise(pa.scalar(b"V", pa.large_binary()), length,
                                            pa.scalar(b":", pa.large_binary()), text,
                                            pa.scalar(b"", pa.large_binary()))
        pieces.append(pc.if_else(pc.is_null(column), pa.scalar(b"N", pa.large_binary()), value))
    return pc.binary_join_element_wise(*pieces, pa.scalar(b"|", pa.large_binary()))


def integer_type(kind: pa.DataType) -> pa.DataType | None:
    """The signed integer type a key of type ``kind`` is matched as: itself for a signed integer,
    the integer underneath a date, time, timestamp or duration (two such values are equal exactly
    when those integers are); None for any other type."""
    if pa.types.is_signed_integer(kind):
        return kind
    if pa.types.is_date32(kind) or pa.types.is_time32(kind):
        return pa.int32()
    if pa.types.is_date64(kind) or pa.types.is_time64(kind) or pa.types.is_timestamp(kind) or pa.types.is_duration(kind):
        return pa.int64()
    return None


def as_integers(values: "pa.Array | pa.ChunkedArray") -> np.ndarray:
    """``values`` (no NULLs, of a type :func:`integer_type` matches as an integer) as int64."""
    kind = integer_type(values.type)
    assert kind is not None
    return np.asarray(values.cast(kind).to_numpy()).astype(np.int64)


def from_integers(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The inverse of :func:`as_integers`: ``values`` as an array of type ``kind``."""
    base = integer_type(kind)
    assert base is not None
    return pa.array(values).cast(base).cast(kind)


#: The replica files' key columns kept between batches, at most this many bytes for the whole
#: process (the least recently used go first). A data file never changes under its name, so a kept
#: column is never stale; with it a batch reads only the files written since the last.
KEY_CACHE_BYTES = 512 * 1024 * 1024
#: A batch's integer keys are also kept as a bitmap of their range (one gather per key scanned,
#: about ten times faster than a hash set: :meth:`FileKeys.find`'s pass over a file's keys in that
#: range) while the range is at most this many times their number, or at most
#: :data:`DENSE_RANGE_FLOOR` wide.
DENSE_RANGE_PER_KEY = 64
DENSE_RANGE_FLOOR = 1 << 24
#: A file's integer keys are kept as a direct map from value to row (:class:`FileKeys`) while
#: their range is under this many times the file's rows: at most 16 bytes a row, against 12
#: sorted, for a lookup by index instead of a binary search (``make bench ONLY=key_lookup``
#: compares the layouts). A bootstrap's files interleave ids over the table's whole range, so a
#: file's range is a small multiple of its rows.
DIRECT_RANGE_PER_ROW = 4
#: The direct map's mark for a value no row holds (also the bound on a file's rows for it).
ABSENT = 0xFFFFFFFF


class KeyLookup:
    """Which of a replica file's keys the batch changes (null-safe, as the MERGE's ``<=>``).

    ``probe`` is the batch's :func:`key_probe`; ``parts``, its key columns, when the key has several
    (for files whose keys :mod:`lakemirror.sinks.accelerator.composite_keys` encodes)."""

    def __init__(self, probe: pa.Array, parts: pa.Table | None = None) -> None:
        self.probe = probe
        self.dense: tuple[int, np.ndarray] | None = None
        #: For a key of several integer columns (as :func:`integer_type` matches them): the batch's
        #: rows without a NULL part (indexes into ``probe``), and those rows' parts as int64. A row
        #: with a NULL part matches no row of a file whose keys are encoded: such files have none.
        self.part_rows: np.ndarray | None = None
        self.parts: list[np.ndarray] | None = None
        if (parts is not None and parts.num_columns > 1
                and all(integer_type(t) is not None for t in parts.schema.types)):
            valid = np.ones(parts.num_rows, dtype=bool)
            for column in parts.columns:
                if column.null_count:
                    valid &= pc.is_valid(column).to_numpy(zero_copy_only=False)
            self.part_rows = np.flatnonzero(valid)
            self.parts = [as_integers(pc.fill_null(column.cast(integer_type(column.type)), 0))[self.part_rows]
                          for column in parts.columns]
        #: The batch's distinct non-NULL keys as int64, sorted, when the key is one integer column
        #: (:func:`integer_type`): what :meth:`FileKeys.find` looks up in a direct or sorted file
        #: (a NULL never equals a file's key there, as such files have none).
        self.integers: np.ndarray | None = None
        if integer_type(probe.type) is not None and len(probe):
            self.integers = _sorted_distinct(as_integers(pc.drop_null(probe)))
        if self.integers is not None and probe.null_count == 0:
            values = self.integers
            low, high = int(values[0]), int(values[-1])
            if high - low < max(DENSE_RANGE_PER_KEY * len(values), DENSE_RANGE_FLOOR):
                present = np.zeros(high - low + 1, dtype=bool)
                present[values - low] = True
                self.dense = (low, present)
        #: The batch's probes by hash, made by the first file whose keys are hashed
        #: (:func:`lakemirror.sinks.accelerator.hashed_keys.hashed_batch`) and kept for the batch's other files.
        self.hashed: "HashedBatch | None" = None

    def row_by_row(self, keys: pa.Array) -> tuple[np.ndarray, pa.Array]:
        """The rows of ``keys`` (a file's probes, in row order) the batch changes, and their keys:
        one hash lookup per row, for the files whose keys are kept neither direct, sorted nor
        encoded."""
        hits = pc.is_in(keys, value_set=self.probe, skip_nulls=False).to_numpy(zero_copy_only=False)
        positions = np.flatnonzero(hits).astype(np.uint32)
        return positions, keys.take(pa.array(positions))


class FileKeys:
    """A replica file's keys, one per physical row, as kept between batches.

    Looked up row by row, a batch of a hundred thousand changes costs a probe of every row of a
    10M-row replica, every batch: the driver's largest share of a steady cycle when done that way.
    A key that is one integer
    column without NULLs in the file (the usual ``id``; a date or timestamp is matched as the
    integer underneath, :func:`integer_type`) is kept so that a batch costs about one step per
    changed key:

    - ``direct``: each value's row, indexed by the value's offset from the file's smallest key,
      where that range is under :data:`DIRECT_RANGE_PER_ROW` times the rows and no key repeats
      (4 bytes per value of the range; built in one pass, no sort);
    - ``sorted``: otherwise, the keys sorted with each one's row (12 bytes a row), searched per
      changed key or scanned over just the batch's range, whichever is less.

    Other keys (``probe``) are kept as their :func:`key_probe` and looked up row by row; the
    apply keeps string keys, and keys of several columns that are not encoded, hashed instead
    (:mod:`lakemirror.sinks.accelerator.hashed_keys`).
    """

    def __init__(self, probe: pa.Array) -> None:
        self.rows = len(probe)
        self.type = probe.type
        self._probe: pa.Array | None = None
        self._low = 0
        self._row_of: np.ndarray | None = None
        self._sorted: np.ndarray | None = None
        self._order: np.ndarray | None = None
        self._duplicates = False
        if not (integer_type(probe.type) is not None and probe.null_count == 0 and 0 < self.rows < ABSENT):
            self._probe = probe
            return
        values = as_integers(probe)
        low, high = int(values.min()), int(values.max())
        if high - low < DIRECT_RANGE_PER_ROW * self.rows:
            row_of = np.full(high - low + 1, ABSENT, dtype=np.uint32)
            row_of[values - low] = np.arange(self.rows, dtype=np.uint32)
            if int(np.count_nonzero(row_of != ABSENT)) == self.rows:  # else a key repeats: sorted
                self._low, self._row_of = low, row_of
                return
        self._order = np.argsort(values).astype(np.uint32)
        self._sorted = values[self._order]
        self._duplicates = bool(self.rows > 1 and (self._sorted[1:] == self._sorted[:-1]).any())

    @property
    def layout(self) -> str:
        """How the keys are kept: ``direct``, ``sorted`` or ``probe`` (see the class)."""
        return "direct" if self._row_of is not None else "sorted" if self._sorted is not None else "probe"

    @property
    def nbytes(self) -> int:
        if self._row_of is not None:
            return int(self._row_of.nbytes)
        if self._sorted is not None and self._order is not None:
            return int(self._sorted.nbytes + self._order.nbytes)
        assert self._probe is not None
        return int(self._probe.nbytes)

    def find(self, lookup: KeyLookup) -> tuple[np.ndarray, pa.Array]:
        """The rows (positions, uint32) whose key the batch changes, and those rows' keys."""
        if not len(lookup.probe):
            return np.zeros(0, dtype=np.uint32), lookup.probe
        if self._probe is not None or lookup.integers is None:
            return lookup.row_by_row(self.in_row_order())
        if self._row_of is not None:
            wanted = lookup.integers
            wanted = wanted[(wanted >= self._low) & (wanted < self._low + len(self._row_of))]
            rows = self._row_of[wanted - self._low]
            hit = rows != ABSENT
            return rows[hit], from_integers(wanted[hit], self.type)
        assert self._order is not None and self._sorted is not None
        index = self._matches(lookup)
        return self._order[index], from_integers(self._sorted[index], self.type)

    def _matches(self, lookup: KeyLookup) -> np.ndarray:
        """Indexes into the sorted keys of the rows whose key the batch changes."""
        assert self._sorted is not None and lookup.integers is not None
        keys, wanted = self._sorted, lookup.integers
        if not len(wanted) or not self.rows:
            return np.zeros(0, dtype=np.int64)
        first = int(np.searchsorted(keys, wanted[0], "left"))
        end = int(np.searchsorted(keys, wanted[-1], "right"))
        span = end - first
        if lookup.dense is not None and span <= len(wanted) * self.rows.bit_length():
            low, present = lookup.dense  # the file's keys in the batch's range, each looked up once
            return first + np.flatnonzero(present[keys[first:end] - low])
        left = np.searchsorted(keys, wanted, "left")
        if not self._duplicates:
            found = left < self.rows
            found[found] = keys[left[found]] == wanted[found]
            return left[found]
        right = np.searchsorted(keys, wanted, "right")
        counts = right - left
        hit = counts > 0
        left, counts = left[hit], counts[hit]
        starts: npt.NDArray[np.intp] = np.repeat(np.cumsum(counts) - counts, counts)  # intp, as searchsorted gives
        return np.repeat(left, counts) + (np.arange(int(counts.sum())) - starts)

    def in_row_order(self) -> pa.Array:
        """The keys in row order (kept so for the ``probe`` layout; rebuilt for the others, for a
        batch whose keys are not integers: never in practice)."""
        if self._probe is not None:
            return self._probe
        values = np.empty(self.rows, dtype=np.int64)
        if self._row_of is not None:
            present = np.flatnonzero(self._row_of != ABSENT)
            values[self._row_of[present]] = present + self._low
        else:
            assert self._sorted is not None and self._order is not None
            values[self._order] = self._sorted
        return from_integers(values, self.type)


def _sorted_distinct(values: np.ndarray) -> np.ndarray:
    """``values`` sorted, each once (``np.unique`` hashes them here, about 25 times slower)."""
    values = np.sort(values)
    if len(values) > 1:
        keep = np.empty(len(values), dtype=bool)
        keep[0] = True
        np.not_equal(values[1:], values[:-1], out=keep[1:])
        values = values[keep]
    return values


class KeptKeys(Protocol):
    """A file's keys as kept between batches: :class:`FileKeys`,
    :class:`lakemirror.sinks.accelerator.composite_keys.CompositeKeys` or
    :class:`lakemirror.sinks.accelerator.hashed_keys.HashedKeys`."""

    rows: int

    @property
    def nbytes(self) -> int: ...

    def find(self, lookup: KeyLookup) -> tuple[np.ndarray, pa.Array]: ...


class KeyCache:
    """The process's kept key columns (:class:`KeptKeys`, :data:`KEY_CACHE_BYTES`), shared by
    every table's apply (tables take turns on several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probes: OrderedDict[tuple[str, str], KeptKeys] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[str, str]) -> "KeptKeys | None":
        with self._lock:
            probe = self._probes.get(key)
            if probe is not None:
                self._probes.move_to_end(key)
            return probe

    def put(self, key: tuple[str, str], probe: KeptKeys) -> None:
        with self._lock:
            if key in self._probes:
                return
            self._probes[key] = probe
            self._bytes += probe.nbytes
            while self._bytes > KEY_CACHE_BYTES and self._probes:
                _, evicted = self._probes.popitem(last=False)
                self._bytes -= evicted.nbytes

    def kept(self, under: str) -> list[KeptKeys]:
        """The kept keys of files under directory ``under`` (observability and tests)."""
        prefix = under.rstrip("/") + "/"
        with self._lock:
            return [keys for (path, _), keys in self._probes.items() if path.startswith(prefix)]

    def forget(self, files: set[str], under: str) -> None:
        """Drop the kept columns of files under directory ``under`` other than ``files``."""
        prefix = under.rstrip("/") + "/"
        with self._lock:
            for key in [k for k in self._probes if k[0].startswith(prefix) and k[0] not in files]:
                self._bytes -= self._probes.pop(key).nbytes


KEY_CACHE = KeyCache()


def key_ranges(keys: pa.Table) -> dict[str, tuple[int, int]]:
    """The batch's range of each integer key column without NULLs: a file whose statistics put
    that column wholly outside it holds no row the batch changes (:func:`outside`)."""
    ranges: dict[str, tuple[int, int]] = {}
    for name in keys.column_names:
        column = keys.column(name)
        if pa.types.is_integer(column.type) and column.null_count == 0 and len(column):
            bounds = pc.min_max(column)
            ranges[name] = (int(bounds["min"].as_py()), int(bounds["max"].as_py()))
    return ranges


def outside(stats: dict[str, Any] | None, ranges: dict[str, tuple[int, int]]) -> bool:
    """Whether a file's statistics (``minValues``/``maxValues``; wide bounds are fine) show that
    some key column of it lies wholly outside the batch's range. A row with a NULL there cannot
    match a batch without NULLs in that column, so ``nullCount`` does not matter."""
    if not stats or not ranges:
        return False
    lows, highs = stats.get("minValues") or {}, stats.get("maxValues") or {}
    for name, (low, high) in ranges.items():
        file_low, file_high = lows.get(name), highs.get(name)
        if isinstance(file_low, int) and isinstance(file_high, int) and (file_high < low or file_low > high):
            return True
    return False
