"""Crash exactness of an event source: Debezium events from the session's Kafka broker into Delta
replicas, the daemon SIGKILLed at each named point of the event batch path and restarted, then the
proof of tests/torture/kafka_harness.py (replica == ordered fold of the distinct events, dead
letters exactly once, no transaction committed twice).

The points (supervisor/events/stream_runner.py: EVENT_FAULT_POINTS): the batch planned with nothing
written; a replica's MERGE committed before its tombstones and before the batch's other replicas;
every replica committed before the dead letters; the dead letters committed before Spark's commit
log; and a replica's MERGE reached a second time. Once with current-row replicas, once with history
(``history: scd2``: one row per key version, equal to the SCD2 fold of the events), whose replicas
remember a batch's closes before their MERGE: a kill between those two commits too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.torture.kafka_harness import EVENT_POINTS, HISTORY_POINTS, EventTorture

pytestmark = pytest.mark.e2e


def test_killed_between_replicas_the_event_batch_is_applied_once(spark: Any, tmp_path: Path, broker: str) -> None:
    """The smoke of ``make test``: one SIGKILL after one replica's MERGE committed and before the
    batch's other replicas and its tombstones; the restarted daemon replays the batch, the committed
    replica skips it by its transaction id, the others apply it."""
    report = EventTorture(spark, tmp_path, broker, seed=25).run(("events_after_replica_merge",))
    assert [(k.point, k.reached) for k in report.kills] == [("events_after_replica_merge", True)]
    assert {"accounts: replica equals the ordered fold", "orders: replica equals the ordered fold",
            "dead letters exactly once"} <= set(report.checks), report.checks


@pytest.mark.slow
@pytest.mark.parametrize(("history", "points"), [("current", EVENT_POINTS), ("scd2", HISTORY_POINTS)])
def test_killed_on_the_event_path_the_replicas_equal_the_fold_of_the_events(
        spark: Any, tmp_path: Path, broker: str, history: str, points: tuple[str, ...]) -> None:
    report = EventTorture(spark, tmp_path, broker, seed=25, history=history).run(points)
    not_reached = [k.point for k in report.kills if not k.reached]
    assert not not_reached, f"crash points never reached: {not_reached}"
    assert [k.point for k in report.kills] == list(points)
    assert {"accounts: replica equals the ordered fold", "orders: replica equals the ordered fold",
            "dead letters exactly once"} <= set(report.checks), report.checks
    # The executor under torture: the driver's delta-rs MERGE for current rows (local replicas, the
    # default), Spark's MERGE for history (docs/event-sources.md, "The sequence guard").
    log = (tmp_path / "daemon.log").read_text(errors="replace")
    assert ("applies on the driver by a delta-rs MERGE under the sequence guard" in log) == (history == "current")
