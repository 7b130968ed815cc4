"""bench.recipe_job: the user recipe's progress and replica commits, read from outside (pure, and
over real files in a folder laid out as the query's checkpoint and the tables' logs)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.measure import Apply
from bench.recipe_job import LocalStore, TableProgress, batch_end_offset, bucket_key, reached_after, txn_commits


def _offset(version: int, index: int, starting: bool = False) -> str:
    return json.dumps({"sourceVersion": 1, "reservoirId": "id-1", "reservoirVersion": version, "index": index,
                       "isStartingVersion": starting})


def _files(counts: dict[int, int]):  # version (or snapshot version) -> file count; None elsewhere
    return lambda v: counts.get(v)


def test_a_batch_ending_before_a_version_holds_every_version_below_it() -> None:
    assert reached_after(_offset(7, -1), _files({}), _files({})) == 6


def test_a_batch_ending_at_a_versions_last_file_holds_that_version_and_one_inside_it_does_not() -> None:
    assert reached_after(_offset(7, 2), _files({7: 3}), _files({})) == 7
    assert reached_after(_offset(7, 1), _files({7: 3}), _files({})) == 6
    assert reached_after(_offset(7, 2), _files({}), _files({})) == 6  # the commit cannot be counted: not claimed


def test_the_initial_snapshot_counts_once_its_last_file_is_read() -> None:
    assert reached_after(_offset(3, 4, starting=True), _files({3: 1}), _files({3: 5})) == 3
    assert reached_after(_offset(3, 3, starting=True), _files({3: 1}), _files({3: 5})) is None
    assert reached_after(_offset(3, -1, starting=True), _files({}), _files({3: 5})) is None


def test_the_end_offset_is_the_source_line_of_an_offsets_file() -> None:
    text = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n' + _offset(5, -1) + "\n"
    assert batch_end_offset(text) == _offset(5, -1)
    assert batch_end_offset("v1\n{}\n") is None


def test_replica_commits_are_told_by_the_recipes_own_transaction_id() -> None:
    mine = '{"txn":{"appId":"cdc-recipe-t00","version":4,"lastUpdated":1}}\n{"commitInfo":{"timestamp":5000}}\n'
    other = '{"txn":{"appId":"someone-else","version":9}}\n{"commitInfo":{"timestamp":6000}}\n'
    plain = '{"commitInfo":{"timestamp":7000,"operation":"CREATE TABLE"}}\n'
    assert txn_commits([(3, other), (2, mine), (1, plain)], "cdc-recipe-t00") == [(5.0, 4)]


def test_s3_locations_split_into_bucket_and_key() -> None:
    assert bucket_key("s3a://b/run/lakehouse/src/bench/t00") == ("b", "run/lakehouse/src/bench/t00")
    assert bucket_key("s3://b/x/") == ("b", "x")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_progress_and_applies_from_the_checkpoint_and_the_logs(tmp_path: Path) -> None:
    """A query that read the initial snapshot at version 0 (batch 0), then versions 1-2 (batch 1),
    then planned version 3 without committing it (batch 2)."""
    ck = tmp_path / "ck"
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'
    for batch, offset in ((0, _offset(0, 0, starting=True)), (1, _offset(2, 1)), (2, _offset(3, 0))):
        _write(ck / "offsets" / str(batch), f"v1\n{meta}\n{offset}\n")
    for batch in (0, 1):
        _write(ck / "commits" / str(batch), 'v1\n{"nextBatchWatermarkMs":0}\n')
    log = "lake/src/_delta_log"
    cdc = '{"cdc":{"path":"a"}}\n{"cdc":{"path":"b"}}\n{"commitInfo":{"operation":"MERGE"}}\n'
    _write(tmp_path / log / f"{2:020d}.json", cdc)
    _write(tmp_path / log / f"{3:020d}.json", '{"cdc":{"path":"c"}}\n')
    replica = "lake/dst/_delta_log"
    _write(tmp_path / replica / f"{0:020d}.json", '{"commitInfo":{"timestamp":1000}}\n')
    for version, batch, ms in ((1, 0, 2000), (2, 1, 4500)):
        _write(tmp_path / replica / f"{version:020d}.json",
               f'{{"txn":{{"appId":"cdc-recipe-t00","version":{batch}}}}}\n{{"commitInfo":{{"timestamp":{ms}}}}}\n')
    progress = TableProgress(ck, "lake/src", "lake/dst", "cdc-recipe-t00", LocalStore(tmp_path),
                             snapshot_files=_files({0: 1}))
    assert progress.applied_through() == 2  # batch 2 is planned, not committed
    assert progress.applies() == [Apply(2.0, 0), Apply(4.5, 2)]
    (batch_times,) = progress.batch_times()  # batch 1 (batch 0 is the snapshot); batch 2 has no commit yet
    assert batch_times[1] >= 0 and batch_times[2] == 2
