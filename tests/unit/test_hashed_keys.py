"""String keys (and keys with a string or NULL part) found by their hashes: the same rows as the
row-by-row lookup of their probes (null-safe, as the MERGE's ``<=>``), collisions included."""

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lakemirror.sinks.accelerator import hashed_keys
from lakemirror.sinks.accelerator.hashed_keys import NULL_HASH, HashedKeys, hash64
from lakemirror.sinks.accelerator.key_match import FileKeys, KeyLookup, key_probe

MASK = (1 << 64) - 1


def reference_hash(value: bytes) -> int:
    """:func:`hash64` of one value, by its definition, in Python integers."""
    down, power, total = hashed_keys._inverse(hashed_keys._BASE), 1, 0
    for byte in value:
        total = (total + byte * power) & MASK
        power = (power * down) & MASK
    total = (total + (len(value) + 1) * hashed_keys._LENGTH) & MASK
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        total ^= total >> shift
        if factor is not None:
            total = (total * factor) & MASK
    return total


def thue_morse(length: int, letters: str) -> str:
    """The Thue-Morse word over ``letters``: the classic collision of polynomial hashes modulo 2**64."""
    bits = [0]
    while len(bits) < length:
        bits += [1 - b for b in bits]
    return "".join(letters[b] for b in bits[:length])


def row_by_row(file_probe: pa.Array, batch_probe: pa.Array) -> list[int]:
    positions, _ = KeyLookup(batch_probe).row_by_row(file_probe)
    return sorted(positions.tolist())


def test_hash64_is_its_definition_across_steps_layouts_and_slices(monkeypatch):
    # Steps of 4 KiB instead of 4 MiB: the same code crosses a step's end hundreds of times, and the key
    # longer than a step is short enough for the reference's byte-by-byte loop.
    monkeypatch.setattr(hashed_keys, "CHUNK_BYTES", 1 << 12)
    rng = np.random.default_rng(1)
    # 600 KB of keys: about 150 steps; lengths 0 to 60, and one key longer than a step.
    lengths = rng.integers(0, 61, 20_000)
    ends = np.cumsum(lengths)
    data = rng.bytes(int(ends[-1]))  # one buffer, sliced: random keys without 20,000 generator calls
    values = [data[end - n:end] for end, n in zip(ends.tolist(), lengths.tolist())]
    values[1234] = b"x" * (hashed_keys.CHUNK_BYTES + 17)
    column = pa.array(values, pa.binary())
    hashes = hash64(column)
    sample = list(rng.choice(len(values), 300, replace=False)) + [0, 1233, 1234, 1235, len(values) - 1]
    bounds = np.cumsum([len(v) for v in values])  # the rows around each step's end
    sample += [int(np.searchsorted(bounds, k * hashed_keys.CHUNK_BYTES)) + d for k in (1, 2) for d in (-1, 0, 1)]
    for row in sample:
        assert int(hashes[row]) == reference_hash(values[row]), row
    text = [v.hex() for v in values[:5000]]
    as_text = hash64(pa.array(text, pa.string()))
    for kind in (pa.large_string(), pa.string_view(), pa.large_binary()):
        assert (hash64(pa.array(text, pa.string()).cast(kind)) == as_text).all(), kind
    assert (hash64(pa.array(text).slice(1000, 50)) == as_text[1000:1050]).all(), "a slice keeps its hashes"
    assert (hash64(pa.array([v.encode() for v in text], pa.binary())) == as_text).all()
    fixed = pa.array([b"abcd", b"wxyz"], pa.binary(4))
    assert (hash64(fixed) == hash64(pa.array([b"abcd", b"wxyz"]))).all()


def test_hash64_tells_apart_empty_null_and_padded_keys():
    hashes = hash64(pa.array(["", None, "\0", "a", "a\0", "\0a", "b"]))
    assert len(set(hashes.tolist())) == 7
    assert int(hashes[1]) == NULL_HASH and hash64(pa.array([], pa.string())).size == 0


def uuids(rng: np.random.Generator, count: int) -> list[str]:
    return [str(uuid.UUID(bytes=bytes(rng.integers(0, 256, 16, dtype=np.uint8)))) for _ in range(count)]


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary()])
def test_hashed_keys_find_exactly_the_rows_the_row_by_row_lookup_finds(kind):
    rng = np.random.default_rng(7)
    keys = uuids(rng, 3000)
    file_values: list[str | None] = list(keys)
    file_values[10:15] = [None] * 5  # NULL keys equal NULL (<=>)
    file_values[100:110] = file_values[200:210]  # a key held by two rows: both are found
    file_probe = pa.array([v.encode() if v and kind == pa.binary() else v for v in file_values], kind)
    kept = HashedKeys.of(file_probe)
    assert kept is not None and kept.layout == "hashed" and kept.rows == 3000
    assert kept.nbytes > file_probe.nbytes
    for size in (1, 40, 2500):
        batch_values = list(rng.choice(np.array(keys, dtype=object), size, replace=False)) + uuids(rng, 20)
        batch_values += [None] if size > 1 else []
        batch = pa.array([v.encode() if v and kind == pa.binary() else v for v in batch_values], kind)
        positions, matched = kept.find(KeyLookup(batch))
        assert positions.dtype == np.uint32
        assert sorted(positions.tolist()) == row_by_row(file_probe, batch)
        assert matched.equals(file_probe.take(pa.array(positions))), "each row's key, as the file holds it"
    assert kept.find(KeyLookup(pa.array([], kind)))[0].size == 0


def test_keys_with_string_or_null_parts_are_hashed_through_their_probes():
    rng = np.random.default_rng(3)
    rows = 2000
    file_keys = pa.table({
        "region": pa.array(rng.choice(["eu", "us", None, "ap|x"], rows).tolist()),
        "id": pa.array(np.where(rng.random(rows) < 0.05, None, rng.integers(0, 500, rows)).tolist(), pa.int64()),
    })
    file_probe = key_probe(file_keys)
    kept = HashedKeys.of(file_probe)
    assert kept is not None
    batch = file_keys.take(pa.array(rng.choice(rows, 300, replace=False)))
    batch = pa.concat_tables([batch, pa.table({"region": ["eu", None, "zz"], "id": pa.array([None, None, 1], pa.int64())})])
    positions, _ = kept.find(KeyLookup(key_probe(batch), batch))
    assert sorted(positions.tolist()) == row_by_row(file_probe, key_probe(batch))
    assert len(positions) > 300, "duplicate keys in the file: every row holding one is found"


def test_colliding_keys_are_told_apart_by_their_values():
    word, twin = thue_morse(1024, "ab"), thue_morse(1024, "ba")
    assert word != twin and hash64(pa.array([word]))[0] == hash64(pa.array([twin]))[0], "a real collision"
    file_probe = pa.array(["k1", word, "k2", twin, word])
    kept = HashedKeys.of(file_probe)
    assert kept is not None
    for batch in (["zz", word], [twin], [word, twin, "k2"], [twin, twin]):
        positions, matched = kept.find(KeyLookup(pa.array(batch)))
        assert sorted(positions.tolist()) == row_by_row(file_probe, pa.array(batch)), batch
        assert pc.all(pc.is_in(matched, value_set=pa.array(batch))).as_py()


def test_only_string_and_binary_probes_are_hashed():
    assert HashedKeys.of(pa.array([1, 2], pa.int64())) is None, "FileKeys keeps integers"
    assert HashedKeys.of(pa.array([1.5], pa.float64())) is None
    assert HashedKeys.of(pa.array([], pa.string())) is None
    kept = HashedKeys.of(pa.array(["a", "b"]))
    assert kept is not None
    positions, _ = kept.find(KeyLookup(pa.array(["b", "c"], pa.large_string())))  # another layout, same keys
    assert positions.tolist() == [1]
    assert FileKeys(pa.array(["a"])).layout == "probe"
