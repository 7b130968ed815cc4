"""Which kind of replica a pipeline writes, and why: the one place the sink is chosen. Pure.

A Delta replica takes each micro-batch as a Spark DataFrame (MERGE, rewrite or the driver's
delta-rs MERGE: :mod:`lakemirror.sinks.merge.apply_choice` chooses among those). A Postgres replica
takes each micro-batch's winning changes on the driver, by COPY and one guarded upsert
(:mod:`lakemirror.sinks.postgres`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lakemirror.sinks.postgres.executor import PostgresTarget

DELTA, POSTGRES = "delta", "postgres"


@dataclass(frozen=True)
class SinkChoice:
    kind: str
    reason: str
    postgres: PostgresTarget | None = None

    @property
    def is_postgres(self) -> bool:
        return self.kind == POSTGRES


def choose_sink(kind: str, postgres: PostgresTarget | None = None) -> SinkChoice:
    """The replica target for a pipeline whose ``destination.kind`` is ``kind``."""
    if kind == DELTA:
        return SinkChoice(DELTA, "destination kind delta: Delta replicas, one MERGE (or rewrite) per micro-batch")
    if kind == POSTGRES:
        if postgres is None:
            raise ValueError("destination kind postgres needs its connection settings")
        return SinkChoice(POSTGRES, f"destination kind postgres: {postgres.describe()}, COPY and a guarded "
                                    f"upsert per micro-batch", postgres)
    raise ValueError(f"unknown destination kind {kind!r} (known: {DELTA}, {POSTGRES})")
