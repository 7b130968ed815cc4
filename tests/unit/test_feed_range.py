"""Which whole source versions a change-feed batch holds, from its offsets (no Spark)."""

from __future__ import annotations

import json

import pytest

from lakemirror.checkpoints.stream_dir import batch_offsets, source_offset
from lakemirror.delta_log.commit_files import LocalCommitActions
from lakemirror.delta_log.stream_offsets import (SourceOffset, VersionRange, VersionShape, batch_versions,
                                           version_shape)


def cdc(n: int = 1) -> list[dict]:
    return [{"cdc": {"path": f"_change_data/c{i}.parquet"}} for i in range(n)]


def adds(n: int, data_change: bool = True, vector: bool = False) -> list[dict]:
    return [{"add": {"path": f"a{i}.parquet", "dataChange": data_change,
                     **({"deletionVector": {"storageType": "u"}} if vector else {})}} for i in range(n)]


def removes(n: int) -> list[dict]:
    return [{"remove": {"path": f"r{i}.parquet", "dataChange": True}} for i in range(n)]


def info(operation: str = "WRITE", **metrics: str) -> list[dict]:
    return [{"commitInfo": {"operation": operation, "operationMetrics": metrics}}]


# -- one commit's shape ---------------------------------------------------------------------------

def test_a_commit_with_change_data_files_counts_only_those():
    shape = version_shape([*info("MERGE"), *adds(3), *removes(2), *cdc(4)])
    assert shape == VersionShape(4)


def test_a_commit_without_change_data_counts_its_data_changing_adds_and_removes():
    assert version_shape([*info(), *adds(3), *removes(2), *adds(5, data_change=False)]) == VersionShape(5)


def test_a_compaction_has_no_file_to_read():
    assert version_shape([*info("OPTIMIZE"), *adds(1, data_change=False), *removes(0)]).files == 0


@pytest.mark.parametrize("actions, why", [
    ([*info(), {"metaData": {"id": "x"}}], "metadata"),
    ([*info(), {"protocol": {"minReaderVersion": 3}}, *cdc(1)], "metadata"),
    ([*info("DELETE"), *adds(1, vector=True), *removes(1)], "deletion vectors"),
    ([*info("MERGE", numTargetRowsInserted="0", numTargetRowsUpdated="0", numTargetRowsDeleted="0"), *adds(1),
      *removes(1)], "changed no row"),
    ([*info(), {"add": {"path": "a.parquet"}}], "dataChange"),
])
def test_commits_delta_rs_might_read_differently_are_named(actions, why):
    assert why in (version_shape(actions).unfit or "")


def test_a_merge_with_change_data_or_with_changed_rows_is_fit():
    assert version_shape([*info("MERGE", numTargetRowsInserted="0", numTargetRowsUpdated="0",
                                numTargetRowsDeleted="0"), *cdc(1)]).unfit is None
    assert version_shape([*info("MERGE", numTargetRowsInserted="2", numTargetRowsUpdated="0",
                                numTargetRowsDeleted="0"), *adds(1)]).unfit is None
    assert version_shape([*info("DELETE"), *adds(1, vector=True), *cdc(1)]).unfit is None


def test_an_add_without_a_data_change_flag_cannot_be_counted():
    assert version_shape([*info(), {"add": {"path": "a.parquet"}}]).files is None


# -- a batch's range ------------------------------------------------------------------------------

SHAPES = {3: VersionShape(2), 4: VersionShape(3), 5: VersionShape(1), 6: VersionShape(0), 7: VersionShape(4),
          8: VersionShape(2, "it changes the table's metadata or protocol")}


def shape(version: int) -> VersionShape | None:
    return SHAPES.get(version)


def at(version: int, index: int) -> SourceOffset:
    return SourceOffset(version, index)


@pytest.mark.parametrize("start, end, expected", [
    (at(3, -1), at(5, -1), VersionRange(3, 4)),        # before 3's first file up to before 5's
    (at(3, 1), at(5, 0), VersionRange(4, 5)),          # 3 ended whole in the last batch; 5 whole here
    (at(3, 1), at(4, 2), VersionRange(4, 4)),
    (at(4, 2), at(7, 3), VersionRange(5, 7)),          # a version with no file to read inside
    (at(5, 0), at(6, -1), VersionRange(6, 5)),         # nothing: an empty range
    (None, at(5, 0), VersionRange(3, 5)),              # the first batch, after version 2
    (at(1, -1), at(4, 2), VersionRange(3, 4)),         # versions up to after_version are never in a batch
])
def test_a_batch_between_version_boundaries_holds_those_versions_whole(start, end, expected):
    assert batch_versions(start, end, after_version=2, shape=shape) == expected


@pytest.mark.parametrize("start, end, why", [
    (at(3, 0), at(5, -1), "starts inside version 3"),   # 3 has files 0 and 1: file 1 is in this batch
    (at(3, -1), at(4, 1), "ends inside version 4"),     # 4 has files 0-2: file 2 is in the next one
    (at(3, -1), at(4, 5), "ends inside version 4"),     # an index past the last file: not ours to place
    (at(3, -1), at(4, -20), "ends inside version 4"),   # a schema-tracking barrier index
    (at(7, 3), at(9, -1), "version 8"),                 # a metadata change inside
    (at(7, 3), at(10, -1), "version 8"),
    (at(4, 2), at(11, 0), "cannot be read"),
])
def test_a_batch_that_may_hold_part_of_a_version_is_left_to_spark(start, end, why):
    found = batch_versions(start, end, after_version=2, shape=shape)
    assert isinstance(found, str) and why in found


def test_an_unreadable_boundary_commit_or_a_snapshot_offset_is_left_to_spark():
    assert isinstance(batch_versions(at(20, 0), at(21, -1), 2, shape), str)
    assert "snapshot" in str(batch_versions(SourceOffset(3, 0, starting=True), at(5, -1), 2, shape))
    assert "snapshot" in str(batch_versions(at(3, -1), SourceOffset(5, -1, starting=True), 2, shape))


def test_offsets_parse_from_the_checkpoints_json():
    text = ('{"sourceVersion":1,"reservoirId":"e5e38a51","reservoirVersion":2,"index":2,'
            '"isStartingVersion":false}')
    assert SourceOffset.parse(text) == SourceOffset(2, 2, False, "e5e38a51")
    assert SourceOffset.parse({"reservoirVersion": "4", "index": "-1", "isStartingVersion": True}) == \
        SourceOffset(4, -1, True)


# -- reading the files ----------------------------------------------------------------------------

def test_commit_files_are_read_from_the_tables_log(tmp_path):
    log_dir = tmp_path / "_delta_log"
    log_dir.mkdir()
    (log_dir / f"{7:020d}.json").write_text("\n".join(json.dumps(a) for a in [*info(), *cdc(3)]) + "\n")
    (log_dir / f"{8:020d}.json").write_text("{not json\n")
    commits = LocalCommitActions(str(tmp_path))
    assert commits.shape(7) == VersionShape(3)
    assert commits.shape(8) is None and commits.shape(9) is None


def _entry(offset: str) -> str:
    return "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1}) + "\n" + offset


def test_a_batchs_offsets_are_its_own_and_the_previous_batchs(tmp_path):
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    for batch, text in {0: '{"reservoirVersion":3,"index":-1}', 1: '{"reservoirVersion":5,"index":0}'}.items():
        (offsets / str(batch)).write_text(_entry(text))
    assert batch_offsets(str(tmp_path), 0) == (None, '{"reservoirVersion":3,"index":-1}')
    assert batch_offsets(str(tmp_path), 1) == ('{"reservoirVersion":3,"index":-1}', '{"reservoirVersion":5,"index":0}')
    assert batch_offsets(f"file://{tmp_path}", 1) is not None
    assert batch_offsets(str(tmp_path), 2) is None                       # not written
    (offsets / "4").write_text(_entry('{"reservoirVersion":9,"index":-1}'))
    assert batch_offsets(str(tmp_path), 4) is None                       # its start is gone
    assert batch_offsets("s3://bucket/ck", 1) is None                    # not on this file system


def test_an_offsets_file_of_several_sources_or_none_is_not_read():
    assert source_offset(_entry("-")) is None
    assert source_offset(_entry('{"a":1}') + '\n{"b":2}') is None
    assert source_offset("v1\n{}") is None
