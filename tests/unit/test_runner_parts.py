"""The table runner's preparation, bootstrap and batch apply, on the in-memory change source and
replica twins (no Spark): the order of durable steps, the refusals, exactly-once batches."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.errors import (
    ChangeFeedDisabled, DestinationConflict, SchemaChangeRestart, SchemaIncompatible, SourceReplaced,
)
from lakemirror.schema import Column
from lakemirror.sinks.merge.delta_replica import evolution
from lakemirror.sinks.memory import MemoryTableReplica
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sinks.txn import TxnId, txn_app_id
from lakemirror.sources.catalog import CDF_PROPERTY
from lakemirror.sources.change_event import DELETE, STREAM, UPSERT, Position
from lakemirror.sources.contract import change_from_cdf_row
from lakemirror.sources.memory import MemoryChangeSource
from lakemirror.supervisor.change_feed.batch_apply import Drained
from lakemirror.supervisor.change_feed.table_runner import BatchReport, TableRunner
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.pipeline_spec import TableOptions
from tests.unit.runner_fakes import table_runner

COLUMNS = (Column("id", "bigint", False), Column("v", "string"))


class Crash(Exception):
    """The process dying at a fault point."""


def ins(i: int, v: str) -> dict[str, Any]:
    return {"_change_type": "insert", "id": i, "v": v}


def upd(i: int, v: str) -> list[dict[str, Any]]:
    return [{"_change_type": "update_preimage", "id": i, "v": "?"}, {"_change_type": "update_postimage", "id": i, "v": v}]


def dele(i: int) -> dict[str, Any]:
    return {"_change_type": "delete", "id": i, "v": None}


def _runner(source: MemoryChangeSource | None = None, replica: MemoryTableReplica | None = None,
            fault: Any = None, allow_schema_evolution: bool = False, **spec: Any) -> TableRunner:
    runner = table_runner(allow_schema_evolution=allow_schema_evolution, **spec,
                          context={"clock": lambda: 1000.0, "sleep": lambda s: None,
                                   "fault": fault or (lambda point: None)})
    runner.change_source = source or MemoryChangeSource(runner.ctx.catalog.locate(runner.source), COLUMNS, ("id",))  # type: ignore[assignment]
    runner.replica = replica or MemoryTableReplica("p")
    return runner


def _source(runner: TableRunner) -> MemoryChangeSource:
    return runner.change_source  # type: ignore[return-value]


def _replica(runner: TableRunner) -> MemoryTableReplica:
    return runner.replica  # type: ignore[return-value]


def test_bootstrap_pins_the_head_saves_the_epoch_first_and_marks_it_done_last() -> None:
    seen: dict[str, Any] = {}
    runner = _runner(fault=lambda point: seen.setdefault(point, (runner.ctx.states.load(runner.slug),
                                                                 list(_replica(runner).bootstraps))))
    _source(runner).commit([ins(1, "a"), ins(2, "b")])
    _source(runner).commit([*upd(1, "A"), dele(2)])
    prepared = runner.prepare()
    before, written = seen["bootstrap_before_snapshot"]
    assert (before.epoch, before.bootstrap_version, before.bootstrapped, written) == (1, 2, False, [])
    after, written = seen["bootstrap_after_snapshot"]
    assert (after.bootstrapped, written) == (False, [(2, 1)]), "the state says bootstrapped only after the write"
    assert prepared.progress.bootstrapped and prepared.progress.source_table_id == "table-1"
    replica = _replica(runner).replica
    assert replica is not None and replica.rows == {(1,): {"id": 1, "v": "A"}}
    assert prepared.key.columns == ("id",)
    assert runner.live.take_events() == [sm.BootstrapStarted()]


def test_a_bootstrap_killed_before_its_snapshot_is_redone_at_the_same_version() -> None:
    def crash(point: str) -> None:
        if point == "bootstrap_before_snapshot":
            raise Crash(point)

    runner = _runner(fault=crash)
    _source(runner).commit([ins(1, "a")])
    with pytest.raises(Crash):
        runner.prepare()
    _source(runner).commit([ins(2, "b")])  # the source moves on while the daemon is down
    restarted = _runner(_source(runner), _replica(runner))
    restarted.ctx.states.save(restarted.slug, runner.ctx.states.load(runner.slug))
    prepared = restarted.prepare()
    assert (prepared.progress.epoch, prepared.progress.bootstrap_version) == (1, 1)
    assert _replica(restarted).bootstraps == [(1, 1)]
    replica = _replica(restarted).replica
    assert replica is not None and set(replica.rows) == {(1,)}, "version 2 comes by the stream, not the snapshot"


def _add_note_column_at(point: str, source: list[MemoryChangeSource]) -> Any:
    """A fault hook that adds a column ``note`` to the source at ``point`` (once) and fills it."""
    def alter(at: str) -> None:
        if at == point and not any(c.name == "note" for c in source[0].columns):
            source[0].columns = (*COLUMNS, Column("note", "string"))
            source[0].commit([{"_change_type": "insert", "id": 3, "v": "c", "note": "copied after the pin"}])
    return alter


def test_a_column_added_before_the_copy_ends_is_copied_with_its_values() -> None:
    """The launch plans from its description of the source; a column added before the copy's reads
    end would reach the replica without the values the copy read. The epoch is pinned anew and the
    table relaunched, which plans and copies the column."""
    holder: list[MemoryChangeSource] = []
    runner = _runner(fault=_add_note_column_at("bootstrap_before_snapshot", holder))
    holder.append(_source(runner))
    _source(runner).commit([ins(1, "a")])
    with pytest.raises(SchemaChangeRestart, match=r"t: the source's columns changed while its snapshot was copied "
                                                   r"\(added note\)"):
        runner.prepare()
    refused = runner.ctx.states.load(runner.slug)
    assert (refused.epoch, refused.bootstrap_version, refused.bootstrapped) == (1, None, False), "pinned anew"
    _source(runner).commit([{"_change_type": "update_postimage", "id": 1, "v": "a", "note": "filled"}])
    prepared = runner.prepare()  # the relaunch
    assert (prepared.progress.epoch, prepared.progress.bootstrap_version, prepared.progress.bootstrapped) == (2, 3, True)
    replica = _replica(runner).replica
    assert replica is not None and replica.rows == {
        (1,): {"id": 1, "v": "a", "note": "filled"}, (3,): {"id": 3, "v": "c", "note": "copied after the pin"}}


def test_a_column_the_selection_leaves_out_does_not_restart_the_copy() -> None:
    holder: list[MemoryChangeSource] = []
    runner = _runner(fault=_add_note_column_at("bootstrap_before_snapshot", holder),
                     options={"t": TableOptions(include_columns=("id", "v"))})
    holder.append(_source(runner))
    _source(runner).commit([ins(1, "a")])
    prepared = runner.prepare()
    assert (prepared.progress.epoch, prepared.progress.bootstrapped) == (1, True)
    replica = _replica(runner).replica
    assert replica is not None and replica.rows == {(1,): {"id": 1, "v": "a"}}, "version 2 comes by the stream"


def test_a_source_without_change_feed_or_recreated_is_refused() -> None:
    runner = _runner()
    _source(runner).properties[CDF_PROPERTY] = "false"
    with pytest.raises(ChangeFeedDisabled, match="Change Data Feed is not enabled") as refused:
        runner.prepare()
    assert "SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')" in str(refused.value)
    assert "enable_change_data_feed: true" in str(refused.value)
    event = runner._failed(refused.value)  # noqa: SLF001
    assert event.fatal and event.code == "cdf_disabled", "a configuration error: failed at once, never retried"
    assert _source(runner).properties[CDF_PROPERTY] == "false", "not turned on without the opt-in"
    _source(runner).properties[CDF_PROPERTY] = "true"
    runner.prepare()
    _source(runner).table_id = "table-2"
    with pytest.raises(SourceReplaced, match="dropped and recreated"):
        runner.prepare()


def test_a_replica_of_another_pipeline_is_never_overwritten() -> None:
    runner = _runner(replica=MemoryTableReplica("p", owner="other"))
    with pytest.raises(DestinationConflict):
        runner.prepare()
    assert _replica(runner).bootstraps == []


def test_new_source_columns_are_added_only_when_allowed() -> None:
    points: list[str] = []
    for allow in (False, True):
        runner = _runner(fault=points.append, allow_schema_evolution=allow)
        runner.prepare()
        _source(runner).columns = (*COLUMNS, Column("w", "int"))
        if not allow:
            with pytest.raises(SchemaIncompatible):
                runner.prepare()
            continue
        runner.prepare()
        assert _replica(runner).columns == ("id", "v", "w") and points.count("schema_change") == 1


def test_batches_apply_once_record_once_and_report() -> None:
    runner = _runner()
    prepared = runner.prepare()
    source, epoch = _source(runner), prepared.progress.epoch
    source.commit([ins(1, "a"), ins(2, "b")])
    source.commit([*upd(1, "A"), dele(2), ins(3, "c")])
    sink = runner.replica.batch_sink(prepared.plan, epoch)
    txn = TxnId(txn_app_id("p", runner.slug, epoch), 0)
    batch = source.changes(prepared.progress.bootstrap_version or 0)
    runner.live.take_events()
    runner._apply_batch(sink, txn, batch, epoch, prepared.progress.source_table_id)  # noqa: SLF001
    runner._apply_batch(sink, txn, batch, epoch, prepared.progress.source_table_id)  # noqa: SLF001 (a replay)
    replica = _replica(runner).replica
    assert replica is not None
    assert sorted(replica.rows.values(), key=lambda r: r["id"]) == source.snapshot(2)
    rows = runner.ctx.checkpoints.rows  # type: ignore[attr-defined]
    assert [(r.batch_id, r.rows_inserted, r.rows_deleted, r.last_version) for r in rows] == [(0, 2, 0, 2)]
    reports = [e for e in runner.live.take_events() if isinstance(e, BatchReport)]
    assert [r.outcome.replayed for r in reports] == [False, True]
    assert runner.applied_through == 2 and runner.last_batch_at == 1000.0


def test_a_batch_from_a_recreated_source_is_refused_and_recorded() -> None:
    runner = _runner()
    prepared = runner.prepare()
    _source(runner).commit([ins(1, "a")])
    _source(runner).table_id = "table-2"
    sink = runner.replica.batch_sink(prepared.plan, 1)
    with pytest.raises(SourceReplaced):
        runner._apply_batch(sink, TxnId("app", 0), _source(runner).changes(0), 1, "table-1")  # noqa: SLF001
    replica = _replica(runner).replica
    assert replica is not None and replica.rows == {}
    rows = runner.ctx.checkpoints.rows  # type: ignore[attr-defined]
    assert [(r.degraded, r.batch_id) for r in rows] == [(True, 0)] and "recreated" in (rows[0].error or "")
    runner.live.draining = True
    with pytest.raises(Drained):
        runner._apply_batch(sink, TxnId("app", 1), [], 1, "table-2")  # noqa: SLF001


def test_a_delta_change_feed_row_maps_to_the_change_contract() -> None:
    assert change_from_cdf_row("t", {"_change_type": "update_preimage", "_commit_version": 3, "id": 1}, ["id"]) is None
    upsert = change_from_cdf_row("t", {"_change_type": "update_postimage", "_commit_version": 3, "id": 1, "v": "x"},
                                 ["id"])
    delete = change_from_cdf_row("t", {"_change_type": "delete", "_commit_version": 3, "id": 1, "v": "x"}, ["id"])
    assert upsert is not None and delete is not None
    assert (upsert.op, upsert.keys, upsert.position, dict(upsert.columns)) == (UPSERT, (("id", 1),),
                                                                               Position(STREAM, 3), {"id": 1, "v": "x"})
    assert (delete.op, dict(delete.columns)) == (DELETE, {})
    assert delete.order() < upsert.order(), "inside one commit a delete is ordered before an upsert"
    with pytest.raises(ValueError, match="unknown change type"):
        change_from_cdf_row("t", {"_change_type": "merge", "_commit_version": 3, "id": 1}, ["id"])


def test_schema_evolution_is_planned_without_spark() -> None:
    plan = plan_merge((*COLUMNS, Column("w", "int")), ["id"])
    assert [c.name for c in evolution("t", plan, COLUMNS, allow=True)] == ["w"]
    assert evolution("t", plan_merge(COLUMNS, ["id"]), COLUMNS, allow=False) == ()
    with pytest.raises(SchemaIncompatible, match="allow_schema_evolution"):
        evolution("t", plan, COLUMNS, allow=False)
    with pytest.raises(SchemaIncompatible, match="cannot follow"):
        evolution("t", plan_merge((Column("id", "bigint", False), Column("v", "int")), ["id"]), COLUMNS, allow=True)


def test_a_replayed_batch_is_logged_as_the_path_that_found_it_written(caplog: pytest.LogCaptureFixture) -> None:
    """A PostgreSQL replica's replay is found by its progress row: the log must not say Delta."""
    from lakemirror.sinks.memory import ApplyCounts
    from lakemirror.sinks.postgres.spark_batches import REPLAY_NOTE, WRITE_POSTGRES
    from lakemirror.sinks.txn import BatchStats, MergeOutcome

    class ReplayedSink:
        def __init__(self, write: str, note: str | None = None) -> None:
            self.write, self.note = write, note

        def apply(self, batch: Any, txn: TxnId, read: Any = None) -> MergeOutcome:
            return MergeOutcome(BatchStats(3, 4, 4, None), ApplyCounts(1, 0, 0), replayed=True, write=self.write,
                                replay_note=self.note)

    runner = _runner()
    caplog.set_level("INFO", logger="lakemirror.supervisor.change_feed.batch_apply")
    runner._apply_batch(ReplayedSink(WRITE_POSTGRES, REPLAY_NOTE), TxnId("app", 5), [], 1)  # noqa: SLF001
    runner._apply_batch(ReplayedSink("spark-merge"), TxnId("app", 6), [], 1)  # noqa: SLF001
    pg, delta = [r.getMessage() for r in caplog.records if "already committed" in r.getMessage()]
    assert "progress row in PostgreSQL" in pg and "Delta" not in pg
    assert "Delta skipped the write" in delta


def test_enable_change_data_feed_turns_the_feed_on_before_the_bootstrap_pins_its_version() -> None:
    runner = table_runner(enable_change_data_feed=True, context={"clock": lambda: 1000.0, "sleep": lambda s: None})
    source = MemoryChangeSource(runner.ctx.catalog.locate(runner.source), COLUMNS, ("id",),
                                properties={CDF_PROPERTY: "false"})
    runner.change_source = source  # type: ignore[assignment]
    runner.replica = MemoryTableReplica("p")
    source.commit([ins(1, "a")])
    prepared = runner.prepare()
    assert source.properties[CDF_PROPERTY] == "true"
    assert prepared.progress.bootstrap_version == 2, "the snapshot is taken at the feed's first version, or after"
    source.commit([*upd(1, "b")])
    assert [r["v"] for r in source.changes(2) if r["_change_type"] != "update_preimage"] == ["b"]
    assert runner.prepare().progress.bootstrap_version == 2, "once on, nothing more is changed"
