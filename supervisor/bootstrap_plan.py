"""A chunked bootstrap's plan: the chunks of the snapshot and the catch-up rounds between them,
kept by :mod:`lakemirror.checkpoints.bootstrap_state` as a JSON document so a restart never re-plans."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from lakemirror.sources.chunks import Chunk


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
