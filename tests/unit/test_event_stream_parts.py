"""The pure parts of an event source's stream: file lines with their numbers, Kafka rows in offset
order, and the transaction-id epoch that is renewed with the checkpoint."""

from __future__ import annotations

from pathlib import Path

from lakemirror.sources.event_stream import RawEvent, raw_events_from_file_rows, raw_events_from_kafka_rows
from lakemirror.supervisor.events.stream_runner import checkpoint_epoch


def test_file_rows_become_numbered_lines_in_path_order() -> None:
    rows = [{"file": "file:/in/b.json", "value": "x\n\n  \ny\n"}, {"file": "file:/in/a.json", "value": "z"}]
    assert list(raw_events_from_file_rows(rows)) == [
        RawEvent("z", None, "file:/in/a.json", None, 1), RawEvent("x", None, "file:/in/b.json", None, 1),
        RawEvent("y", None, "file:/in/b.json", None, 4)]


def test_kafka_rows_in_partition_and_offset_order() -> None:
    rows = [{"topic": "t", "partition": 1, "offset": 0, "key": "k", "value": None},
            {"topic": "t", "partition": 0, "offset": 9, "key": "k2", "value": "v"}]
    assert [(r.partition, r.offset, r.value) for r in raw_events_from_kafka_rows(rows)] == [(0, 9, "v"), (1, 0, None)]


def test_epoch_is_kept_with_the_checkpoint_and_renewed_when_it_is_reset(tmp_path: Path) -> None:
    first = checkpoint_epoch(tmp_path)
    assert checkpoint_epoch(tmp_path) != first   # no offsets yet: a fresh checkpoint each time
    kept = checkpoint_epoch(tmp_path)
    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    (tmp_path / "checkpoint" / "offsets" / "0").write_text("v1")
    assert checkpoint_epoch(tmp_path) == kept == checkpoint_epoch(tmp_path)
    (tmp_path / "checkpoint" / "offsets" / "0").unlink()  # the checkpoint was reset
    assert checkpoint_epoch(tmp_path) != kept
