"""A drain halts every table at once (supervisor/control/halts.py): one table whose query cannot be stopped
holds up no other, and the drain names exactly the tables it abandoned. Real table runners and
supervisor; the queries are stand-ins."""

from __future__ import annotations

import threading

from lakemirror.supervisor.change_feed.table_runner import TableRunner
from lakemirror.supervisor.control.halts import halt_all
from lakemirror.supervisor.control.loop import Supervisor
from tests.unit.runner_fakes import table_runner


class _MeetingQuery:
    """A query whose stop() returns only once the other table's query is being stopped too."""

    def __init__(self, meeting: threading.Barrier) -> None:
        self.meeting = meeting
        self.stopped = False

    def stop(self) -> None:
        self.meeting.wait(timeout=30)
        self.stopped = True


class _GoneQuery:
    def stop(self) -> None:
        threading.Event().wait()


def _with_query(table: str, query: object) -> TableRunner:
    runner = table_runner(table)
    runner._query = query  # type: ignore[assignment]  # noqa: SLF001
    return runner


def test_every_table_halts_at_once() -> None:
    """Each stop() returns only when the other's has begun: halts one after the other would leave
    the first waiting until its deadline and name both tables; at once, both finish."""
    meeting = threading.Barrier(2)
    queries = {"a": _MeetingQuery(meeting), "b": _MeetingQuery(meeting)}
    runners = {name: _with_query(name, query) for name, query in queries.items()}
    assert halt_all(runners, 5.0) == []
    assert all(q.stopped for q in queries.values())
    meeting.reset()
    sup = Supervisor(runner_factory=lambda t: _with_query(t, queries[t]), list_tables=lambda: ["a", "b"])
    sup.start()
    assert sup.shutdown(5.0) == [], "the supervisor's drain halts its tables one after the other"


def test_only_the_tables_left_unfinished_are_named_with_what_they_waited_for() -> None:
    fine = _MeetingQuery(threading.Barrier(1))
    runners = {"a": _with_query("a", _GoneQuery()), "b": _with_query("b", fine)}
    assert halt_all(runners, 0.3) == ["a (stopping its query)"]
    assert fine.stopped


def test_the_supervisors_shutdown_returns_the_tables_it_abandoned() -> None:
    gone = {"a": _GoneQuery(), "b": _MeetingQuery(threading.Barrier(1))}
    made: dict[str, TableRunner] = {}

    def factory(table: str) -> TableRunner:
        made[table] = _with_query(table, gone[table])
        return made[table]

    sup = Supervisor(runner_factory=factory, list_tables=lambda: ["a", "b"])
    sup.start()
    assert sup.shutdown(0.3) == ["a (stopping its query)"]
    assert [v.state for v in sup.views()] == ["stopped", "stopped"]
