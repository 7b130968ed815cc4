"""Batches a Spark Connect server applied, reported by the daemon: the runner's side of a round.

At each poll of a table the runner hands its :class:`~lakemirror.sinks.merge.connect_batches.ConnectBatches`
here: every batch whose outcome file appeared since the last poll is reported as applied (the
table's applied version and lag move at once), and its checkpoint row goes to the round writer
(:class:`~lakemirror.checkpoints.round_rows.RoundRows`), which appends the rows of every table
that reported in the same moment in one commit and then lets the batch's outcome file go.

Exactness across a crash inside a round: a batch's outcome file exists from before Spark commits
the batch until after its row is durable. The daemon killed before the row's commit
(``connect_before_rows``) leaves the file, and the next start records its row (the checkpoint
table's last batch of the epoch is older); killed after it (``connect_after_rows``), the next start
finds the batch recorded and forgets the file without a second row. A batch whose MERGE the server
committed without writing its file is not committed by Spark either: Spark runs it again, the
MERGE is skipped by its transaction id, and the file is written then.

A batch the replica refused because of some rows' values was applied without them on the server,
which dead-lettered them; its file names them, and they are counted as the local path's letters are
(a file reported again after a crash names the same letters, counted once by their ids).
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Sequence

from lakemirror.checkpoints.round_rows import RoundRows
from lakemirror.sinks.merge.connect_batches import ConnectBatches, merge_outcome, outcome_letters
from lakemirror.sinks.merge.feed_letters import FeedLetter
from lakemirror.sinks.txn import TxnId
from lakemirror.supervisor.change_feed.batch_apply import RowWriter
from lakemirror.supervisor.change_feed.shared_state import TableLive

log = logging.getLogger(__name__)


def report_server_batches(batches: ConnectBatches, rows: RoundRows, writer: RowWriter, live: TableLive, epoch: int,
                          lag_seconds: float | None,
                          on_letters: Callable[[Sequence[FeedLetter]], None] = lambda found: None) -> int:
    """Report the batches applied on the server since the last call and queue their rows; how many.
    ``on_letters`` is told of the changes a batch dead-lettered (the pipeline's counts of pending letters)."""
    reported = 0
    for done in batches.new_outcomes():
        outcome = merge_outcome(done)
        letters = outcome_letters(done)
        if letters:
            log.warning("table %s: batch %d: %d change(s) refused by the replica were dead-lettered on the server "
                        "(%s); the rest of the batch applied. `lakemirror dead-letters` lists them", writer.source,
                        done.batch_id, len(letters), ", ".join(x.key for x in letters[:5]))
            on_letters(letters)
        row = writer.batch_row(TxnId(done.txn_app_id, done.batch_id), epoch, outcome, done.started_at, lag_seconds,
                               ended=done.ended_at)
        # Reported before its file can go (the row's commit forgets it): a replay reads the files first.
        live.batch_done(done.batch_id, outcome, done.started_at, done.ended_at)
        rows.submit(row, functools.partial(batches.forget, done.batch_id))
        reported += 1
    return reported
