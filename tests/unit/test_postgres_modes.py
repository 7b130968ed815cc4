"""Modes of a PostgreSQL replica: the pure choice of a cycle, the connection budget, the settings,
and the cycles themselves on in-memory twins of the source and the replica. No server, no Spark."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pytest

from lakemirror.checkpoints.state import InMemoryStateStore, TableProgress
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.settings.runtime_spec import cycle_mode, destination_subtasks, mode_of
from lakemirror.errors import ConfigError, LakemirrorError
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.postgres.modes import (DEFAULT_SNAPSHOT_ABOVE, change_fraction, choose_cycle,
                                             connection_budget, cycle_batch_id)
from lakemirror.sinks.postgres.plan import ReplicaTable
from lakemirror.sinks.postgres.protocol import MemoryReplicaSink
from lakemirror.sources.catalog import CDF_PROPERTY, TableInfo
from lakemirror.sinks.postgres.cycles import PostgresCycle
from lakemirror.supervisor.subtasks.scheduler import DailyAt, Every
from lakemirror.tables import TableLocation

# -- the choice ---------------------------------------------------------------------------------


def test_the_change_fraction_is_change_rows_over_table_rows():
    assert change_fraction(5, 100) == 0.05
    assert change_fraction(0, 0) == 0.0
    assert math.isinf(change_fraction(3, 0))
    with pytest.raises(ValueError):
        change_fraction(-1, 10)


def test_a_triggered_cycle_applies_changes_below_the_crossover_and_snapshots_at_or_above_it():
    below = choose_cycle("triggered", head=9, reached=4, fraction=0.05, snapshot_above=0.2)
    assert (below.action, below.fraction) == ("incremental", 0.05)
    assert "versions 5-9" in below.reason and "5.0%" in below.reason
    assert choose_cycle("triggered", head=9, reached=4, fraction=0.2, snapshot_above=0.2).action == "snapshot"
    assert choose_cycle("triggered", head=9, reached=4, fraction=0.7, snapshot_above=0.2).action == "snapshot"
    assert choose_cycle("triggered", head=9, reached=4, fraction=math.inf, snapshot_above=0.2).action == "snapshot"


def test_nothing_new_is_nothing_and_a_fresh_epoch_is_always_a_snapshot():
    assert choose_cycle("triggered", head=4, reached=4).action == "nothing"
    assert choose_cycle("snapshot", head=4, reached=4).action == "nothing"
    fresh = choose_cycle("triggered", head=4, reached=None)
    assert fresh.action == "snapshot"
    forced = choose_cycle("triggered", head=9, reached=4, fraction=0.0, fresh_epoch_reason="source replaced")
    assert (forced.action, forced.reason) == ("snapshot", "source replaced")


def test_snapshot_mode_snapshots_every_new_version_without_measuring():
    assert choose_cycle("snapshot", head=5, reached=4).action == "snapshot"


def test_the_choice_refuses_what_it_cannot_decide():
    with pytest.raises(ValueError, match="continuous"):
        choose_cycle("continuous", head=5, reached=4, fraction=0.1)
    with pytest.raises(ValueError, match="fraction"):
        choose_cycle("triggered", head=5, reached=4)


def test_cycle_batch_ids_never_meet_stream_batch_ids_or_the_bootstrap():
    ids = [cycle_batch_id(v) for v in range(0, 50)]
    assert len(set(ids)) == 50 and all(i < -1 for i in ids)
    with pytest.raises(ValueError):
        cycle_batch_id(-1)


# -- the connection budget ------------------------------------------------------------------------


def test_the_budget_shows_its_arithmetic():
    over = connection_budget(4, tasks=3, per_task=1, pool=2)
    assert not over.fits and over.needed == 5
    assert over.arithmetic() == "3 tasks × 1 connection + 2 (the daemon's pool) = 5 > max_connections 4"
    fits = connection_budget(8, tasks=3, pool=2)
    assert fits.fits and fits.arithmetic().endswith("= 5 <= max_connections 8")
    assert connection_budget(4, tasks=3).pool == 1 and connection_budget(4, tasks=3).fits
    assert not connection_budget(3, tasks=3).fits  # the daemon keeps at least one connection


# -- settings -------------------------------------------------------------------------------------

BASE: dict[str, Any] = {"source_catalog": "s", "destination_catalog": "d", "schema_name": "x",
                        "checkpoint_volume": "/tmp/lm-cfg-test"}
PG = {"kind": "postgres", "host": "db", "database": "app", "user": "lm"}
KAFKA = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topics": ["t"]}


def settings(**destination: Any) -> Any:
    return load_settings(None, {**BASE, "destination": {**PG, **destination}})


def problems_of(overrides: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as err:
        load_settings(None, {**BASE, **overrides})
    return err.value.problems


def test_modes_default_to_continuous_and_need_a_schedule_otherwise():
    s = settings()
    assert s.destination.mode == "continuous" and destination_subtasks(s) == []
    s = settings(mode="triggered", every_seconds=60, table_modes={"big": "snapshot", "hot": "continuous"})
    assert (mode_of(s, "orders"), mode_of(s, "big"), mode_of(s, "hot")) == ("triggered", "snapshot", "continuous")
    tasks = {t.name: t for t in destination_subtasks(s)}
    assert set(tasks) == {"postgres-triggered", "postgres-snapshot"}
    assert tasks["postgres-triggered"].tables is None and tasks["postgres-snapshot"].tables == ("big",)
    assert tasks["postgres-triggered"].trigger == Every(60)
    assert cycle_mode(s, tasks["postgres-snapshot"]) == "snapshot"
    assert settings(mode="snapshot", daily_at="02:30").destination.trigger() == DailyAt(2, 30)


@pytest.mark.parametrize("bad, field, words", [
    ({"mode": "sometimes"}, "destination.postgres.mode", "continuous"),
    ({"table_modes": {"t": "hourly"}}, "destination.postgres.table_modes.t", "triggered"),
    ({"mode": "triggered"}, "destination.postgres", "every_seconds or daily_at"),
    ({"mode": "triggered", "every_seconds": 5, "daily_at": "01:00"}, "destination.postgres", "exactly one"),
    ({"every_seconds": 5}, "destination.postgres", "every table is continuous"),
    ({"mode": "snapshot", "daily_at": "25:00"}, "destination.postgres.daily_at", ""),
    ({"mode": "triggered", "every_seconds": 5, "snapshot_above_fraction": -0.1},
     "destination.postgres.snapshot_above_fraction", ""),
])
def test_bad_mode_settings_name_the_field(bad, field, words):
    found = problems_of({"destination": {**PG, **bad}})
    assert any(loc.endswith(field) and words in msg for loc, msg in found), found


def test_table_modes_must_name_replicated_tables():
    found = problems_of({"tables": ["a"], "exclude_tables": ["b"],
                         "destination": {**PG, "table_modes": {"b": "snapshot", "c": "snapshot"}, "every_seconds": 9}})
    assert any(loc.endswith("destination.postgres.table_modes") and "['b', 'c']" in msg for loc, msg in found), found


def test_cycled_modes_need_a_delta_source():
    found = problems_of({"source": KAFKA, "destination": {**PG, "mode": "snapshot", "every_seconds": 9}})
    assert any(loc.endswith("destination.postgres.mode") and "event source" in msg for loc, msg in found), found


def test_real_time_tasks_and_the_pool_must_fit_the_cap_with_the_arithmetic_shown():
    found = problems_of({"source": {**KAFKA, "real_time": {"tasks": 3}},
                         "destination": {**PG, "max_connections": 4, "pool_connections": 2}})
    [(loc, msg)] = [p for p in found if p[0].endswith("destination.postgres.max_connections")]
    assert "3 tasks × 1 connection + 2 (the daemon's pool) = 5 > max_connections 4" in msg
    found = problems_of({"source": {**KAFKA, "real_time": {"tasks": 4}}, "destination": {**PG, "max_connections": 4}})
    assert any("at least 5" in msg for _, msg in found), found
    ok = load_settings(None, {**BASE, "source": {**KAFKA, "real_time": {"tasks": 3}},
                              "destination": {**PG, "max_connections": 4}})
    assert ok.destination.target(executor_connections=3).pool_connections == 1
    assert settings().destination.target().pool_connections == 4


def test_validate_exits_2_with_the_budget_arithmetic(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from lakemirror.daemon.cli import main

    cfg = tmp_path / "p.yaml"
    cfg.write_text("source_catalog: s\ndestination_catalog: d\nschema_name: x\ncheckpoint_volume: /tmp/x\n"
                   "source: {kind: kafka, bootstrap_servers: '127.0.0.1:9092', topics: [t], real_time: {tasks: 6}}\n"
                   "destination: {kind: postgres, host: db, database: app, user: lm, max_connections: 4}\n")
    code = main(["validate", str(cfg)])
    printed = capsys.readouterr()
    assert code == 2, printed
    assert "destination.postgres.max_connections" in printed.err + printed.out
    assert "6 tasks × 1 connection + 1 (the daemon's pool) = 7 > max_connections 4" in printed.err + printed.out
    assert "raise max_connections to at least 7" in printed.err + printed.out
    assert "Traceback" not in printed.err + printed.out


# -- cycles on in-memory twins -------------------------------------------------------------------

COLUMNS = (Column("id", "bigint", False), Column("v", "string"))
TS = dt.datetime(2024, 1, 1)


class MemorySource:
    """A versioned source table with a change feed (the twin of sources.delta_versions.DeltaVersions)."""

    def __init__(self, rows: dict[int, str], *, cdf: bool = True, table_id: str = "t-1") -> None:
        self.versions = [dict(rows)]
        self.log: dict[int, list[tuple[int, str | None, str]]] = {0: [(k, v, "insert") for k, v in rows.items()]}
        self.cdf, self.table_id = cdf, table_id
        self.reads: list[str] = []

    def commit(self, upserts: dict[int, str] | None = None, deletes: Sequence[int] = ()) -> int:
        cur, changes = dict(self.versions[-1]), []
        for k in deletes:
            changes.append((k, cur.pop(k), "delete"))
        for k, v in (upserts or {}).items():
            if k in cur:
                changes += [(k, cur[k], "update_preimage"), (k, v, "update_postimage")]
            else:
                changes.append((k, v, "insert"))
            cur[k] = v
        self.versions.append(cur)
        self.log[len(self.versions) - 1] = changes
        return len(self.versions) - 1

    def describe(self) -> TableInfo:
        return TableInfo(TableLocation(TableName("c", "s", "t")), self.table_id, COLUMNS,
                         {CDF_PROPERTY: "true" if self.cdf else "false"}, declared_key=("id",))

    def latest_version(self) -> int:
        return len(self.versions) - 1

    def row_count(self, version: int) -> int:
        return len(self.versions[version])

    def _rows(self, after: int, through: int) -> list[tuple[int, str | None, str, int]]:
        return [(k, v, ct, ver) for ver in range(after + 1, through + 1) for k, v, ct in self.log[ver]
                if ct != "update_preimage"]

    def change_count(self, after: int, through: int) -> int:
        self.reads.append(f"count {after + 1}-{through}")
        return len(self._rows(after, through))

    def changes(self, after: int, through: int, columns: Sequence[str]) -> pa.Table:
        self.reads.append(f"changes {after + 1}-{through}")
        rows = self._rows(after, through)
        return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "v": pa.array([r[1] for r in rows]),
                         "_change_type": [r[2] for r in rows], "_commit_version": pa.array([r[3] for r in rows],
                                                                                           pa.int64()),
                         "_commit_timestamp": pa.array([TS] * len(rows), pa.timestamp("us"))})

    def snapshot(self, version: int, columns: Sequence[str]) -> pa.Table:
        self.reads.append(f"snapshot {version}")
        rows = self.versions[version]
        return pa.table({"id": pa.array(list(rows), pa.int64()), "v": pa.array(list(rows.values()), pa.string())})


class Harness:
    def __init__(self, source: MemorySource, mode: str = "triggered", snapshot_above: float = 0.10) -> None:
        self.source = source
        self.replica = MemoryReplicaSink(ReplicaTable("s", "t", ("id",), COLUMNS))
        self.states, self.cycle_states = InMemoryStateStore(), InMemoryStateStore()
        self.streamed: set[int] = set()
        self.mode, self.snapshot_above = mode, snapshot_above

    def cycle(self) -> Any:
        return PostgresCycle(self.source, lambda plan: self.replica, self.states, self.cycle_states, "slug", "c.s.t",
                             self.mode, snapshot_above=self.snapshot_above,
                             stream_ran=lambda epoch: epoch in self.streamed).run()

    def in_sync(self) -> bool:
        return {k: r["v"] for k, r in self.replica.snapshot().items()} == \
            {(k,): v for k, v in self.source.versions[-1].items()}


def hundred() -> MemorySource:
    return MemorySource({i: f"v{i}" for i in range(100)})


def test_triggered_cycles_snapshot_first_then_choose_by_the_change_fraction():
    h = Harness(hundred(), snapshot_above=0.10)
    first = h.cycle()
    assert (first.action, first.epoch, first.version, first.rows_loaded) == ("snapshot", 1, 0, 100)
    assert h.in_sync() and h.states.load("slug") == TableProgress(1, 0, True, "t-1")

    h.source.commit({1: "one", 200: "new"}, deletes=[2])               # 3 change rows of 99: 3%
    small = h.cycle()
    assert (small.action, small.epoch, small.version) == ("incremental", 1, 1)
    assert small.fraction == pytest.approx(3 / 100) and (small.rows_inserted, small.rows_updated,
                                                         small.rows_deleted) == (1, 1, 1)
    assert h.in_sync() and h.source.reads[-2:] == ["count 1-1", "changes 1-1"]

    h.source.commit({i: "changed" for i in range(10, 40)})            # 30 of 100: 30%
    big = h.cycle()
    assert (big.action, big.epoch, big.version) == ("snapshot", 1, 2) and big.fraction == pytest.approx(0.3)
    assert h.in_sync() and h.source.reads[-1] == "snapshot 2"
    assert h.replica.tombstones == {}  # a fresh copy starts fresh tombstones

    idle = h.cycle()
    assert (idle.action, idle.version) == ("nothing", 2)
    assert h.states.load("slug").bootstrap_version == 2  # a stream switched on would start after version 2


def test_a_cycle_reads_no_version_its_description_does_not_cover():
    """A commit (a column added, say) landing while the source is described: the cycle's versions end
    at a head read before the description, so the plan it applies covers every version it reads."""
    class CommittedWhileDescribed(MemorySource):
        described_through = -1

        def describe(self) -> TableInfo:
            info = super().describe()
            self.described_through = self.latest_version()
            self.commit({500 + self.described_through: "committed after the description"})
            return info

    h = Harness(CommittedWhileDescribed({i: f"v{i}" for i in range(100)}))
    for _ in range(3):
        result = h.cycle()
        assert result.version <= h.source.described_through, (result.version, h.source.described_through)
    assert {k: r["v"] for k, r in h.replica.snapshot().items()} == {
        (k,): v for k, v in h.source.versions[h.source.described_through].items()}


def test_the_crossover_is_the_configured_fraction():
    h = Harness(hundred(), snapshot_above=0.05)
    h.cycle()
    h.source.commit({i: "x" for i in range(5)})  # exactly 5%
    assert h.cycle().action == "snapshot"
    h.source.commit({i: "y" for i in range(4)})
    assert h.cycle().action == "incremental"
    assert h.in_sync()


def test_an_epoch_a_stream_ran_in_or_a_replaced_source_starts_a_new_epoch_with_a_snapshot():
    h = Harness(hundred())
    h.cycle()
    h.streamed.add(1)
    h.source.commit({1: "a"})
    again = h.cycle()
    assert (again.action, again.epoch) == ("snapshot", 2) and "stream ran in epoch 1" in again.reason
    assert h.in_sync()
    h.source.table_id = "t-2"
    h.source.commit({2: "b"})
    replaced = h.cycle()
    assert (replaced.action, replaced.epoch) == ("snapshot", 3) and "recreated" in replaced.reason
    assert h.states.load("slug").source_table_id == "t-2"


def test_an_epoch_the_stream_started_is_not_continued_by_cycles():
    h = Harness(hundred())
    h.states.save("slug", TableProgress(epoch=4, bootstrap_version=0, bootstrapped=True, source_table_id="t-1"))
    first = h.cycle()
    assert (first.action, first.epoch) == ("snapshot", 5) and "not started by a cycle" in first.reason


def test_snapshot_mode_copies_every_new_version_and_reads_no_change_feed():
    h = Harness(MemorySource({1: "a", 2: "b"}, cdf=False), mode="snapshot")
    assert h.cycle().action == "snapshot"
    h.source.commit({3: "c"}, deletes=[1])
    second = h.cycle()
    assert (second.action, second.epoch, second.version) == ("snapshot", 1, 1)
    assert h.in_sync() and not any(r.startswith(("count", "changes")) for r in h.source.reads)
    assert h.cycle().action == "nothing"


def test_a_triggered_replica_needs_the_change_feed():
    h = Harness(MemorySource({1: "a"}, cdf=False))
    with pytest.raises(LakemirrorError, match="enableChangeDataFeed") as err:
        h.cycle()
    assert err.value.code == "cdf_disabled"


def test_a_cycle_replayed_after_a_crash_before_its_state_was_saved_changes_nothing():
    h = Harness(hundred())
    h.cycle()
    h.source.commit({1: "a"})
    saved = h.states.load("slug"), h.cycle_states.load("slug")
    h.cycle()
    h.states.save("slug", saved[0])         # the state as if the process died after the commit
    h.cycle_states.save("slug", saved[1])
    again = h.cycle()
    assert again.action == "nothing" and h.in_sync()  # the progress row says version 1 is applied


def test_default_threshold_is_a_fraction():
    assert 0 < DEFAULT_SNAPSHOT_ABOVE < 1


def test_real_time_mode_refuses_to_start_on_more_partitions_than_the_budget_counted(tmp_path: Path):
    from prometheus_client import CollectorRegistry

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.metrics import Metrics
    from lakemirror.sources.kafka_offsets import StaticOffsets
    from lakemirror.sources.memory_events import MemoryEventSource
    from lakemirror.supervisor.control import table_state as sm

    cfg = tmp_path / "p.yaml"
    cfg.write_text("source_catalog: a\ndestination_catalog: b\nschema_name: s\ncheckpoint_volume: " + str(tmp_path)
                   + "\nsource: {kind: kafka, bootstrap_servers: 'k:9092', topics: [t], real_time: {tasks: 2}}\n"
                   "destination: {kind: postgres, host: h, database: d, user: u, max_connections: 4}\n")
    ctx = DaemonContext(load_settings(cfg)).replace(spark=object(), metrics=Metrics("main", CollectorRegistry()))
    runner = ctx.event_source_supervisor._factory("events:events")
    assert runner.sink.real_time.tasks == 2 and runner.sink.target.pool_connections == 2
    runner.source = MemoryEventSource("kafka", offsets=StaticOffsets({("t", 0): 5, ("t", 1): 5, ("t", 2): 5}))
    runner._launch()
    [failed] = runner.poll()
    assert isinstance(failed, sm.Failed)
    assert ("3 partitions, more than source.real_time.tasks = 2" in failed.error
            and "3 tasks × 1 connection + 2 (the daemon's pool) = 5 > max_connections 4" in failed.error
            and "raise destination.max_connections" in failed.error), failed.error


def test_the_bench_crossover_interpolates_between_the_measured_fractions():
    from bench.postgres_modes import crossover

    pts = [{"fraction": 0.01, "incremental_s": 0.1, "snapshot_s": 1.0},
           {"fraction": 0.1, "incremental_s": 0.8, "snapshot_s": 1.0},
           {"fraction": 0.2, "incremental_s": 1.4, "snapshot_s": 1.0}]
    assert crossover(pts) == pytest.approx(0.1 + 0.1 / 3, abs=1e-4)
    assert crossover(pts[:2]) is None
    assert crossover([{"fraction": 0.01, "incremental_s": 2.0, "snapshot_s": 1.0}]) == 0.01


def test_the_daemon_streams_continuous_tables_and_gives_the_others_to_their_mode_s_cycles(tmp_path: Path):
    from prometheus_client import CollectorRegistry

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.metrics import Metrics

    s = load_settings(None, {**BASE, "checkpoint_volume": str(tmp_path), "tables": ["a", "b", "c", "d"],
                             "destination": {**PG, "mode": "triggered", "every_seconds": 30,
                                             "table_modes": {"b": "snapshot", "c": "continuous"}}})
    ctx = DaemonContext(s).replace(spark=object(), metrics=Metrics("m", CollectorRegistry()))
    assert ctx.list_tables() == ["c"]
    tasks = ctx.subtasks.subtasks
    assert ctx.tables_of(tasks["postgres-triggered"])() == ["a", "d"]
    assert [j.source.table for j in jobs_for_task(ctx, tasks["postgres-snapshot"])] == ["b"]
    assert [j.settings.operations for j in jobs_for_task(ctx, tasks["postgres-triggered"])] == \
        [("postgres_triggered",), ("postgres_triggered",)]
    assert {v["task"] for v in ctx.subtasks.status()} == {"postgres-triggered", "postgres-snapshot"}


def jobs_for_task(ctx: Any, task: Any) -> list[Any]:
    from lakemirror.daemon.settings.runtime_spec import jobs_for

    return jobs_for(task, ctx.spec, ctx.tables_of(task))


def test_real_time_mode_without_tasks_counts_the_partitions_at_start_against_the_cap(tmp_path: Path):
    from prometheus_client import CollectorRegistry

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.metrics import Metrics
    from lakemirror.sources.kafka_offsets import StaticOffsets
    from lakemirror.sources.memory_events import MemoryEventSource
    from lakemirror.supervisor.control import table_state as sm

    def runner(cap: int, partitions: int) -> Any:
        cfg = tmp_path / "p.yaml"
        cfg.write_text("source_catalog: a\ndestination_catalog: b\nschema_name: s\ncheckpoint_volume: "
                       + str(tmp_path) + "\nsource: {kind: kafka, bootstrap_servers: 'k:9092', topics: [t], "
                       "real_time: {}}\ndestination: {kind: postgres, host: h, database: d, user: u, "
                       f"max_connections: {cap}}}\n")
        ctx = DaemonContext(load_settings(cfg)).replace(spark=object(), metrics=Metrics("main", CollectorRegistry()))
        r = ctx.event_source_supervisor._factory("events:events")
        r.source = MemoryEventSource("kafka", offsets=StaticOffsets({("t", p): 5 for p in range(partitions)}))
        return r

    fits = runner(4, 3)
    assert fits.sink.real_time.tasks is None and fits.sink.target.pool_connections == 1
    fits.sink.executor_writes.check_partitions(fits.source)  # 3 tasks + the daemon's 1 = 4: fits
    over = runner(4, 4)
    over._launch()
    [failed] = over.poll()
    assert isinstance(failed, sm.Failed)
    assert ("4 partitions" in failed.error and "= 5 > max_connections 4" in failed.error
            and "at least 5" in failed.error), failed.error
