"""How a PostgreSQL replica is kept, as Databricks Lakebase synced tables offer it, and the choices
that go with it. Pure: no connection, no Spark.

- ``continuous`` (the default): the table's change feed streams into the replica in micro-batches.
- ``triggered``: on a schedule, one *cycle* brings the replica up to the source's latest version,
  either incrementally (the change rows since the last cycle, through the same guarded upsert as
  a stream's batch) or by a snapshot, whichever :func:`choose_cycle` says is cheaper.
- ``snapshot``: on a schedule, a full copy of the source replaces the replica (loaded into a new
  table and swapped in with renames in one transaction: readers see the old table or the new one,
  never a half-loaded one).

:func:`choose_cycle` takes the measured change fraction (change rows since the last cycle over the
source's rows) and the crossover above which loading a fresh copy beats applying the changes in
place: :data:`DEFAULT_SNAPSHOT_ABOVE`, measured by ``make bench ONLY=postgres_modes``.

:func:`connection_budget` is the arithmetic of the connection cap: executors' tasks × connections
per task + the daemon's own pool must fit ``max_connections``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Mode = Literal["continuous", "triggered", "snapshot"]
MODES: tuple[Mode, ...] = ("continuous", "triggered", "snapshot")
CycleAction = Literal["nothing", "incremental", "snapshot"]

#: The change fraction at which a triggered cycle loads a snapshot instead of applying the changes:
#: the crossover ``make bench ONLY=postgres_modes`` finds between the two on the PostgreSQL side
#: (docs/BENCHMARKS.md, "Snapshot or incremental into PostgreSQL, by change fraction"). A snapshot
#: costs about the same whatever changed, the guarded upsert grows with the changes, so only a large
#: fraction makes the reload cheaper. Databricks advises about 10% for Lakebase; our Postgres side
#: crosses much later. The Spark side of a cycle (reading the changes, or the whole table) is not in
#: that comparison.
DEFAULT_SNAPSHOT_ABOVE = 0.64


def change_fraction(changed_rows: int, table_rows: int) -> float:
    """Change rows since the last cycle over the source's rows now (inf for changes to an empty table)."""
    if changed_rows < 0 or table_rows < 0:
        raise ValueError("row counts cannot be negative")
    if table_rows == 0:
        return 0.0 if changed_rows == 0 else math.inf
    return changed_rows / table_rows


@dataclass(frozen=True)
class CycleChoice:
    """What one cycle does, and why (shown in the cycle's audit row and log line)."""

    action: CycleAction
    reason: str
    fraction: float | None = None


def choose_cycle(mode: Mode, *, head: int, reached: int | None, fraction: float | None = None,
                 snapshot_above: float = DEFAULT_SNAPSHOT_ABOVE, fresh_epoch_reason: str | None = None) -> CycleChoice:
    """The action of one cycle of a ``triggered`` or ``snapshot`` replica.

    ``head``: the source's latest version; ``reached``: the version the replica holds in the
    cycles' epoch (None: none yet); ``fresh_epoch_reason``: why the replica must start a new epoch
    (its first cycle, a source replaced, a stream that wrote it meanwhile), which always loads a
    snapshot; ``fraction``: the change fraction of the versions after ``reached`` (triggered only;
    needed when there is something to apply). At exactly ``snapshot_above`` the snapshot is taken.
    """
    if mode == "continuous":
        raise ValueError("a continuous replica streams; it has no cycles")
    if fresh_epoch_reason is not None or reached is None:
        return CycleChoice("snapshot", fresh_epoch_reason or "the replica holds no version of its own yet")
    if head <= reached:
        return CycleChoice("nothing", f"the replica holds source version {reached}, the latest")
    if mode == "snapshot":
        return CycleChoice("snapshot", f"snapshot mode: source version {head} replaces {reached}")
    if fraction is None:
        raise ValueError("a triggered cycle with changes to apply needs the measured change fraction")
    if not 0 <= snapshot_above:
        raise ValueError("snapshot_above cannot be negative")
    pct = "all" if math.isinf(fraction) else f"{fraction:.1%}"
    if fraction >= snapshot_above:
        return CycleChoice("snapshot", f"{pct} of the rows changed in versions {reached + 1}-{head}, at or above "
                                       f"{snapshot_above:.1%}: a fresh copy is cheaper", fraction)
    return CycleChoice("incremental", f"{pct} of the rows changed in versions {reached + 1}-{head}, below "
                                      f"{snapshot_above:.1%}: the changes are applied", fraction)


def cycle_batch_id(version: int) -> int:
    """The progress-row batch id of a cycle that brings the replica to source ``version``.

    Negative and below the bootstrap's -1, so it never equals a streaming batch id (0, 1, …) of the
    same epoch: a cycle's progress row can never make a stream's batch look replayed, nor the other
    way round; two cycles reach different versions, so their ids differ too."""
    if version < 0:
        raise ValueError("a source version is not negative")
    return -2 - version


@dataclass(frozen=True)
class ConnectionBudget:
    """Connections lakemirror may hold on the server at once, and what wants them."""

    cap: int                   # destination.max_connections
    tasks: int                 # executor tasks writing to Postgres at once (Real-Time Mode: Kafka partitions)
    per_task: int              # connections each task holds
    pool: int                  # the daemon's own connections (driver: batches, cycles, bootstraps)

    @property
    def needed(self) -> int:
        return self.tasks * self.per_task + self.pool

    @property
    def fits(self) -> bool:
        return self.pool >= 1 and self.needed <= self.cap

    def arithmetic(self) -> str:
        """E.g. ``3 tasks × 1 connection + 2 (the daemon's pool) = 5 > max_connections 4``."""
        sign = "<=" if self.needed <= self.cap else ">"
        return (f"{self.tasks} task{'s' if self.tasks != 1 else ''} × {self.per_task} connection"
                f"{'s' if self.per_task != 1 else ''} + {self.pool} (the daemon's pool) = {self.needed} "
                f"{sign} max_connections {self.cap}")


def connection_budget(cap: int, *, tasks: int = 0, per_task: int = 1, pool: int | None = None) -> ConnectionBudget:
    """The budget; ``pool`` None: what the tasks leave of the cap, at least one connection."""
    if cap < 1 or tasks < 0 or per_task < 0:
        raise ValueError("cap must be at least 1, tasks and per_task not negative")
    if pool is None:
        pool = max(1, cap - tasks * per_task)
    return ConnectionBudget(cap, tasks, per_task, pool)
