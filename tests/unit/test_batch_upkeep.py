"""A batch Spark planned and the driver applied runs what its replica commit left due (a checkpoint)
only after the batch counts as applied and its checkpoint row is written."""

from __future__ import annotations

from typing import Any

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.checkpoints.state import TableProgress
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import BatchStats, MergeOutcome, TxnId
from lakemirror.supervisor.change_feed.batch_apply import BatchApply, RowWriter
from lakemirror.supervisor.change_feed.shared_state import TableLive

APP = "lakemirror/p/src__s__t/e1"


class CommittingSink:
    """A batch sink whose commit leaves an upkeep that notes what the table showed when it ran."""

    def __init__(self, live: TableLive, store: InMemoryCheckpointStore) -> None:
        self.live, self.store = live, store
        self.seen: list[tuple[int | None, int, bool]] = []

    def apply(self, batch: Any, txn: TxnId, read: Any = None) -> MergeOutcome:
        def upkeep() -> None:
            self.seen.append((self.live.applied_through, len(self.store.rows), self.live.turn_proven))
        return MergeOutcome(BatchStats(5, 7, 9, 1.0, 0.5), ApplyCounts(1, 2, 0), replayed=False, upkeep=upkeep)


def test_the_upkeep_runs_after_the_batch_is_applied_recorded_and_reported() -> None:
    store = InMemoryCheckpointStore()
    live = TableLive("t", applied_through=6)
    progress = TableProgress(epoch=1, bootstrap_version=6, bootstrapped=True, source_table_id="id-1")
    apply = BatchApply(live, lambda batch: "id-1", RowWriter("p", "src.s.t", "dst.s.t", store, lambda: 0.0),
                       load_progress=lambda: progress, lag_seconds=lambda: None, clock=lambda: 100.0,
                       sleep=lambda s: None, fault=lambda point: None)
    sink = CommittingSink(live, store)
    apply(sink, TxnId(APP, 3), object(), 1)  # type: ignore[arg-type]
    assert sink.seen == [(9, 1, True)]
