"""lakemirror.delta_log.layout and the offsets' version: the log's names, its commit versions, whether a
local table has a log, and the version an offset stands in (pure, or a temporary folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakemirror.delta_log.layout import (LAST_CHECKPOINT, LOG_DIR, commit_file_name, commit_versions, has_commits,
                                         newest_commit)
from lakemirror.delta_log.stream_offsets import end_offset, reservoir_version, touched_through_from_offset


def _log(table: Path, *names: str) -> Path:
    log = table / LOG_DIR
    log.mkdir(parents=True)
    for name in names:
        (log / name).write_text("{}\n")
    return log


def test_commit_file_names_are_twenty_digits() -> None:
    assert commit_file_name(7) == "00000000000000000007.json"
    assert commit_file_name(12_345_678_901) == "00000000012345678901.json"


def test_only_commit_files_count_as_versions(tmp_path: Path) -> None:
    log = _log(tmp_path, commit_file_name(0), commit_file_name(3), "00000000000000000002.checkpoint.parquet",
               LAST_CHECKPOINT, "00000000000000000004.crc", ".00000000000000000005.json.tmp", "7.json")
    assert sorted(commit_versions(log)) == [0, 3]
    assert newest_commit(log) == 3


def test_a_log_with_no_commit_or_no_log_has_no_newest(tmp_path: Path) -> None:
    assert newest_commit(_log(tmp_path / "t", LAST_CHECKPOINT)) is None
    assert newest_commit(tmp_path / "missing" / LOG_DIR) is None
    with pytest.raises(OSError):
        commit_versions(tmp_path / "missing" / LOG_DIR)


def test_a_table_has_commits_with_its_first_commit_or_a_checkpoint(tmp_path: Path) -> None:
    """Log cleanup removes the first commits once a checkpoint holds them; an empty log is no table yet."""
    _log(tmp_path / "first", commit_file_name(0))
    _log(tmp_path / "cleaned", LAST_CHECKPOINT, commit_file_name(40))
    _log(tmp_path / "empty")
    _log(tmp_path / "later_only", commit_file_name(1))
    assert has_commits(tmp_path / "first") and has_commits(tmp_path / "cleaned")
    assert not has_commits(tmp_path / "empty") and not has_commits(tmp_path / "later_only")
    assert not has_commits(tmp_path / "no_table")


def test_the_version_an_offset_stands_in() -> None:
    assert reservoir_version(json.dumps(end_offset("id-1", 4))) == 5
    assert reservoir_version('{"reservoirVersion": 9, "index": 2}') == 9
    assert reservoir_version('{"sourceVersion": 1}') is None
    assert reservoir_version('"9"') is None
    assert reservoir_version(None) is None
    with pytest.raises(ValueError):
        reservoir_version("not json")


def test_the_newest_version_an_offset_has_read_any_of() -> None:
    """Inside a version (a rate limit split it) some of its changes are read; before its first file, none."""
    assert touched_through_from_offset('{"reservoirVersion": 9, "index": 2}') == 9
    assert touched_through_from_offset('{"reservoirVersion": 9, "index": 0}') == 9
    assert touched_through_from_offset(json.dumps(end_offset("id-1", 4))) == 4
    assert touched_through_from_offset('{"reservoirVersion": 9}') == 8
    assert touched_through_from_offset('{"index": 3}') is None and touched_through_from_offset(None) is None
