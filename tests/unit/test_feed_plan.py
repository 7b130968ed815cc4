"""The next batch planned from the source's commit files, and the stream log the daemon continues
(pure planning; the log in a temporary folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakemirror.checkpoints.stream_dir import batch_offsets, interrupted_writes
from lakemirror.checkpoints.stream_log import EntryExists, StreamLog
from lakemirror.delta_log.stream_offsets import (VersionRange, VersionShape, applied_through_from_offset, batch_versions,
                                                 end_offset)
from lakemirror.sources.feed_plan import FeedPlan, plan_feed_batch

ID = "3de58330-9601-4ce1-9bea-2546061ba0e6"


def offset(version: int, index: int = -1, table_id: str = ID, starting: bool = False) -> str:
    return json.dumps({"sourceVersion": 1, "reservoirId": table_id, "reservoirVersion": version, "index": index,
                       "isStartingVersion": starting})


def plan(offsets: dict[int, str], commits: int | None, latest: int, *, shapes: dict[int, VersionShape] | None = None,
         after: int = 0, window: int = 32, table_id: str = ID) -> FeedPlan:
    known = shapes or {}
    return plan_feed_batch(latest_offsets=max(offsets) if offsets else None, latest_commit=commits,
                           offset_of=offsets.get, latest_version=latest, after_version=after, table_id=table_id,
                           shape=lambda v: known.get(v, VersionShape(2)), window=window)


def test_the_batch_after_the_last_logged_one_holds_every_new_plain_version() -> None:
    # Spark's batch 0 ended before version 2; versions 2..5 are new
    found = plan({0: offset(2)}, 0, 5)
    assert found.spark is None and found.batch is not None
    assert found.batch.batch_id == 1 and found.batch.versions == VersionRange(2, 5) and not found.batch.rerun
    assert found.batch.end_offset == {"sourceVersion": 1, "reservoirId": ID, "reservoirVersion": 6, "index": -1,
                                      "isStartingVersion": False}
    # a batch that ended at its version's last file (index 1 of 2 files) continues at the next version
    assert plan({0: offset(2, 1)}, 0, 4).batch.versions == VersionRange(3, 4)  # type: ignore[union-attr]


def test_nothing_new_plans_nothing_and_the_epochs_first_batch_is_sparks() -> None:
    assert plan({0: offset(3)}, 0, 2) == FeedPlan()
    first = plan({}, None, 5)
    assert first.batch is None and "first batch" in (first.spark or "")


def test_the_versions_the_stream_starts_after_are_never_planned() -> None:
    assert plan({0: offset(2)}, 0, 9, after=6).batch.versions == VersionRange(7, 9)  # type: ignore[union-attr]


@pytest.mark.parametrize("offsets, commits, latest, shapes, table_id, words", [
    ({0: offset(2)}, 0, 40, {}, ID, "39 versions to apply, more than 32"),
    ({0: offset(2)}, 0, 4, {3: VersionShape(1, "it changes the table's metadata or protocol")}, ID,
     "version 3: it changes the table's metadata"),
    ({0: offset(2, 0)}, 0, 4, {}, ID, "ended inside version 2"),
    ({0: offset(2)}, 0, 4, {}, "another-table", "table id is now another-table"),
    ({0: offset(0, starting=True)}, 0, 4, {}, ID, "initial snapshot"),
    ({0: "not json"}, 0, 4, {}, ID, "not Delta's streaming source's"),
], ids=["backlog", "schema change", "split version", "recreated source", "snapshot", "unreadable offsets"])
def test_what_spark_plans_instead_is_named(offsets: dict[int, str], commits: int, latest: int,
                                           shapes: dict[int, VersionShape], table_id: str, words: str) -> None:
    found = plan(offsets, commits, latest, shapes=shapes, table_id=table_id)
    assert found.batch is None and words in (found.spark or ""), found


def test_a_batch_logged_and_never_committed_is_rerun_with_its_own_offsets() -> None:
    found = plan({0: offset(2), 1: offset(5)}, 0, 9)
    assert found.batch is not None and found.batch.rerun and found.batch.batch_id == 1
    assert found.batch.versions == VersionRange(2, 4), "its own range, not the source's latest"
    # ... unless its range is not whole plain versions: Spark re-runs it from the same offsets
    split = plan({0: offset(2), 1: offset(4, 0)}, 0, 9)
    assert split.batch is None and "batch 1, logged before a stop" in (split.spark or "")
    gap = plan({0: offset(2), 3: offset(5)}, 0, 9)
    assert gap.batch is None and "commit log ends at 0, its offsets at 3" in (gap.spark or "")
    assert plan({0: offset(3)}, None, 9, after=1).batch.versions == VersionRange(2, 2)  # type: ignore[union-attr]


def test_a_planned_batchs_end_offset_is_read_back_as_delta_writes_them() -> None:
    """The end offset the daemon logs is read by the same code as Spark's: the next batch starts
    after it, and the applied version is the batch's last."""
    written = json.dumps(end_offset(ID, 7))
    assert applied_through_from_offset(written) == 7
    from lakemirror.delta_log.stream_offsets import SourceOffset

    assert batch_versions(SourceOffset.parse(written), SourceOffset.parse(offset(9)), 0,
                          lambda v: VersionShape(1)) == VersionRange(8, 8)


def test_the_stream_log_is_continued_as_spark_writes_it(tmp_path: Path) -> None:
    log = StreamLog(tmp_path)
    assert log.latest_offsets() is None and log.latest_commit() is None
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {"spark.sql.shuffle.partitions": "2"}}
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n" + json.dumps(meta) + "\n" + offset(2))
    (tmp_path / "offsets" / ".0.crc").write_bytes(b"crc")
    log.write_commit(0)
    assert log.batch_metadata(0) == meta
    log.write_offsets(1, end_offset(ID, 4), meta, now_ms=42)
    text = (tmp_path / "offsets" / "1").read_text()
    lines = text.splitlines()
    assert lines[0] == "v1" and json.loads(lines[1]) == {**meta, "batchTimestampMs": 42}
    assert json.loads(lines[2]) == end_offset(ID, 4)
    assert batch_offsets(str(tmp_path), 1) == (offset(2), lines[2]), "read as Spark's own entries are"
    assert log.latest_offsets() == 1 and log.latest_commit() == 0
    log.write_commit(1)
    assert (tmp_path / "commits" / "1").read_text() == 'v1\n{"nextBatchWatermarkMs":0}'
    with pytest.raises(EntryExists):
        log.write_offsets(1, end_offset(ID, 9), meta)
    assert json.loads((tmp_path / "offsets" / "1").read_text().splitlines()[2]) == end_offset(ID, 4), "never replaced"
    assert not interrupted_writes(p.name for p in (tmp_path / "offsets").iterdir() if p.name != ".0.crc")
    assert log.purge(1) == 2 and sorted(p.name for p in (tmp_path / "offsets").iterdir()) == ["1"]
    assert sorted(p.name for p in (tmp_path / "commits").iterdir()) == ["1"]
