"""A lag probe prices one applied version throughout, even while batches advance it.

The stream's thread moves ``applied_through`` forward whenever a batch lands; a probe that read
it once to fetch commit times and again to price them reported a 0 s change window (the newer
version's commit time was never fetched) and a lag measured from the wrong commit.
"""

from __future__ import annotations

from typing import Any

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.checkpoints.state import InMemoryStateStore
from lakemirror.identifiers import TableName
from lakemirror.sinks.planner import plan_merge
from lakemirror.sources.change_feed import SourceHead
from lakemirror.sources.keys import choose_key
from lakemirror.schema import Column
from lakemirror.supervisor import runner as runner_module
from lakemirror.supervisor.retention import RetentionWindow
from lakemirror.supervisor.runner import Prepared, RunnerContext, TableRunner
from lakemirror.supervisor.spec import PipelineSpec
from lakemirror.tables import TableLocation


class _Spark:
    def newSession(self) -> "_Spark":
        return self


class _Catalog:
    def locate(self, name: TableName) -> TableLocation:
        return TableLocation(name, f"/nowhere/{name.slug}")


def test_a_batch_landing_during_a_probe_does_not_mix_versions(monkeypatch: Any) -> None:
    spec = PipelineSpec("p", "src", "dst", "s", "s", "/ck", tables=("t",))
    ctx = RunnerContext(_Spark(), _Catalog(), InMemoryStateStore(), InMemoryCheckpointStore(), spec)  # type: ignore[arg-type]
    runner = TableRunner("t", ctx)
    cols = (Column("id", "bigint", False),)
    runner.prepared = Prepared(choose_key("src.s.t", cols, configured=("id",)), plan_merge(cols, ["id"]),
                               ctx.states.load(runner.slug), RetentionWindow())
    runner.applied_through = 4
    now = 1_000_000.0
    commit_time = {v: now - 100 + v for v in range(0, 11)}

    def source_head(_spark: Any, _loc: Any, since: int, window: int = 32) -> SourceHead:
        runner.applied_through = 8  # a batch lands on the stream's thread meanwhile
        wanted = {since + 1, *range(max(0, 10 - window + 1), 11)}
        return SourceHead(10, {v: commit_time[v] for v in wanted})

    monkeypatch.setattr(runner_module.change_feed, "source_head", source_head)
    reading = runner.probe_lag(now)
    assert reading is not None
    assert reading.applied_through_version == 4 and reading.versions_behind == 6
    assert reading.lag_seconds == now - commit_time[5]
    assert reading.retention_headroom_seconds == commit_time[5] + RetentionWindow().seconds - now
