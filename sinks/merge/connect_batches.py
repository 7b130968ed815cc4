"""A table's batches under Spark Connect: applied on the server, reported from their outcome files.

Over Spark Connect the batch function runs in a Python worker on the server
(:func:`lakemirror.sinks.merge.connect_apply.apply_batch`), so it cannot hand its outcome to the
runner in this process. It writes it to a file beside the query's checkpoint instead
(:mod:`lakemirror.sinks.merge.connect_outcomes`), and :class:`ConnectBatches` reads the files of the
batches after the last one reported, at every poll of the table: a directory listing, no Spark
job. Each becomes the outcome a local batch reports, and its checkpoint row
(:class:`lakemirror.checkpoints.round_rows.RoundRows`, a round of tables' rows in one commit).

At a table's start :meth:`ConnectBatches.start_after` takes the last batch of the epoch the
checkpoint table records: the outcome files after it are batches whose rows a crash lost (the
server applied them while the daemon was down, or the daemon died before their rows were
committed), reported and recorded now, once; the files up to it are forgotten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.connect_apply import ConnectBatchJob
from lakemirror.sinks.merge.feed_letters import FeedLetter
from lakemirror.sinks.merge.connect_outcomes import BatchOutcome, forget_outcomes, outcome_folder, read_outcomes
from lakemirror.sinks.txn import BatchStats, MergeOutcome

if TYPE_CHECKING:
    from lakemirror.sinks.merge.feed_letters import FeedDeadLetters
    from lakemirror.sinks.merge.planner import MergePlan
    from lakemirror.tables import TableLocation


def batch_job(*, target: "TableLocation", plan: "MergePlan", app_id: str, checkpoint: str,
              letters: "FeedDeadLetters | None" = None, label: str = "") -> ConnectBatchJob:
    """The server-side batch function's job; its outcomes go beside the query's ``checkpoint``, the
    changes the replica refuses to ``letters`` (named as the source table ``label``)."""
    return ConnectBatchJob(target_sql=target.sql, plan=plan, app_id=app_id, outcome_dir=outcome_folder(checkpoint),
                           letters=letters, target=target, label=label)


class ConnectBatches:
    """The batches of one transaction app id, read back from their outcome files in batch order."""

    def __init__(self, job: ConnectBatchJob) -> None:
        self.job = job
        self.seen = -1  # the highest batch id reported

    def start_after(self, recorded: int | None) -> None:
        """Report only batches after ``recorded``, the last one the checkpoint table holds (their
        rows are durable: their outcome files are forgotten)."""
        self.seen = -1 if recorded is None else recorded
        if recorded is not None:
            forget_outcomes(self.job.outcome_dir, recorded)

    def new_outcomes(self) -> list[BatchOutcome]:
        """The outcomes of the batches applied since the last call (none twice)."""
        out = [o for o in read_outcomes(self.job.outcome_dir, self.seen) if o.txn_app_id == self.job.app_id]
        if out:
            self.seen = out[-1].batch_id
        return out

    def files_through(self) -> int | None:
        """The newest source version of the batches whose outcome files are still there (applied on the
        server, reported or not: read without reporting them); None when there are none. A file is
        forgotten only after its batch was reported."""
        versions = [o.last_version for o in read_outcomes(self.job.outcome_dir, -1)
                    if o.txn_app_id == self.job.app_id and o.last_version is not None]
        return max(versions, default=None)

    def forget(self, through: int) -> None:
        """The rows of the batches up to ``through`` are durable: drop their outcome files."""
        forget_outcomes(self.job.outcome_dir, through)


def outcome_letters(outcome: BatchOutcome) -> list[FeedLetter]:
    """The changes a server batch dead-lettered, as its outcome file tells them."""
    return [FeedLetter(str(x["table"]), str(x["key"]), x.get("commit_version"), str(x.get("change_type") or ""),
                       str(x.get("row") or ""), str(x.get("reason") or "")) for x in outcome.dead_letters]


def merge_outcome(outcome: BatchOutcome) -> MergeOutcome:
    """A batch's outcome as every apply path reports it."""
    stats = BatchStats(outcome.rows_read, outcome.first_version, outcome.last_version, outcome.max_commit_time,
                       outcome.min_commit_time)
    return MergeOutcome(stats, ApplyCounts(outcome.inserted, outcome.updated, outcome.deleted),
                        replayed=outcome.replayed)


#: How Spark Connect wraps an error raised by a foreachBatch function that ran on the server.
SERVER_BATCH_ERROR = "Found error inside foreachBatch Python process"


def server_batch_cause(exc: BaseException) -> BaseException:
    """The error a server-side batch function raised, from the query error that wraps it.

    The query's message starts with the wrapper and a Python traceback; its cause (e.g. Delta's
    ``DELTA_VIOLATE_CONSTRAINT_WITH_VALUES``) is the traceback's last exception line, which is what
    the table's status must show and what the error classifier must read."""
    text = str(exc)
    if SERVER_BATCH_ERROR not in text:
        return exc
    import re

    causes = [line.strip() for line in text.splitlines()
              if re.match(r"^\s*[\w.]+(Error|Exception|Exit|Interrupt)\b:", line)
              and "StreamingQueryException" not in line]
    return RuntimeError(causes[-1]) if causes else exc
