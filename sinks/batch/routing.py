"""Operations routed by name: the batch runner sees one :class:`~lakemirror.sinks.batch.operations.Operations`
whichever part implements each operation."""

from __future__ import annotations

from typing import Any, Mapping

from lakemirror.sinks.batch.operations import BatchJob, Operations


class ByOperation:
    """``routes[operation]`` runs that operation; ``base`` runs every other one. A cancel reaches all
    of them (a tag names one attempt, so only the one running it acts)."""

    def __init__(self, base: Operations, routes: Mapping[str, Operations]) -> None:
        self.base = base
        self.routes = dict(routes)

    def run(self, operation: str, job: BatchJob, tag: str) -> Mapping[str, Any]:
        return self.routes.get(operation, self.base).run(operation, job, tag)

    def cancel(self, tag: str) -> None:
        self.base.cancel(tag)
        for ops in self.routes.values():
            ops.cancel(tag)
