"""A chunked bootstrap's pure side (:mod:`lakemirror.sinks.batch.chunked_bootstrap` is its
executor): its durable plan, the change rows each chunk still needs, the policy, and the progress a
person follows. Pure: no Spark, time is passed in.

The plan (:class:`BootstrapPlan`) is kept by :mod:`lakemirror.checkpoints.bootstrap_state` as a JSON
document so a restart never re-plans and never forgets what a chunk was read at:

- ``version`` V: the version the bootstrap pinned; the change feed is captured from V+1;
- ``chunks``: the snapshot's chunks (None until planned: the capture runs while planning);
- ``reads``: for each chunk, the source version its rows were read at (saved before its commit)
  and the rows its commit wrote (saved after it);
- ``captures``: the rounds that copied the change feed into the bootstrap's change log, each
  saved with its version range before it writes anything;
- ``final_through`` F: the version the replica holds once the captured changes are applied.

Exactness. A key-range chunk is read at the source's latest version when it is copied (Delta never
refuses to read a table's latest version, whatever its retention), so chunk ``c`` holds the source
as of its own read version ``X_c`` for the keys of its range, and needs exactly the changes of
those keys after ``X_c``. The ranges cover the whole key domain, so every key (one inserted after
planning too) belongs to exactly one chunk. Once every chunk is copied, one MERGE applies, for each
key, the captured changes with ``X_c < version <= F`` (:func:`change_filter_sql`): the replica then
holds the source as of F, and the stream starts at F+1. A change to a key whose chunk was copied
after it costs nothing: the chunk's read already holds it. Chunks that are groups of files (Delta's
internal reads) are all read at V, so for them the rule is the classic one: the snapshot at V, then
every change after V.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from lakemirror.sources.chunks import DEFAULT_CHUNK_BYTES, Chunk
from lakemirror.sources.key_ranges import KeyRange

#: The plan document's format: 2 since chunks are read at their own versions and the change feed is
#: captured into a change log (format 1 applied catch-up rounds to the replica between chunks).
FORMAT = 2
#: The change feed's commit version column (Delta's name).
COMMIT_VERSION = "_commit_version"


class OutdatedPlan(ValueError):
    """A saved plan from a lakemirror whose catch-up rounds wrote to the replica between chunks: the
    chunks written since cannot be resumed under this plan's rules."""


@dataclass(frozen=True)
class ChunkRead:
    version: int             # the source version the chunk's rows were read at: its changes start after it
    rows: int | None = None  # rows the chunk's commit wrote; None until the commit is confirmed


@dataclass(frozen=True)
class CaptureRound:
    number: int        # the round's Delta transaction version in the change log
    after: int         # copies the change feed of the source versions after this one ...
    through: int       # ... up to and including this one
    done: bool = False


@dataclass(frozen=True)
class BootstrapPlan:
    epoch: int
    version: int                                 # V: the version pinned; captured from V+1
    chunks: tuple[Chunk, ...] | None = None      # None: not planned yet
    reads: Mapping[int, ChunkRead] = field(default_factory=dict)
    captures: tuple[CaptureRound, ...] = ()
    final_through: int | None = None

    @property
    def captured_through(self) -> int:
        """The last source version the change log holds (V before any capture)."""
        done = [r.through for r in self.captures if r.done]
        return max(done) if done else self.version

    def floor(self, number: int) -> int:
        """The version chunk ``number`` was read at (V for a chunk a plan of format 1 committed)."""
        read = self.reads.get(number)
        return self.version if read is None else read.version

    def rows_copied(self, committed: set[int]) -> int:
        """Rows the ``committed`` chunks wrote: as their commits reported, else as planned."""
        by_number = {c.number: c for c in self.chunks or ()}
        total = 0
        for n in committed:
            read = self.reads.get(n)
            if read is not None and read.rows is not None:
                total += read.rows
            elif n in by_number:
                total += by_number[n].rows or 0
        return total

    def with_chunks(self, chunks: tuple[Chunk, ...]) -> "BootstrapPlan":
        return replace(self, chunks=chunks)

    def with_read(self, number: int, read: ChunkRead) -> "BootstrapPlan":
        return replace(self, reads={**self.reads, number: read})

    def with_capture(self, r: CaptureRound) -> "BootstrapPlan":
        return replace(self, captures=tuple(x for x in self.captures if x.number != r.number) + (r,))

    def with_final(self, through: int) -> "BootstrapPlan":
        return replace(self, final_through=through)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "epoch": self.epoch, "version": self.version,
                "chunks": None if self.chunks is None else [c.to_json() for c in self.chunks],
                "reads": {str(n): {"version": r.version, "rows": r.rows} for n, r in sorted(self.reads.items())},
                "captures": [r.__dict__ for r in self.captures], "final_through": self.final_through}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "BootstrapPlan":
        """The plan of a saved document; :class:`OutdatedPlan` for a format-1 plan whose catch-up
        rounds may have written to the replica (one without rounds reads as chunks read at V)."""
        if int(data.get("format", 1)) < FORMAT and data.get("rounds"):
            raise OutdatedPlan(f"the saved bootstrap plan of epoch {data.get('epoch')} applied catch-up rounds to "
                               f"the replica between chunks (a plan of an earlier lakemirror)")
        chunks = data.get("chunks")
        final = data.get("final_through")
        return cls(int(data["epoch"]), int(data["version"]),
                   None if chunks is None else tuple(Chunk.from_json(c) for c in chunks),
                   {int(n): ChunkRead(int(r["version"]), None if r.get("rows") is None else int(r["rows"]))
                    for n, r in (data.get("reads") or {}).items()},
                   tuple(CaptureRound(**r) for r in data.get("captures", ())),
                   None if final is None else int(final))


class PlanKeeper:
    """The running bootstrap's plan, shared by its copying and capturing threads: every change is
    saved (``save``: the plan's JSON document, written atomically) before it is kept."""

    def __init__(self, plan: BootstrapPlan, save: Callable[[dict[str, Any]], None]) -> None:
        self._plan = plan
        self._save = save
        self._lock = threading.Lock()

    @property
    def plan(self) -> BootstrapPlan:
        with self._lock:
            return self._plan

    def update(self, change: Callable[[BootstrapPlan], BootstrapPlan]) -> BootstrapPlan:
        with self._lock:
            changed = change(self._plan)
            self._save(changed.to_json())
            self._plan = changed
            return changed


# -- which captured changes the replica still needs ---------------------------------------------


def _segments(plan: BootstrapPlan) -> list[tuple[KeyRange | None, int]]:
    """Consecutive chunks with one read version merged: ``(range, version)`` in key order."""
    assert plan.chunks is not None, "the plan is made before its chunks are read"
    out: list[tuple[KeyRange | None, int]] = []
    for c in plan.chunks:
        floor = plan.floor(c.number)
        if out and out[-1][1] == floor:
            last = out[-1][0]
            out[-1] = (last.spanning(c.key_range) if last is not None and c.key_range is not None else None, floor)
        else:
            out.append((c.key_range, floor))
    return out


def change_filter_sql(plan: BootstrapPlan, through: int) -> str:
    """The captured change rows the replica still needs (SQL on the change log's columns): those
    after their key's chunk was read, up to ``through``.

    One version for every chunk (one chunk, or groups of files all read at V) is one comparison;
    key-range chunks read at several versions map each key to its chunk's version."""
    segments = _segments(plan)
    version = f"`{COMMIT_VERSION}`"
    if len(segments) == 1:
        floor = str(segments[0][1])
    else:
        if any(r is None for r, _ in segments):
            raise ValueError("chunks that are not key ranges must all be read at one version")
        whens = " ".join(f"WHEN {r.predicate()} THEN {v}" for r, v in segments[:-1] if r is not None)
        floor = f"CASE {whens} ELSE {segments[-1][1]} END"
    return f"{version} <= {through} AND {version} > {floor}"


def _ranged(plan: BootstrapPlan) -> list[KeyRange] | None:
    chunks = plan.chunks or ()
    ranges = [c.key_range for c in chunks]
    if len(ranges) < 2 or any(r is None or r.predicate() is None for r in ranges):
        return None
    return [r for r in ranges if r is not None]


def chunk_of_sql(plan: BootstrapPlan) -> str | None:
    """The number of the chunk a change row's key belongs to (SQL on the change log's columns);
    None when the chunks are not key ranges (nothing to narrow a MERGE by)."""
    ranges = _ranged(plan)
    if ranges is None:
        return None
    whens = " ".join(f"WHEN {r.predicate()} THEN {n}" for n, r in enumerate(ranges[:-1]))
    return f"CASE {whens} ELSE {len(ranges) - 1} END"


def target_predicate(plan: BootstrapPlan, changed: set[int], alias: str) -> str | None:
    """A predicate on the replica (qualified by ``alias``) that holds the rows of the chunks in
    ``changed`` and as few others as key ranges can say; None when it would not narrow anything.

    Added to the MERGE's condition, it lets Delta's data skipping leave the files of every other
    chunk unread: a MERGE then reads and rewrites only the chunks its changes fall in."""
    ranges = _ranged(plan)
    if ranges is None or not changed or len(changed) == len(ranges):
        return None
    spans: list[tuple[int, int]] = []
    for n in sorted(changed):
        if spans and spans[-1][1] == n - 1:
            spans[-1] = (spans[-1][0], n)
        else:
            spans.append((n, n))
    parts = [ranges[lo].spanning(ranges[hi]).predicate(alias) for lo, hi in spans]
    return " OR ".join(f"({p})" for p in parts if p is not None) or None


# -- policy ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BootstrapPolicy:
    """How a table's bootstrap is chunked and how its change feed is kept (``bootstrap:`` in the
    configuration; :mod:`lakemirror.sinks.batch.capture_policy` decides when to capture)."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    #: Chunks written at once, over all tables of the pipeline.
    parallel_chunks: int = 2
    #: Also capture the change feed between chunks after this much copying (None: only when the
    #: change window asks for it).
    chunk_budget_seconds: float | None = None
    #: Capture once the oldest change not yet captured has used this share of the change window.
    headroom_fraction: float = 0.25
    #: The change window must outlast this many times the age a change has reached when its
    #: capture begins, or the bootstrap says that it is at risk (and what retention it needs).
    safety_factor: float = 2.0
    #: How often the capturer looks at the source's log; None: an eighth of the change window,
    #: between 0.5 s and 60 s.
    capture_poll_seconds: float | None = None
    #: Read chunks as groups of files through Delta's internal ``DeltaLog.createDataFrame`` (opt-in;
    #: only on a session with its own JVM) instead of the public key-range reads.
    internal_file_reads: bool = False


# -- progress -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BootstrapProgress:
    """What a person follows while a table bootstraps (status, /status, metrics, logs)."""

    version: int                 # the pinned version V
    chunks_total: int
    chunks_done: int             # committed chunks, this run's and earlier runs'
    rows_total: int | None       # as planned; None: the source's files carry no row counts
    rows_copied: int             # rows the committed chunks wrote, this run's and earlier runs'
    started_at: float            # when this run of the bootstrap began (a resumed one: its restart)
    now: float
    rows_copied_this_run: int = 0
    chunks_copied: int = 0       # chunks this run committed
    captured_through: int | None = None  # the last source version the change log holds
    captures: int = 0            # capture rounds done
    note: str = ""               # the latest thing worth showing (a change window at risk)

    @property
    def rows_per_second(self) -> float | None:
        """This run's copy rate (what an earlier run copied took time this run did not see)."""
        elapsed = self.now - self.started_at
        return self.rows_copied_this_run / elapsed if elapsed > 0 and self.rows_copied_this_run else None

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
            return max(0.0, self.rows_total - self.rows_copied) / rate
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
                "captured_through": self.captured_through, "captures": self.captures, "note": self.note}
