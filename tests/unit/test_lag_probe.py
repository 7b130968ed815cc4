"""A lag probe prices one applied version throughout, even while batches advance it.

The stream's thread moves ``applied_through`` forward whenever a batch lands; a probe that read
it once to fetch commit times and again to price them reported a 0 s change window (the newer
version's commit time was never fetched) and a lag measured from the wrong commit.
"""

from __future__ import annotations

from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sources.change_feed import SourceHead
from lakemirror.sources.keys import choose_key
from lakemirror.sources.memory import MemoryChangeSource
from lakemirror.schema import Column
from lakemirror.sources.retention import RetentionWindow
from lakemirror.supervisor.change_feed.table_runner import Prepared, TableRunner
from tests.unit.runner_fakes import table_runner


class _MovingSource(MemoryChangeSource):
    """A source without commit files to read directly; a batch lands while its history is read."""

    runner: TableRunner | None = None

    def head(self, since_version: int, window: int = 32) -> SourceHead:
        assert self.runner is not None
        self.runner.applied_through = 8  # a batch lands on the stream's thread meanwhile
        return super().head(since_version, window)

    def commit_log(self) -> None:  # type: ignore[override]
        return None


def test_a_batch_landing_during_a_probe_does_not_mix_versions() -> None:
    runner = table_runner()
    ctx = runner.ctx
    cols = (Column("id", "bigint", False),)
    runner.prepared = Prepared(choose_key("src.s.t", cols, configured=("id",)), plan_merge(cols, ["id"]),
                               ctx.states.load(runner.slug), RetentionWindow())
    runner.applied_through = 4
    now = 1_000_000.0
    commit_time = {v: now - 100 + v for v in range(0, 11)}
    source = _MovingSource(ctx.catalog.locate(runner.source), cols, ("id",))
    for v in range(1, 11):
        source.commit([], at=commit_time[v])
    source.times[0] = commit_time[0]
    source.runner = runner
    runner.change_source = source  # type: ignore[assignment]  # the twin in place of the Delta feed
    reading = runner.probe_lag(now)
    assert reading is not None
    assert reading.applied_through_version == 4 and reading.versions_behind == 6
    assert reading.lag_seconds == now - commit_time[5]
    assert reading.retention_headroom_seconds == commit_time[5] + RetentionWindow().seconds - now


class _CommitFiles:
    """Commit files looked at one version at a time, each look counted."""

    answers_locally = True

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self.looks = 0

    def has_commit(self, version: int) -> bool:
        return version in self.times

    def commit_time(self, version: int) -> float | None:
        self.looks += 1
        return self.times.get(version)


def test_the_next_commit_is_looked_for_at_most_once_a_quarter_second_and_kept_once_found() -> None:
    from lakemirror.supervisor.change_feed.lag_probe import NOT_COMMITTED_STANDS_SECONDS, LagProbe

    files = _CommitFiles()

    class Source:  # what the probe asks of a source here: its commit files
        def commit_log(self) -> _CommitFiles:
            return files

    probe = LagProbe(Source(), "t", warning_seconds=60.0)  # type: ignore[arg-type]
    now = [100.0]
    assert probe.committed_at(5, clock=lambda: now[0]) is None and files.looks == 0, "not opened before a probe"
    assert probe.commit_files() is files
    assert probe.committed_at(5, clock=lambda: now[0]) is None and files.looks == 1
    now[0] += NOT_COMMITTED_STANDS_SECONDS / 2
    assert probe.committed_at(5, clock=lambda: now[0]) is None and files.looks == 1, "a scrape and a status at once"
    files.times[5] = 99.5
    now[0] += NOT_COMMITTED_STANDS_SECONDS
    assert probe.committed_at(5, clock=lambda: now[0]) == 99.5 and files.looks == 2
    assert probe.committed_at(5, clock=lambda: now[0]) == 99.5 and files.looks == 2, "a commit time never changes"
    probe.reset()
    assert probe.committed_at(5, clock=lambda: now[0]) is None, "a resync forgets what was found"


def test_commit_files_in_an_object_store_are_not_looked_at_when_asked() -> None:
    """A scrape would wait for the requests of every caught-up table: there the probe's reading stands."""
    from lakemirror.supervisor.change_feed.lag_probe import LagProbe

    files = _CommitFiles()
    files.answers_locally = False  # type: ignore[misc]
    files.times[5] = 99.5

    class Source:
        def commit_log(self) -> _CommitFiles:
            return files

    probe = LagProbe(Source(), "t", warning_seconds=60.0)  # type: ignore[arg-type]
    assert probe.commit_files() is files
    assert probe.committed_at(5) is None and files.looks == 0


def test_on_an_object_store_a_commit_the_turn_pool_found_is_priced_when_asked_and_no_other_is_looked_for() -> None:
    """The turn pool looks for an idle table's next version several times a turn interval; once a
    look has found it, a scrape prices it (its file's status and first line, once) instead of
    reading 0 until the next probe. A version no look has found costs a scrape no request."""
    from tests.unit.test_commit_log import FakeObjectStore, hadoop_log

    from lakemirror.supervisor.change_feed.lag_probe import LagProbe

    store = FakeObjectStore({f"{v:020d}.json": 4_000_000 + v for v in range(6)})
    log = hadoop_log(store)

    class Source:
        def commit_log(self) -> object:
            return log

    probe = LagProbe(Source(), "t", warning_seconds=60.0)  # type: ignore[arg-type]
    assert probe.probe(5, None, now=4010.0).versions_behind == 0
    store.requests.clear()
    assert probe.committed_at(6) is None and store.requests == [], "nothing seen: no request at a scrape"
    store.mtimes[f"{6:020d}.json"] = 4_000_006
    assert probe.committed_at(6) is None and store.requests == [], "committed, but no look has found it yet"
    assert log.has_commit(6) and store.requests == ["HEAD"]  # the turn pool's look
    store.requests.clear()
    assert probe.committed_at(6) == 4000.006 and store.requests == ["HEAD"], "priced: one status"
    assert probe.committed_at(6) == 4000.006 and store.requests == ["HEAD"], "and kept"


def test_on_an_object_store_a_caught_up_table_costs_one_look_a_probe_and_a_recreated_one_is_still_found() -> None:
    """Each probe walks forward from the newest version it knows; looking at that version's file again
    is what finds a table recreated with fewer versions. On an object store that look is a request per
    table per interval, so it is made once every ``RESTAT_START_EVERY`` probes."""
    from lakemirror.supervisor.change_feed.lag_probe import RESTAT_START_EVERY, LagProbe

    files = _CommitFiles()
    files.answers_locally = False  # type: ignore[misc]
    files.times.update({v: 1000.0 + v for v in range(6)})

    class Source:
        def commit_log(self) -> _CommitFiles:
            return files

        def head(self, since_version: int, window: int = 32) -> SourceHead:
            return SourceHead(2, {2: 5002.0})  # the recreated table's history

    probe = LagProbe(Source(), "t", warning_seconds=60.0)  # type: ignore[arg-type]
    first = probe.probe(5, None, now=1010.0)
    assert first.versions_behind == 0 and files.looks == 2, "the first probe looks at 5 and for 6"
    files.looks = 0
    for _ in range(RESTAT_START_EVERY - 1):
        assert probe.probe(5, None, now=1010.0).versions_behind == 0
    assert files.looks == RESTAT_START_EVERY - 1, "one look a probe: for the next version only"
    files.times = {v: 5000.0 + v for v in range(3)}  # recreated under the same path, versions 0-2
    probe.probe(5, None, now=1010.0)
    assert probe._known_latest == 2, "the look at version 5 found it gone: the history was read"  # noqa: SLF001


def test_on_the_drivers_disk_every_probe_looks_at_the_newest_version_again() -> None:
    from lakemirror.supervisor.change_feed.lag_probe import LagProbe

    files = _CommitFiles()
    files.times.update({v: 1000.0 + v for v in range(6)})

    class Source:
        def commit_log(self) -> _CommitFiles:
            return files

    probe = LagProbe(Source(), "t", warning_seconds=60.0)  # type: ignore[arg-type]
    for _ in range(3):
        probe.probe(5, None, now=1010.0)
    assert files.looks == 6, "a stat of 5 and one for 6 at each probe"
