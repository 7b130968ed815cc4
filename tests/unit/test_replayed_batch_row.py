"""A batch the replica's own log holds is skipped unread at a restart, and still leaves its checkpoint
row: the crash that replays it may have come between the replica's commit and the row's append."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.checkpoints.state import TableProgress
from lakemirror.sinks.txn import TxnId
from lakemirror.supervisor.change_feed.batch_apply import BatchApply, RowWriter
from lakemirror.supervisor.change_feed.shared_state import TableLive
from lakemirror.supervisor.offline.replica_transactions import ReplicaRecord

APP = "lakemirror/p/src__s__t/e1"


def _apply(store: InMemoryCheckpointStore, recorded_txn: int, recorded_through: int | None) -> BatchApply:
    progress = TableProgress(epoch=1, bootstrap_version=9, bootstrapped=True, source_table_id="id-1")
    apply = BatchApply(TableLive("t", applied_through=recorded_through), lambda batch: "id-1",
                       RowWriter("p", "src.s.t", "dst.s.t", store, lambda: 0.0),
                       load_progress=lambda: progress, lag_seconds=lambda: None, clock=lambda: 100.0,
                       sleep=lambda s: None, fault=lambda point: None)
    apply.record = ReplicaRecord(APP, recorded_txn, recorded_through)
    return apply


def _unread() -> Any:
    pytest.fail("a batch the replica holds is not read")


def test_the_replicas_last_batch_skipped_unread_gets_its_missing_row_with_its_last_version() -> None:
    store = InMemoryCheckpointStore()
    outcome = _apply(store, recorded_txn=3, recorded_through=12).run(TxnId(APP, 3), 1, _unread, lambda: None)
    assert outcome.replayed
    [row] = store.rows
    assert (row.batch_id, row.txn_app_id, row.last_committed_version, row.error) == (3, APP, 12, None)


def test_a_row_already_there_is_not_appended_twice() -> None:
    store = InMemoryCheckpointStore()
    apply = _apply(store, recorded_txn=3, recorded_through=12)
    apply.run(TxnId(APP, 3), 1, _unread, lambda: None)
    apply.run(TxnId(APP, 3), 1, _unread, lambda: None)
    assert len(store.rows) == 1


def test_an_earlier_batch_and_an_unknown_end_leave_no_row_without_a_version() -> None:
    store = InMemoryCheckpointStore()
    _apply(store, recorded_txn=3, recorded_through=12).run(TxnId(APP, 2), 1, _unread, lambda: None)
    _apply(store, recorded_txn=3, recorded_through=None).run(TxnId(APP, 3), 1, _unread, lambda: None)
    assert store.rows == []


def test_a_record_holds_the_batches_up_to_its_last_and_knows_the_source_version_of_that_one_only() -> None:
    record = ReplicaRecord(APP, 3, 12)
    assert [record.holds(b) for b in (2, 3, 4)] == [True, True, False]
    assert [record.through_after(b) for b in (2, 3)] == [None, 12]
    assert not ReplicaRecord(APP, None, 9).holds(0)  # bootstrapped, no batch yet: every batch is read

