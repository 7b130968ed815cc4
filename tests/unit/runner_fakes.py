"""What a table runner needs to be built without Spark: a session stand-in, a catalog that only
locates, and a :class:`~lakemirror.supervisor.change_feed.table_runner.RunnerContext` of in-memory stores.

Shared by the unit tests of the runner and its parts; the change source and the replica are the
in-memory twins (:mod:`lakemirror.sources.memory`, :mod:`lakemirror.sinks.memory`) where a test needs them.
"""

from __future__ import annotations

from typing import Any

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.checkpoints.state import InMemoryStateStore
from lakemirror.identifiers import TableName
from lakemirror.supervisor.change_feed.table_runner import RunnerContext, TableRunner
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec
from lakemirror.tables import TableLocation


class NoSpark:
    """Stands in for the Spark session of a runner whose parts touch no Spark."""

    def newSession(self) -> "NoSpark":
        return self


class PathCatalog:
    """Locates every table under ``/nowhere``; describes nothing."""

    def locate(self, name: TableName) -> TableLocation:
        return TableLocation(name, f"/nowhere/{name.slug}")


def table_runner(table: str = "t", **spec: Any) -> TableRunner:
    """A runner of ``table`` in pipeline ``p`` (``spec``: more :class:`PipelineSpec` fields; a
    ``context`` dict: more :class:`RunnerContext` fields)."""
    context = spec.pop("context", {})
    pipeline = PipelineSpec("p", "src", "dst", "s", "s", "/ck", tables=(table,), **spec)
    ctx = RunnerContext(NoSpark(), PathCatalog(), InMemoryStateStore(), InMemoryCheckpointStore(),  # type: ignore[arg-type]
                        pipeline, **context)
    return TableRunner(table, ctx)
