"""The dead letters an event source (or the change-feed tables) holds, counted by id and status for
the runner's status and metrics: :class:`LetterIndex`. Isolating poison changes and the operator's
skip and replay are the event sink's (:mod:`lakemirror.sinks.events.letter_resolution`)."""

from __future__ import annotations

from typing import Any, Sequence

from lakemirror.sinks.events.dead_letters import PENDING, VERBS, LetterReport, Resolution

__all__ = ["VERBS", "LetterIndex", "LetterReport"]


class LetterIndex:
    """Which dead letters an event source holds and their status, by id: seeded from the dead-letter
    table when the source starts (so counts carry over restarts), kept up to date by the batches and
    the operator's resolutions. Thread-safe (batches and status readers run on different threads)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._letters: dict[str, tuple[str | None, str]] = {}   # id -> (table, status)
        self.seeded = False

    def seed(self, letters: Sequence[Any]) -> None:
        """The letters a dead-letter table holds (anything with ``id``, ``table`` and ``status``: an
        event source's :class:`~lakemirror.sinks.events.dead_letters.StoredLetter`, a change-feed
        table's :class:`~lakemirror.sinks.merge.feed_letters.StoredFeedLetter`)."""
        with self._lock:
            for letter in letters:
                self._letters[letter.id] = (letter.table, letter.status)
            self.seeded = True

    def add(self, rows: Sequence[Any]) -> int:
        """Record a batch's letters (an event source's
        :class:`~lakemirror.sinks.events.dead_letters.DeadLetterRow`, a change-feed table's
        :class:`~lakemirror.sinks.merge.feed_letters.FeedLetter`); how many are new (a replayed batch's are not)."""
        new = 0
        with self._lock:
            for row in rows:
                if row.id not in self._letters:
                    new += 1
                    change = getattr(row, "change", None)
                    self._letters[row.id] = (row.table or (change.table if change is not None else None), PENDING)
        return new

    def known(self, letter_id: str) -> bool:
        """Whether the letter ``letter_id`` is counted already."""
        with self._lock:
            return letter_id in self._letters

    def resolved(self, done: Sequence[Resolution]) -> None:
        with self._lock:
            for d in done:
                table, _ = self._letters.get(d.id, (None, PENDING))
                self._letters[d.id] = (table, d.status)

    @property
    def total(self) -> int:
        with self._lock:
            return len(self._letters)

    def pending(self) -> dict[str, int]:
        """Pending letters per table ('' for a message whose table is unknown)."""
        out: dict[str, int] = {}
        with self._lock:
            for table, status in self._letters.values():
                if status == PENDING:
                    out[table or ""] = out.get(table or "", 0) + 1
        return out
