"""Pause and resync of an event source's runner, without Spark: the pause kept in the state store,
a resync that retires the checkpoint (a new epoch at the next launch), and a resync refused when the
topic no longer holds events the replicas never took."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakemirror.checkpoints.state import FileStateStore
from lakemirror.sources.kafka_offsets import BrokerOffsets, StaticOffsets
from lakemirror.sources.memory_events import MemoryEventSource
from lakemirror.supervisor.control import table_state as sm
from lakemirror.sinks.events.memory_sink import memory_event_sink
from lakemirror.supervisor.events.stream_runner import (EventStreamRunner, EventStreamSpec, checkpoint_epoch,
                                                        resync_refusal)


def runner(folder: Path, broker: BrokerOffsets | None, states: FileStateStore | None = None,
           kind: str = "kafka") -> EventStreamRunner:
    spec = EventStreamSpec("shop", kind, bootstrap_servers="127.0.0.1:1", topic_pattern="shop\\..*",
                           path=str(folder / "inbox"))
    source = MemoryEventSource(kind, offsets=broker)
    return EventStreamRunner(spec, None, folder, memory_event_sink(spec, source.decoder, "p"),  # type: ignore[arg-type]
                             source=source, states=states)


def committed_checkpoint(folder: Path, end: int) -> Path:
    """A query checkpoint whose last committed batch ended at offset ``end`` of ``t-0``."""
    cp = folder / "checkpoint"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    (cp / "offsets" / "0").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"t":{{"0":{end}}}}}\n')
    (cp / "commits" / "0").write_text("v1\n{}")
    return cp


def test_the_pause_is_kept_in_the_state_store_for_the_next_daemon(tmp_path: Path) -> None:
    states = FileStateStore(tmp_path / "pipeline")
    first = runner(tmp_path, StaticOffsets(), states)
    assert first.persisted_pause() is False
    first.pause_persisted(True)
    assert runner(tmp_path, StaticOffsets(), FileStateStore(tmp_path / "pipeline")).persisted_pause() is True
    first.pause_persisted(False)
    assert runner(tmp_path, StaticOffsets(), FileStateStore(tmp_path / "pipeline")).persisted_pause() is False


def test_a_resync_retires_the_checkpoint_so_the_next_launch_takes_a_new_epoch(tmp_path: Path) -> None:
    cp = committed_checkpoint(tmp_path, 8)
    old = checkpoint_epoch(tmp_path)
    assert checkpoint_epoch(tmp_path) == old  # kept while the checkpoint has offsets
    r = runner(tmp_path, StaticOffsets({("t", 0): 12}, {("t", 0): 5}))
    r._applied_offsets = {("t", 0): 8}
    r.resync("operator")
    assert not cp.exists() and not list(tmp_path.glob("checkpoint.retired-*"))
    assert r._applied_offsets == {} and r.applied_through is None
    assert checkpoint_epoch(tmp_path) != old
    assert r.poll() == []  # nothing refused


def test_a_resync_is_refused_when_retention_removed_events_never_applied(tmp_path: Path) -> None:
    cp = committed_checkpoint(tmp_path, 8)
    r = runner(tmp_path, StaticOffsets({("t", 0): 20}, {("t", 0): 11}))
    r.resync("operator")
    assert (cp / "commits" / "0").is_file()  # the old checkpoint stays
    r.launch()  # instead of starting, the source fails with the reason and what to do
    (failed,) = r.poll()
    assert isinstance(failed, sm.Failed) and failed.fatal and failed.code == "resync_refused"
    assert "t-0 starts at offset 11 but the replicas applied up to 8 (3 events lost)" in failed.error
    assert str(cp) in failed.error and "snapshot" in failed.error


def test_a_resync_is_refused_when_the_broker_does_not_answer(tmp_path: Path) -> None:
    class Down:
        def latest(self) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
            raise ConnectionError("no broker at 127.0.0.1:1")

        def close(self) -> None:
            pass

    cp = committed_checkpoint(tmp_path, 8)
    r = runner(tmp_path, Down())
    r.resync("operator")
    r.launch()
    (failed,) = r.poll()
    assert isinstance(failed, sm.Failed) and "did not say which offsets it still holds" in failed.error
    assert cp.is_dir()


def test_a_files_source_resyncs_without_asking_a_broker(tmp_path: Path) -> None:
    cp = committed_checkpoint(tmp_path, 8)
    runner(tmp_path, None, kind="files").resync("operator")
    assert not cp.exists()


def test_the_refusal_names_only_partitions_that_lost_unapplied_events() -> None:
    applied = {("t", 0): 8, ("t", 1): 3}
    assert resync_refusal("events:s", applied, {("t", 0): 8, ("t", 1): 0, ("u", 0): 50}, Path("/ck")) is None
    text = resync_refusal("events:s", applied, {("t", 0): 2, ("t", 1): 9}, Path("/ck"))
    assert text is not None and "t-1 starts at offset 9" in text and "t-0" not in text


def test_the_event_crash_points_can_be_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    from lakemirror.daemon.context import KILL_AT_ENV, crash_points_from_environment
    from lakemirror.errors import ConfigError
    from lakemirror.supervisor.events.stream_runner import EVENT_FAULT_POINTS

    for point in EVENT_FAULT_POINTS:
        monkeypatch.setenv(KILL_AT_ENV, f"{point}:2")
        crash_points_from_environment()("some_other_point")  # armed, and not reached: no kill
    monkeypatch.setenv(KILL_AT_ENV, "events_after_lunch")
    with pytest.raises(ConfigError, match="events_after_replica_merge"):
        crash_points_from_environment()


def test_a_postgres_event_runner_keeps_its_pause_and_resyncs_the_same_way(tmp_path: Path) -> None:
    from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas
    from lakemirror.sinks.postgres.executor import PostgresTarget

    spec = EventStreamSpec("shop", "kafka", bootstrap_servers="127.0.0.1:1", topics="t")
    target = PostgresTarget("127.0.0.1", 1, "db", "s", "u")

    def make() -> EventStreamRunner:
        offsets = StaticOffsets({("t", 0): 9}, {("t", 0): 0})
        source = MemoryEventSource("kafka", offsets=offsets)
        sink = PostgresEventReplicas(target, "p", spec.name, source.decoder, label="events:shop")
        return EventStreamRunner(spec, None, tmp_path, sink,  # type: ignore[arg-type]
                                 states=FileStateStore(tmp_path / "pipeline"), source=source)

    make().pause_persisted(True)
    assert make().persisted_pause() is True
    cp = committed_checkpoint(tmp_path, 8)
    make().resync("operator")
    assert not cp.exists()
