"""Deletion-vector formats (lakemirror/delta_log/deletion_vectors.py), the log reader and writer
(lakemirror/delta_log/local_log.py) and the pure parts of the driver's deletion-vector apply
(sinks/accelerator/dv_merge.py, key_match.py, dv_compaction.py)."""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lakemirror.delta_log.deletion_vectors import (PORTABLE_MAGIC, DeletionVectorError, DvDescriptor, DvFileWriter,
                                               decode_positions, encode_positions, frame, read_positions, z85_decode,
                                               z85_encode)
from lakemirror.delta_log.layout import commit_file_name
from lakemirror.delta_log.local_log import LogSnapshot, load_snapshot, write_commit
from lakemirror.sinks.accelerator.dv_merge import why_unfit
from lakemirror.sinks.accelerator.key_match import key_probe


def test_z85_round_trips_and_decodes_a_uuid_spark_wrote():
    # pathOrInlineDv of a deletion vector Delta 4.4 wrote, and the file name it wrote beside it
    assert uuid.UUID(bytes=z85_decode("zN4]T12@:xZCo>$4r.gS")) == uuid.UUID("6eb1da91-0338-45f5-bf32-73980d75f117")
    data = bytes(range(256)) * 2
    assert z85_decode(z85_encode(data)) == data
    assert z85_encode(b"\x86\x4f\xd2\x6f\xb5\x59\xf7\x5b") == "HelloWorld"  # the Z85 specification's example
    with pytest.raises(DeletionVectorError):
        z85_decode("abc~~")


@pytest.mark.parametrize("positions", [
    [], [0], [1, 5, 9], list(range(0, 100_000)), list(range(0, 1_000_000, 7)),
    [3, 2**32 - 1, 2**32, 2**32 + 5, 2**40],
])
def test_bitmaps_round_trip_across_32_bit_buckets_and_container_kinds(positions):
    array = np.array(positions, dtype=np.uint64)
    data = encode_positions(array)
    assert struct.unpack_from("<i", data)[0] == PORTABLE_MAGIC
    assert decode_positions(data).tolist() == positions


def test_a_corrupt_or_foreign_bitmap_is_refused():
    data = encode_positions(np.array([1, 2, 3], dtype=np.uint64))
    with pytest.raises(DeletionVectorError, match="magic"):
        decode_positions(b"\x00\x00\x00\x00" + data[4:])
    with pytest.raises(DeletionVectorError, match="native"):
        decode_positions(struct.pack("<i", PORTABLE_MAGIC - 1) + data[4:])
    with pytest.raises(DeletionVectorError, match="after its last bitmap"):
        decode_positions(data + b"\x00")


def test_a_file_of_several_vectors_is_read_back_by_descriptor_and_checked(tmp_path):
    writer = DvFileWriter()
    first = writer.add(np.array([0, 4, 8], dtype=np.uint64))
    second = writer.add(np.arange(10, 5000, dtype=np.uint64))
    (tmp_path / writer.name).write_bytes(writer.content())
    assert first.offset == 1 and second.offset == 1 + 4 + first.size_in_bytes + 4
    assert first.file_path(tmp_path) == tmp_path / writer.name
    assert read_positions(tmp_path, first).tolist() == [0, 4, 8]
    assert read_positions(tmp_path, second).tolist() == list(range(10, 5000))
    assert DvDescriptor.from_action(second.to_action()) == second
    assert first.unique_id != second.unique_id
    content = bytearray(writer.content())
    content[first.offset + 6] ^= 0xFF
    (tmp_path / writer.name).write_bytes(bytes(content))
    with pytest.raises(DeletionVectorError, match="CRC"):
        read_positions(tmp_path, first)
    wrong = DvDescriptor(second.storage_type, second.path_or_inline, second.offset, second.size_in_bytes, 3)
    with pytest.raises(DeletionVectorError, match="descriptor says 3"):
        read_positions(tmp_path, wrong)


def test_inline_and_prefixed_descriptors():
    bitmap = encode_positions(np.array([7], dtype=np.uint64))
    padded = bitmap + b"\x00" * (-len(bitmap) % 4)
    inline = DvDescriptor("i", z85_encode(padded), None, len(bitmap), 1)
    assert read_positions(Path("/nonexistent"), inline).tolist() == [7]
    file_id = uuid.uuid4()
    prefixed = DvDescriptor("u", "ab" + z85_encode(file_id.bytes), 1, 10, 1)
    assert prefixed.file_path(Path("/t")) == Path("/t/ab") / f"deletion_vector_{file_id}.bin"
    assert frame(b"xyz") == struct.pack(">i", 3) + b"xyz" + struct.pack(">I", zlib.crc32(b"xyz"))


def _log(table: Path, version: int, *actions: dict) -> None:
    (table / "_delta_log").mkdir(parents=True, exist_ok=True)
    (table / "_delta_log" / commit_file_name(version)).write_text("\n".join(json.dumps(a) for a in actions))


SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "k", "type": "long", "nullable": True, "metadata": {}},
                                                  {"name": "v", "type": "string", "nullable": True, "metadata": {}}]})
PROTOCOL = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
            "writerFeatures": ["deletionVectors", "invariants", "appendOnly"]}
META = {"id": "x", "format": {"provider": "parquet"}, "schemaString": SCHEMA, "partitionColumns": [],
        "configuration": {"delta.enableDeletionVectors": "true"}}
DV = {"storageType": "u", "pathOrInlineDv": "zN4]T12@:xZCo>$4r.gS", "offset": 1, "sizeInBytes": 9, "cardinality": 1}


def test_the_log_is_replayed_by_file_and_deletion_vector(tmp_path):
    _log(tmp_path, 0, {"protocol": PROTOCOL}, {"metaData": META}, {"add": {"path": "a.parquet", "size": 1}},
         {"add": {"path": "b.parquet", "size": 1}})
    _log(tmp_path, 1, {"remove": {"path": "a.parquet"}}, {"add": {"path": "a.parquet", "size": 1, "deletionVector": DV}},
         {"txn": {"appId": "app", "version": 3}})
    _log(tmp_path, 2, {"remove": {"path": "b.parquet"}}, {"txn": {"appId": "app", "version": 4}})
    snapshot = load_snapshot(tmp_path)
    assert snapshot.version == 2 and snapshot.transactions == {"app": 4}
    assert list(snapshot.files) == [("a.parquet", "uzN4]T12@:xZCo>$4r.gS@1")]
    assert why_unfit(snapshot, ["v", "k"]) is None


def test_a_commit_is_written_only_if_its_version_is_free(tmp_path):
    _log(tmp_path, 0, {"protocol": PROTOCOL}, {"metaData": META})
    assert not write_commit(tmp_path, 0, [{"commitInfo": {}}])
    assert write_commit(tmp_path, 1, [{"txn": {"appId": "a", "version": 1}}])
    assert not write_commit(tmp_path, 1, [{"txn": {"appId": "b", "version": 1}}])
    assert load_snapshot(tmp_path).transactions == {"a": 1}
    assert sorted(p.name for p in (tmp_path / "_delta_log").iterdir()) == [commit_file_name(0), commit_file_name(1)]


@pytest.mark.parametrize("change, reason", [
    ({"configuration": {}}, "deletion vectors off"),
    ({"configuration": {"delta.enableDeletionVectors": "true", "delta.appendOnly": "true"}}, "append-only"),
    ({"configuration": {"delta.enableDeletionVectors": "true", "delta.constraints.c": "k > 0"}}, "CHECK"),
    ({"partitionColumns": ["k"]}, "partitioned"),
    ({"schemaString": SCHEMA.replace('"metadata": {}}]', '"metadata": {"delta.invariants": "x"}}]')},
     "column v has delta.invariants"),
    ({"schemaString": SCHEMA.replace('"name": "v"', '"name": "V"')}, "columns differ"),
])
def test_what_the_path_cannot_honour_is_named(change, reason):
    snapshot = LogSnapshot(0, PROTOCOL, {**META, **change}, {})
    assert reason in (why_unfit(snapshot, ["k", "v"]) or "")
    row_tracking = LogSnapshot(0, {**PROTOCOL, "writerFeatures": ["deletionVectors", "rowTracking"]}, META, {})
    assert "rowTracking" in (why_unfit(row_tracking, ["k", "v"]) or "")


def test_composite_key_probes_are_null_safe_and_unambiguous():
    keys = pa.table({"p": ["a|b", "a", None, "x", None, "V1:a", ""], "q": ["c", "b|c", "x", None, None, "b", None]})
    probe = key_probe(keys).to_pylist()
    assert len(set(probe)) == len(probe)
    again = key_probe(pa.table({"p": [None, "a|b"], "q": [None, "c"]})).to_pylist()
    assert again == [probe[4], probe[0]]
    ints = key_probe(pa.table({"a": pa.array([1, None, 12], pa.int64()), "b": pa.array([21, 1, None], pa.int64())}))
    assert len(set(ints.to_pylist())) == 3
    single = key_probe(pa.table({"k": pa.array([1, None], pa.int64())}))
    assert single.type == pa.int64() and single.to_pylist() == [1, None]


def test_compaction_takes_small_files_only_in_numbers_and_any_mostly_deleted_file():
    from lakemirror.sinks.accelerator.dv_compaction import COMPACT_MIN_FILES, SMALL_FILE_BYTES, compaction_plan

    def add(name: str, size: int, records: int = 100, deleted: int = 0) -> dict:
        a = {"path": name, "size": size, "stats": json.dumps({"numRecords": records})}
        if deleted:
            a["deletionVector"] = {**DV, "cardinality": deleted}
        return a

    big = add("big", SMALL_FILE_BYTES * 4, deleted=49)
    small = [add(f"s{i}", 1000) for i in range(COMPACT_MIN_FILES - 1)]
    assert compaction_plan([big, *small]) == []
    assert {a["path"] for a in compaction_plan([big, *small, add("one-more", 10)])} == \
        {*(a["path"] for a in small), "one-more"}
    heavy = add("heavy", SMALL_FILE_BYTES * 4, deleted=50)
    assert [a["path"] for a in compaction_plan([big, heavy, *small])] == ["heavy"]


def test_the_key_cache_keeps_one_budget_for_the_process_and_forgets_removed_files(monkeypatch):
    from lakemirror.sinks.accelerator import key_match

    cache = key_match.KeyCache()
    column = pa.array(range(1000), pa.int64())  # 8,000 bytes
    monkeypatch.setattr(key_match, "KEY_CACHE_BYTES", 20_000)
    for name in ("/t/a", "/t/b", "/u/c"):
        cache.put((name, "int64"), column)
    assert cache.get(("/t/a", "int64")) is None, "the least recently used went first"
    assert cache.get(("/t/b", "int64")) is column and cache.get(("/u/c", "int64")) is column
    cache.forget({"/t/other"}, "/t")
    assert cache.get(("/t/b", "int64")) is None and cache.get(("/u/c", "int64")) is column


def test_scratch_tables_a_crash_left_are_removed_once_stale(tmp_path):
    import os

    from lakemirror.delta_log.data_files import SCRATCH_PREFIX, STALE_SCRATCH_SECONDS, remove_stale_scratch

    old, fresh = tmp_path / f"{SCRATCH_PREFIX}old", tmp_path / f"{SCRATCH_PREFIX}fresh"
    for d in (old, fresh):
        (d / "_delta_log").mkdir(parents=True)
        (d / "part-0.parquet").write_bytes(b"x")
    (tmp_path / "part-1.parquet").write_bytes(b"data")
    past = os.stat(fresh).st_mtime - STALE_SCRATCH_SECONDS - 10
    os.utime(old, (past, past))
    assert remove_stale_scratch(tmp_path) == 1
    assert not old.exists() and fresh.exists() and (tmp_path / "part-1.parquet").exists()


def test_files_are_skipped_only_when_their_statistics_rule_every_row_out():
    from lakemirror.sinks.accelerator.key_match import key_ranges, outside

    ranges = key_ranges(pa.table({"a": pa.array([10, 20], pa.int64()), "s": ["x", "y"],
                                  "n": pa.array([1, None], pa.int32())}))
    assert ranges == {"a": (10, 20)}, "strings and columns with NULLs give no range"
    assert outside({"minValues": {"a": 21}, "maxValues": {"a": 90}}, ranges)
    assert outside({"minValues": {"a": 0}, "maxValues": {"a": 9}}, ranges)
    assert not outside({"minValues": {"a": 0}, "maxValues": {"a": 10}}, ranges)
    assert not outside({"minValues": {"a": 15}, "maxValues": {"a": 15}}, ranges)
    assert not outside({"numRecords": 5}, ranges), "no bounds: read it"
    assert not outside({"minValues": {"a": "0"}, "maxValues": {"a": "9"}}, ranges), "not an integer bound"
    assert not outside(None, ranges) and not outside({"minValues": {"a": 0}, "maxValues": {"a": 1}}, {})


@pytest.mark.parametrize("batch_size", [3, 200, 5000])
@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("spread", [1, 3, 5])
def test_file_keys_find_exactly_the_rows_a_batch_changes_by_each_layout_and_search(batch_size, duplicates, spread):
    import numpy as np

    from lakemirror.sinks.accelerator.key_match import FileKeys, KeyLookup, as_integers, from_integers

    rng = np.random.default_rng(batch_size + duplicates + spread)
    values = rng.permutation(np.arange(-3000, 7000, dtype=np.int64)) * spread
    if duplicates:  # a key the source never made unique is matched on every row that holds it
        values[rng.integers(0, len(values), 500)] = values[:500]
    # Dates and timestamps are matched as the integers underneath them.
    for key_type in (pa.int64(), pa.int32(), pa.date32(), pa.timestamp("us", tz="UTC")):
        file_keys = FileKeys(from_integers(values, key_type))
        assert file_keys.layout == ("direct" if spread < 4 and not duplicates else "sorted")
        empty_positions, empty_keys = file_keys.find(KeyLookup(pa.nulls(0, key_type)))
        assert empty_positions.size == 0 and len(empty_keys) == 0
        batches = [rng.choice(np.arange(-5000, 9000) * spread, batch_size, replace=False),  # dense, in and out of the file
                   np.append(rng.choice(np.arange(-5000, 9000) * spread, batch_size, replace=False), 2**30)]  # too wide
        for batch in batches:
            for with_null in (False, True):
                probe = from_integers(batch, key_type)
                if with_null:
                    probe = pa.concat_arrays([probe, pa.nulls(1, key_type)])
                positions, keys = file_keys.find(KeyLookup(probe))
                expected = np.flatnonzero(np.isin(values, batch))
                assert sorted(positions.tolist()) == expected.tolist()
                assert positions.dtype == np.uint32 and keys.type == key_type
                assert as_integers(keys).tolist() == values[positions.astype(np.int64)].tolist(), "each key with its row"


def test_file_keys_other_than_one_integer_column_without_nulls_are_looked_up_row_by_row():
    import numpy as np

    from lakemirror.sinks.accelerator.key_match import FileKeys, KeyLookup, key_probe

    with_null = FileKeys(pa.array([5, None, 7, 5], pa.int64()))
    positions, keys = with_null.find(KeyLookup(pa.array([5, None], pa.int64())))
    assert positions.tolist() == [0, 1, 3] and keys.to_pylist() == [5, None, 5], "NULL equals NULL, as <=>"
    composite = key_probe(pa.table({"a": ["x", "x", None], "b": [1, 2, None]}))
    positions, _ = FileKeys(composite).find(KeyLookup(key_probe(pa.table({"a": [None, "x"], "b": pa.array([None, 2])}))))
    assert positions.tolist() == [1, 2]
    assert FileKeys(composite).nbytes == composite.nbytes and FileKeys(composite).layout == "probe"
    assert FileKeys(pa.array(np.arange(10))).nbytes == 40, "direct: 4 bytes per value of the range"
    assert FileKeys(pa.array(np.arange(10) * 5)).nbytes == 120, "sorted: 12 bytes a row"


def test_the_direct_layout_holds_keys_at_the_ends_of_the_integer_range():
    from lakemirror.sinks.accelerator.key_match import FileKeys, KeyLookup

    top, bottom = 2**63 - 1, -(2**63)
    high = FileKeys(pa.array([top - 3, top, top - 1], pa.int64()))
    low = FileKeys(pa.array([bottom + 2, bottom], pa.int64()))
    assert high.layout == low.layout == "direct"
    positions, keys = high.find(KeyLookup(pa.array([top, bottom, 5, top - 3], pa.int64())))
    assert sorted(zip(positions.tolist(), keys.to_pylist())) == [(0, top - 3), (1, top)]
    positions, keys = low.find(KeyLookup(pa.array([top, bottom + 2], pa.int64())))
    assert positions.tolist() == [0] and keys.to_pylist() == [bottom + 2]
    assert FileKeys(pa.array([bottom, top], pa.int64())).layout == "sorted", "a range too wide to map"


def test_a_batch_lookup_keeps_each_integer_key_once_and_sorted():
    from lakemirror.sinks.accelerator.key_match import FileKeys, KeyLookup

    lookup = KeyLookup(pa.array([5, 5, -3, None, 9, -3], pa.int64()))
    assert lookup.integers is not None and lookup.integers.tolist() == [-3, 5, 9]
    positions, keys = FileKeys(pa.array([9, 5, 6], pa.int64())).find(lookup)
    assert sorted(positions.tolist()) == [0, 1] and sorted(keys.to_pylist()) == [5, 9], "each row once"
