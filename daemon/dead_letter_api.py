"""The HTTP routes of the dead letters: list them, skip them, replay them.

An event source's: ``GET /api/events/{source}/dead-letters`` lists (``status``, ``table`` and
``limit`` filter it); ``POST /api/events/{source}/dead-letters/skip`` and ``…/replay`` take
``{"ids": [...]}`` or ``{"all_pending": true, "table": …}``. The change-feed tables' of the
configured pipeline: the same under ``/api/change-feed/dead-letters`` (one dead-letter table for all
of them; ``table`` filters by the pipeline's table name or the source table). The work (reading the
dead-letter table, writing the replicas and the letters) runs on a thread of its own, between two
batches of the table it writes, never on the HTTP thread: a request waits at most
``timeout_seconds`` and is answered 504 (a list) or 202 (a skip or replay, which goes on) after that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from lakemirror.daemon.routes import Match
from lakemirror.daemon.settings import limits
from lakemirror.sinks.events.dead_letters import STATUSES

log = logging.getLogger(__name__)

Reply = tuple[int, Any]

#: At most this many letters are named in one skip or replay (a request for more: all_pending, or several).
MAX_IDS = 10_000


class LetterReportLike(Protocol):
    def as_json(self) -> dict[str, Any]: ...


class DeadLetterSource(Protocol):
    """What an event source's runner offers (:class:`~lakemirror.supervisor.events.stream_runner.EventStreamRunner`)."""

    keeps_dead_letters_in_delta: bool
    #: Where the letters are when not kept in Delta, in words ("event source <name> writes …").
    letters_elsewhere: str

    def dead_letters(self, status: str | None = None, table: str | None = None, limit: int = 500,
                     timeout: float = 30.0) -> list[dict[str, Any]]: ...

    def resolve_dead_letters(self, verb: str, ids: Sequence[str] | None, table: str | None = None,
                             timeout: float = 30.0) -> LetterReportLike: ...


@dataclass(frozen=True)
class NoFeedLetters:
    """Why the change-feed routes have no letters to serve: 404 for a pipeline of an event source,
    409 for PostgreSQL replicas (their letters are rows there)."""

    code: int
    error: str


#: The change-feed tables' desk (:class:`~lakemirror.supervisor.change_feed.dead_letters.FeedLetterDesk`), or why there is none.
FeedLetters = Callable[[], "DeadLetterSource | NoFeedLetters"]


class DeadLetterApi:
    """Answers the dead-letter routes: of the event sources ``source_of`` finds by name, and of the
    change-feed tables ``feed`` gives (their desk, or why there is none: a 404 or 409's text)."""

    def __init__(self, source_of: Callable[[str], DeadLetterSource | None], timeout_seconds: float = 30.0,
                 feed: FeedLetters | None = None) -> None:
        self.source_of = source_of
        self.timeout = timeout_seconds
        self.feed = feed

    def handle(self, m: Match, body: Any) -> Reply:
        if m.route.name.startswith("dead_letters_feed"):
            return self._feed(m, body)
        name = m.params["source"]
        if len(name) > limits.MAX_NAME_CHARS:
            return 404, {"error": f"no such event source: the name is {len(name)} characters long, and a name has "
                                  f"at most {limits.MAX_NAME_CHARS}"}
        source = self.source_of(name)
        if source is None:
            return 404, {"error": f"no event source {name!r} in this pipeline"}
        if not source.keeps_dead_letters_in_delta:
            return 409, {"error": f"event source {name!r} writes {source.letters_elsewhere}"}
        if m.route.name == "dead_letters":
            code, payload = self._list(repr(name), source, m)
            return code, ({"source": name, **payload} if code == 200 else payload)
        return self._resolve(repr(name), source, m.route.name.rsplit("_", 1)[-1], body)

    def _feed(self, m: Match, body: Any) -> Reply:
        desk = self.feed() if self.feed is not None else NoFeedLetters(404, "this endpoint serves no change-feed tables")
        if isinstance(desk, NoFeedLetters):
            return desk.code, {"error": desk.error}
        if m.route.name == "dead_letters_feed":
            return self._list("the change-feed tables", desk, m)
        return self._resolve("the change-feed tables", desk, m.route.name.rsplit("_", 1)[-1], body)

    def _list(self, what: str, source: DeadLetterSource, m: Match) -> Reply:
        status, table, limit = m.arg("status"), m.arg("table"), m.arg("limit") or "500"
        problems = []
        if status is not None and status not in STATUSES:
            problems.append({"field": "status", "message": f"one of {', '.join(STATUSES)}"})
        if not limit.isdigit() or len(limit) > 9 or int(limit) < 1:
            problems.append({"field": "limit", "message": "a positive whole number (of at most 9 digits)"})
        if table is not None and len(table) > limits.MAX_NAME_CHARS:
            problems.append({"field": "table", "message": f"a table name has at most {limits.MAX_NAME_CHARS} "
                                                          f"characters (this one has {len(table)})"})
        if problems:
            return 422, {"error": "invalid query", "problems": problems}
        try:
            letters = source.dead_letters(status, table, int(limit), self.timeout)
        except TimeoutError:
            return 504, {"error": f"the dead letters of {what} were not read within {self.timeout:.0f} s"}
        return 200, {"letters": letters}

    def _resolve(self, what: str, source: DeadLetterSource, verb: str, body: Any) -> Reply:
        if not isinstance(body, dict):
            return 422, {"error": "invalid body", "problems": [
                {"field": "(body)", "message": 'a JSON object: {"ids": [...]} or {"all_pending": true}'}]}
        ids, every, table = body.get("ids"), body.get("all_pending", False), body.get("table")
        problems = []
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids)):
            problems.append({"field": "ids", "message": "a list of dead-letter ids"})
        elif ids is not None and (len(ids) > MAX_IDS or any(len(i) > limits.MAX_NAME_CHARS for i in ids)):
            problems.append({"field": "ids", "message": f"at most {MAX_IDS} ids of at most {limits.MAX_NAME_CHARS} "
                                                        f"characters each (all_pending: true resolves every pending "
                                                        f"letter)"})
        if not isinstance(every, bool):
            problems.append({"field": "all_pending", "message": "true or false"})
        if table is not None and (not isinstance(table, str) or len(table) > limits.MAX_NAME_CHARS):
            problems.append({"field": "table", "message": f"a table name (of at most {limits.MAX_NAME_CHARS} "
                                                          f"characters)"})
        if not problems and bool(ids) == bool(every):
            problems.append({"field": "ids", "message": "give the letters' ids, or all_pending: true (not both)"})
        if problems:
            return 422, {"error": "invalid body", "problems": problems}
        try:
            report = source.resolve_dead_letters(verb, None if every else ids, table, self.timeout)
        except TimeoutError:
            return 202, {"accepted": verb, "message": f"still working after {self.timeout:.0f} s; list the dead "
                                                      f"letters of {what} to see what became of them"}
        log.info("control: %s dead letters of %s", verb, what)
        return 200, report.as_json()
