"""Spark sessions of their own for batch attempts, tagged so that a timeout can interrupt them.

Each attempt of a batch operation (clone, reconcile, metadata sync, a PostgreSQL cycle) runs on a
session of its own (:func:`~lakemirror.tables.own_session`: its confs and temp views stay apart,
over Spark Connect too), carrying the attempt's tag; :meth:`TaggedSessions.cancel` interrupts the
Spark operations of that tag only. Tags are per session, so the session is kept while it runs.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from lakemirror.tables import own_session, release_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class TaggedSessions:
    """The sessions of the attempts running now, by tag."""

    def __init__(self, spark: "SparkSession") -> None:
        self.spark = spark
        self._lock = threading.Lock()
        self._sessions: dict[str, "SparkSession"] = {}

    @contextmanager
    def session(self, tag: str) -> Iterator["SparkSession"]:
        """A session of its own tagged ``tag`` for the block; untagged and released after it."""
        session = own_session(self.spark)
        with self._lock:
            self._sessions[tag] = session
        try:
            session.addTag(tag)
        except AttributeError:  # older APIs: job groups
            session.sparkContext.setJobGroup(tag, tag, interruptOnCancel=True)
        try:
            yield session
        finally:
            with self._lock:
                self._sessions.pop(tag, None)
            try:
                session.removeTag(tag)
            except AttributeError:
                pass
            release_session(session, self.spark)

    def cancel(self, tag: str) -> None:
        """Interrupt the Spark operations of the attempt tagged ``tag`` (nothing if it has ended)."""
        with self._lock:
            session = self._sessions.get(tag)
        if session is None:
            return
        try:
            session.interruptTag(tag)
        except AttributeError:  # older APIs: job groups
            session.sparkContext.cancelJobGroup(tag)
