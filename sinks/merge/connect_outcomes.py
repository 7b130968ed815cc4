"""What a batch applied on a Spark Connect server tells the daemon: one small file per batch.

Over Spark Connect the batch function runs in a Python worker on the server
(:mod:`lakemirror.sinks.merge.connect_apply`), out of the daemon's process. It used to append the
batch's checkpoint row itself, a Spark write on the server (2.1 s of a 23.8 s batch on the S3
benchmark; docs/BENCHMARKS.md), which the daemon then read back with a Spark query after every
trigger of every table. Instead the batch function writes its outcome here, beside the query's
own checkpoint (the server writes that folder, and the daemon sees it at the same path: the
deployment's shared volume), in a few milliseconds and with no Spark job; the daemon reads the
files without Spark and appends the rows of a round in one commit
(:mod:`lakemirror.checkpoints.round_rows`).

Written before the batch function returns, so before Spark's commit log: a batch Spark has
committed always has its file (``fsync``, then an atomic rename, then the folder's ``fsync``). A
replayed batch writes its file again (the MERGE skipped by its transaction id, the counts those of
the commit that applied it first). The daemon forgets a file once the batch's row is durable.

Pure file I/O: no pyspark, importable in the server's Python worker.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any
from pathlib import Path

#: The folder of a query's checkpoint that holds its batches' outcomes.
OUTCOME_FOLDER = "lakemirror_outcomes"
_SUFFIX = ".json"


@dataclass(frozen=True)
class BatchOutcome:
    """One batch as the server applied it: its statistics, the MERGE's counts and when it ran."""

    batch_id: int
    txn_app_id: str
    rows_read: int
    first_version: int | None
    last_version: int | None
    inserted: int
    updated: int
    deleted: int
    replayed: bool
    started_at: float
    ended_at: float
    #: The source commit times of ``first_version`` and ``last_version`` (the checkpoint row's
    #: ``first_version_at`` and ``last_version_at``, from which recovery points are cut).
    min_commit_time: float | None = None
    max_commit_time: float | None = None
    #: The changes the replica refused, dead-lettered by the batch (each a
    #: :class:`~lakemirror.sinks.merge.feed_letters.FeedLetter`'s fields), for the daemon's counts.
    dead_letters: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BatchOutcome":
        data = json.loads(text)
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


def outcome_folder(checkpoint: str) -> str:
    """The outcome folder of the query whose checkpoint is ``checkpoint`` (a local path)."""
    return str(Path(checkpoint) / OUTCOME_FOLDER)


def write_outcome(folder: str, outcome: BatchOutcome) -> None:
    """Make ``outcome`` durable in ``folder`` (replacing an earlier attempt's)."""
    directory = Path(folder)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{outcome.batch_id}{_SUFFIX}"
    temporary = directory / f".{outcome.batch_id}{_SUFFIX}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(outcome.to_json())
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, final)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def batch_ids(folder: str) -> list[int]:
    """The batches with an outcome in ``folder``, in order (none when it does not exist)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-len(_SUFFIX)]) for n in names if n.endswith(_SUFFIX) and n[:-len(_SUFFIX)].isdigit())


def read_outcomes(folder: str, after: int) -> list[BatchOutcome]:
    """The outcomes of the batches after ``after``, in batch order."""
    out = []
    for batch_id in batch_ids(folder):
        if batch_id <= after:
            continue
        try:
            text = (Path(folder) / f"{batch_id}{_SUFFIX}").read_text(encoding="utf-8")
        except FileNotFoundError:  # forgotten meanwhile
            continue
        out.append(BatchOutcome.from_json(text))
    return out


def forget_outcomes(folder: str, through: int) -> int:
    """Delete the outcomes of the batches up to ``through`` (their rows are durable); how many."""
    removed = 0
    for batch_id in batch_ids(folder):
        if batch_id > through:
            break
        try:
            (Path(folder) / f"{batch_id}{_SUFFIX}").unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed
