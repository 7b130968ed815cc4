"""What every destination is built from: the composition root's parts it may use, each made on first use.

A destination's package types what it is handed by this protocol (adding what it reads of the
pipeline's spec), so that it depends on nothing above ``sinks``; the composition root
(:class:`lakemirror.daemon.context.DaemonContext`) provides it, with more parts beside
(:class:`lakemirror.daemon.destinations.Parts`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from lakemirror.checkpoints.state import StateStore
from lakemirror.sources.catalog import Catalog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class DestinationParts(Protocol):
    """The parts every destination may use."""

    @property
    def spark(self) -> "SparkSession":
        """The driver's Spark session (started on first use)."""
        ...
    @property
    def catalog(self) -> Catalog:
        """Where tables are found and created."""
        ...
    @property
    def states(self) -> StateStore:
        """The tables' progress (epochs, bootstrap versions)."""
        ...
    @property
    def pipeline_dir(self) -> Path:
        """The pipeline's folder under the checkpoint volume."""
        ...
    @property
    def fault(self) -> Callable[[str], None]:
        """The crash-test hook: a no-op unless the torture harness arms it."""
        ...
    @property
    def clock(self) -> Callable[[], float]:
        """The time, in seconds since the epoch."""
        ...
