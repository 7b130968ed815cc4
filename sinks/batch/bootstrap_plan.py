"""A chunked bootstrap's pure side (:mod:`lakemirror.sinks.batch.chunked_bootstrap` is its
executor): its plan, when it copies its next chunk and when it turns to the change feed instead,
and the progress a person follows. Pure: time is passed in.

The plan (:class:`BootstrapPlan`) holds the chunks of the snapshot and the catch-up rounds between
them, kept by :mod:`lakemirror.checkpoints.bootstrap_state` as a JSON document so a restart never
re-plans.

The policy (:class:`BootstrapPolicy`, :func:`next_step`) is Airbyte's WASS: a copy time box, then
the log. A bootstrap copies the snapshot at a pinned version V chunk by chunk. Meanwhile the source
keeps committing, and the change feed of those commits can be vacuumed
(``delta.deletedFileRetentionDuration``) or log-cleaned (``delta.logRetentionDuration``) before a
long copy ends. So after a copying budget the table applies the change feed from the last applied
version up to the source's latest (a *catch-up*), then copies again; and whenever the change window
would close before the next chunk is expected to end, it catches up at once and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from lakemirror.sources.chunks import DEFAULT_CHUNK_BYTES, Chunk

CHUNK, CATCH_UP, DONE = "chunk", "catch_up", "done"


@dataclass(frozen=True)
class CatchUpRound:
    number: int        # the round's Delta transaction version
    after: int         # applies source versions after this one ...
    through: int       # ... up to and including this one
    done: bool = False


@dataclass(frozen=True)
class BootstrapPlan:
    epoch: int
    version: int                             # the pinned snapshot version V
    chunks: tuple[Chunk, ...]
    rounds: tuple[CatchUpRound, ...] = field(default_factory=tuple)

    @property
    def applied_through(self) -> int:
        """The last source version the replica holds: V, or the last finished round's end."""
        done = [r.through for r in self.rounds if r.done]
        return max(done) if done else self.version

    def with_round(self, r: CatchUpRound) -> "BootstrapPlan":
        return replace(self, rounds=tuple(x for x in self.rounds if x.number != r.number) + (r,))

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "version": self.version, "chunks": [c.to_json() for c in self.chunks],
                "rounds": [r.__dict__ for r in self.rounds]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "BootstrapPlan":
        return cls(int(data["epoch"]), int(data["version"]), tuple(Chunk.from_json(c) for c in data["chunks"]),
                   tuple(CatchUpRound(**r) for r in data.get("rounds", ())))


@dataclass(frozen=True)
class BootstrapPolicy:
    """How a table's bootstrap is chunked and time-boxed (``bootstrap:`` in the configuration)."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    #: Chunks written at once, over all tables of the pipeline.
    parallel_chunks: int = 2
    #: Copying time between two catch-ups; None: ``headroom_fraction`` of the change window's headroom.
    chunk_budget_seconds: float | None = None
    headroom_fraction: float = 0.25
    #: The change window must outlast the next chunk's expected time this many times over, or the
    #: table catches up first.
    safety_factor: float = 2.0
    #: Read chunks as groups of files through Delta's internal ``DeltaLog.createDataFrame`` (opt-in;
    #: only on a session with its own JVM) instead of the public key-range reads.
    internal_file_reads: bool = False

    def budget_seconds(self, headroom_seconds: float) -> float:
        if self.chunk_budget_seconds is not None:
            return self.chunk_budget_seconds
        return max(0.0, headroom_seconds * self.headroom_fraction)


@dataclass(frozen=True)
class Step:
    kind: str            # CHUNK, CATCH_UP or DONE
    reason: str
    urgent: bool = False  # the change window was about to close: worth a warning


def next_step(policy: BootstrapPolicy, *, now: float, copying_since: float, headroom_seconds: float,
              expected_chunk_seconds: float, chunks_left: int, source_ahead: bool) -> Step:
    """What the bootstrap does next.

    ``copying_since``: when copying began after the last catch-up (or the start);
    ``headroom_seconds``: time until the oldest source version not yet applied may be gone
    (:func:`lakemirror.sources.retention.headroom_seconds`); ``expected_chunk_seconds``: how long
    a chunk has taken so far (0 before the first); ``source_ahead``: the source has versions the
    replica has not applied (without them a catch-up has nothing to do)."""
    if chunks_left <= 0:
        return Step(DONE, "every chunk is copied")
    if not source_ahead:
        return Step(CHUNK, "the source has no new commits")
    if headroom_seconds < expected_chunk_seconds * policy.safety_factor:
        return Step(CATCH_UP, f"the change window closes in {headroom_seconds:.0f}s, sooner than "
                              f"{policy.safety_factor:g}x the next chunk's expected {expected_chunk_seconds:.1f}s: "
                              f"applying the change feed before it expires", urgent=True)
    budget = policy.budget_seconds(headroom_seconds)
    if now - copying_since >= budget:
        return Step(CATCH_UP, f"the copying budget of {budget:.0f}s is used: applying the change feed")
    return Step(CHUNK, f"{budget - (now - copying_since):.0f}s of copying budget left")


@dataclass(frozen=True)
class BootstrapProgress:
    """What a person follows while a table bootstraps (status, /status, metrics, logs)."""

    version: int                 # the pinned snapshot version
    chunks_total: int
    chunks_done: int
    rows_total: int | None       # None: the source's files carry no row counts
    rows_copied: int             # rows this run's chunks copied (source file statistics)
    started_at: float            # when this run of the bootstrap began (a resumed one: its restart)
    now: float
    rows_done_estimate: int = 0  # rows of every committed chunk, this run's and earlier runs'
    chunks_copied: int = 0       # chunks this run committed
    applied_through: int | None = None  # the last source version the catch-ups applied
    catch_ups: int = 0
    note: str = ""               # the latest decision worth showing (e.g. an urgent catch-up)

    @property
    def rows_per_second(self) -> float | None:
        """This run's copy rate (a resumed run does not count what an earlier run copied)."""
        elapsed = self.now - self.started_at
        return self.rows_copied / elapsed if elapsed > 0 and self.rows_copied else None

    @property
    def eta_seconds(self) -> float | None:
        """Seconds until every chunk is copied, at this run's rate (rows when known, else chunks)."""
        if self.chunks_done >= self.chunks_total:
            return 0.0
        elapsed = self.now - self.started_at
        if elapsed <= 0 or self.chunks_copied == 0:
            return None
        rate = self.rows_per_second
        if self.rows_total is not None and rate:
            return max(0.0, self.rows_total - self.rows_done_estimate) / rate
        return (self.chunks_total - self.chunks_done) * elapsed / self.chunks_copied

    def describe(self) -> str:
        rate, eta = self.rows_per_second, self.eta_seconds
        return (f"chunk {self.chunks_done}/{self.chunks_total}, {self.rows_copied} rows copied"
                + (f" of {self.rows_total}" if self.rows_total is not None else "")
                + (f", {rate:.3g} rows/s" if rate else "")
                + (f", ETA {eta:.0f}s" if eta is not None else ""))

    def as_dict(self) -> dict[str, object]:
        return {"version": self.version, "chunks_done": self.chunks_done, "chunks_total": self.chunks_total,
                "rows_copied": self.rows_copied, "rows_total": self.rows_total,
                "rows_per_second": self.rows_per_second, "eta_seconds": self.eta_seconds,
                "applied_through": self.applied_through, "catch_ups": self.catch_ups, "note": self.note}
