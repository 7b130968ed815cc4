"""Keys of several integer columns, encoded as one integer per row: the same rows as the row-by-row
lookup of their probes (null-safe, as the MERGE's ``<=>``), whatever the batch holds."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lakemirror.sinks.accelerator.composite_keys import CODE_LIMIT, CompositeKeys, decode, encode
from lakemirror.sinks.accelerator.key_match import FileKeys, KeyLookup, from_integers, key_probe


def reference(file_keys: pa.Table, batch: pa.Table) -> list[int]:
    """The rows the row-by-row lookup finds."""
    positions, _ = FileKeys(key_probe(file_keys)).find(KeyLookup(key_probe(batch)))
    return sorted(positions.tolist())


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("types", [(pa.int64(), pa.int64()), (pa.int32(), pa.int16(), pa.int64()),
                                   (pa.date32(), pa.timestamp("us", tz="UTC"))])
def test_encoded_keys_find_exactly_the_rows_the_row_by_row_lookup_finds(duplicates, types):
    rng = np.random.default_rng(len(types) + duplicates)
    rows = 4000
    columns = [rng.integers(-50, 50, rows) for _ in types[:-1]] + [rng.permutation(rows) - 1000]
    if duplicates:  # a key the source never made unique is matched on every row that holds it
        for column in columns:
            column[rng.integers(0, rows, 300)] = column[:300]
    names = [f"k{i}" for i in range(len(types))]
    file_keys = pa.table([from_integers(c, t) for c, t in zip(columns, types)], names=names)
    kept = CompositeKeys.of(file_keys)
    assert kept is not None and kept.rows == rows and kept.layout.startswith("composite ")
    for size in (1, 50, 3000):
        picked = rng.choice(rows, size, replace=False)
        parts = [np.append(c[picked], [c.min() - 1, 0, c.max() + 1]) for c in columns]  # outside the ranges too
        # Keys whose last part lies one range outside, with the first part moved one the other
        # way: their codes would be a real row's if a part's range were not checked.
        span = int(columns[-1].max() - columns[-1].min() + 1)
        above = picked[columns[0][picked] > columns[0].min()]
        below = picked[columns[0][picked] < columns[0].max()]
        parts = [np.concatenate([p, c[above] - (i == 0), c[below] + (i == 0)]) for i, (p, c) in enumerate(zip(parts, columns))]
        parts[-1][-len(above) - len(below):] += np.concatenate([np.full(len(above), span), np.full(len(below), -span)])
        nulls = [np.zeros(len(parts[0]), dtype=bool) for _ in parts]
        nulls[0][:2] = True  # a NULL part matches no row here: the file has none
        batch = pa.table([pc.if_else(pa.array(m), pa.nulls(len(m), t), from_integers(p, t))
                          for p, m, t in zip(parts, nulls, types)], names=names)
        lookup = KeyLookup(key_probe(batch), batch)
        positions, keys = kept.find(lookup)
        assert positions.dtype == np.uint32
        assert sorted(positions.tolist()) == reference(file_keys, batch)
        assert keys.equals(key_probe(file_keys).take(pa.array(positions))), "each row's key, as the batch's probe has it"
        without_parts, _ = kept.find(KeyLookup(key_probe(batch)))  # keyed otherwise: decoded, row by row
        assert sorted(without_parts.tolist()) == reference(file_keys, batch)


def test_only_signed_integer_keys_without_nulls_within_the_limit_are_encoded():
    ok = pa.table({"a": pa.array([1, 2], pa.int64()), "b": pa.array([3, 4], pa.int64())})
    assert CompositeKeys.of(ok) is not None
    assert CompositeKeys.of(ok.select(["a"])) is None, "one column: FileKeys keeps it"
    assert CompositeKeys.of(ok.slice(0, 0)) is None
    assert CompositeKeys.of(pa.table({"a": [1, None], "b": [3, 4]})) is None
    assert CompositeKeys.of(pa.table({"a": ["x", "y"], "b": [3, 4]})) is None
    assert CompositeKeys.of(pa.table({"a": pa.array([1, 2], pa.uint64()), "b": [3, 4]})) is None
    wide = pa.table({"a": pa.array([-(2**63), 2**63 - 1], pa.int64()), "b": [3, 4]})
    assert CompositeKeys.of(wide) is None, "ranges multiplying past the limit"
    edge = pa.table({"a": pa.array([0, 2**31 - 1], pa.int64()), "b": pa.array([0, 2**31 - 1], pa.int64())})
    kept = CompositeKeys.of(edge)
    assert kept is not None and 2**62 <= CODE_LIMIT
    lookup = KeyLookup(key_probe(edge), edge)
    assert sorted(kept.find(lookup)[0].tolist()) == [0, 1]
    away = pa.table({"a": pa.array([-1, 5], pa.int64()), "b": pa.array([2**31, -7], pa.int64())})
    positions, keys = kept.find(KeyLookup(key_probe(away), away))
    assert positions.size == 0 and len(keys) == 0, "every key outside the file's ranges"


def test_codes_decode_to_their_parts_at_the_ends_of_their_ranges():
    lows, spans = [-(2**40), 5, 0], [2**10, 3, 2**20]
    parts = [np.array([-(2**40), -(2**40) + 2**10 - 1, 0 - 2**40 + 7]),
             np.array([5, 7, 6]), np.array([0, 2**20 - 1, 12345])]
    codes = encode(parts, lows, spans)
    assert codes.tolist()[:2] == [0, 2**10 * 3 * 2**20 - 1], "the lowest and the highest key of the ranges"
    assert all(np.array_equal(a, b) for a, b in zip(decode(codes, lows, spans), parts))
