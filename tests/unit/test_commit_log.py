"""The Spark-free lag probe's walk over commit files (pure: a dict stands in for _delta_log), and
what the commit-file checks cost on an object store (a fake file system answering as s3a does)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from lakemirror.sources.change_feed import SourceHead
from lakemirror.sources.head_probe import probe_head


def log_of(versions: range) -> tuple[dict[int, float], list[int]]:
    files = {v: 1000.0 + v for v in versions}
    return files, []


def probe(files: dict[int, float], calls: list[int], **kw: object):  # type: ignore[no-untyped-def]
    def commit_time(v: int) -> float | None:
        calls.append(v)
        return files.get(v)
    return probe_head(commit_time, **kw)  # type: ignore[arg-type]


def test_caught_up_reads_two_files_and_reports_no_commit_to_wait_for() -> None:
    files, calls = log_of(range(0, 8))
    head = probe(files, calls, applied_through=7, known_latest=7, cache={})
    assert head is not None and head.latest_version == 7 and head.commit_times == {7: 1007.0}
    assert calls == [7, 8]


def test_behind_walks_forward_and_prices_the_oldest_unapplied_commit() -> None:
    files, calls = log_of(range(0, 13))
    cache: dict[int, float] = {}
    head = probe(files, calls, applied_through=4, known_latest=6, cache=cache)
    assert head is not None and head.latest_version == 12
    assert head.commit_times == {12: 1012.0, 5: 1005.0}
    calls.clear()
    files[13] = 1013.0
    again = probe(files, calls, applied_through=4, known_latest=12, cache=cache)
    assert again is not None and again.latest_version == 13
    assert calls == [12, 13, 14], "only the walk's start is read again; older commit times come from the cache"


def test_gives_up_when_far_behind_or_a_needed_commit_file_is_gone() -> None:
    files, calls = log_of(range(0, 200))
    assert probe(files, calls, applied_through=3, known_latest=3, cache={}, max_steps=64) is None
    cleaned = {v: t for v, t in log_of(range(0, 20))[0].items() if v > 10}
    assert probe(cleaned, [], applied_through=5, known_latest=15, cache={}) is None


def test_a_table_recreated_under_the_same_path_is_not_read_as_the_old_one() -> None:
    files, calls = log_of(range(0, 3))  # the new table has versions 0..2; the old one reached 40
    assert probe(files, calls, applied_through=38, known_latest=40, cache={}) is None


def test_a_warm_cache_does_not_hide_a_recreated_table() -> None:
    files, calls = log_of(range(0, 41))
    cache: dict[int, float] = {}
    assert probe(files, calls, applied_through=38, known_latest=40, cache=cache) is not None
    recreated = {v: 5000.0 + v for v in range(0, 3)}
    assert probe(recreated, calls, applied_through=38, known_latest=40, cache=cache) is None


def test_the_cache_forgets_versions_already_applied() -> None:
    files, calls = log_of(range(0, 10))
    cache: dict[int, float] = {v: 1000.0 + v for v in range(0, 10)}
    probe(files, calls, applied_through=8, known_latest=9, cache=cache)
    assert min(cache) == 8


def test_local_commit_log_stats_commit_files_in_milliseconds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from lakemirror.identifiers import TableName
    from lakemirror.delta_log.commit_times import LocalCommitLog
    from lakemirror.tables import TableLocation

    name = TableName("c", "s", "t")
    assert LocalCommitLog.for_table(TableLocation(name, str(tmp_path / "missing"))) is None
    assert LocalCommitLog.for_table(TableLocation(name)) is None, "a table known only by name"
    assert LocalCommitLog.for_table(TableLocation(name, "s3://bucket/t")) is None
    (tmp_path / "t" / "_delta_log").mkdir(parents=True)
    commit = tmp_path / "t" / "_delta_log" / f"{3:020d}.json"
    commit.write_text("{}\n")
    os.utime(commit, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    for location in (str(tmp_path / "t"), f"file://{tmp_path / 't'}"):
        log = LocalCommitLog.for_table(TableLocation(name, location))
        assert log is not None
        assert log.has_commit(3) and not log.has_commit(4)
        assert log.commit_time(3) == 1_700_000_000.123, "whole milliseconds, as Hadoop reports them"
        assert log.commit_time(4) is None


class FakeObjectStore:
    """A Hadoop FileSystem as s3a answers for commit files: ``exists`` and ``getFileStatus`` of a
    missing file probe it as a directory too (a HEAD, then a LIST); ``openFile`` is the HEAD alone."""

    def __init__(self, mtimes: dict[str, int], open_file: bool = True) -> None:
        self.mtimes = mtimes
        self.open_file = open_file
        self.requests: list[str] = []

    def _head(self, path: str) -> bool:
        self.requests.append("HEAD")
        return path in self.mtimes

    def exists(self, path: str) -> bool:
        if self._head(path):
            return True
        self.requests.append("LIST")
        return False

    def getFileStatus(self, path: str) -> Any:  # noqa: N802 (Hadoop's name)
        if not self.exists(path):
            raise RuntimeError(f"java.io.FileNotFoundException: No such file or directory: {path}")
        return SimpleNamespace(getModificationTime=lambda: self.mtimes[path])

    def openFile(self, path: str) -> Any:  # noqa: N802 (Hadoop's name)
        if not self.open_file:
            raise RuntimeError("java.lang.UnsupportedOperationException: openFile")

        def get() -> Any:
            if not self._head(path):
                raise RuntimeError(f"java.util.concurrent.ExecutionException: java.io.FileNotFoundException: {path}")
            return SimpleNamespace(close=lambda: None)
        return SimpleNamespace(build=lambda: SimpleNamespace(get=get))


def hadoop_log(store: FakeObjectStore) -> Any:
    from lakemirror.delta_log.commit_times import HadoopCommitLog

    return HadoopCommitLog(store, lambda version: f"{version:020d}.json")


def test_an_idle_tables_checks_on_an_object_store_cost_one_head_each_and_no_listing() -> None:
    store = FakeObjectStore({f"{v:020d}.json": 1_000_000 + v for v in range(4)})
    log = hadoop_log(store)
    assert log.has_commit(3) and not log.has_commit(4)
    assert log.commit_time(3) == 1000.003 and log.commit_time(4) is None
    assert "LIST" not in store.requests, store.requests
    store.requests.clear()
    for _ in range(10):  # the turn pool's and the lag probe's checks while nothing is committed
        assert not log.has_commit(4)
        assert probe_head(log.commit_time, applied_through=3, known_latest=3, cache={}) == SourceHead(3, {3: 1000.003})
    assert store.requests == ["HEAD"] * 30, "per round: the pool's probe of 4, the lag probe's stat of 3 and probe of 4"


def test_a_version_seen_committed_costs_one_stat_and_a_new_one_is_probed_first() -> None:
    store = FakeObjectStore({f"{v:020d}.json": 2_000_000 + v for v in range(2)})
    log = hadoop_log(store)
    assert log.commit_time(1) == 2000.001 and store.requests == ["HEAD", "HEAD"]  # probed, then stat'ed
    store.requests.clear()
    assert log.commit_time(0) == 2000.0 and store.requests == ["HEAD"]
    store.mtimes.clear()  # the table recreated under the same path: a stat of a gone file still says so
    assert log.commit_time(1) is None


def test_a_table_behind_its_source_costs_no_request_to_say_it_has_something_to_apply() -> None:
    """The lag probe walks the new commits each interval; the turn pool's question whether the
    version after the applied one exists is then answered from what the walk saw."""
    store = FakeObjectStore({f"{v:020d}.json": 3_000_000 + v for v in range(6)})
    log = hadoop_log(store)
    head = probe_head(log.commit_time, applied_through=2, known_latest=2, cache={})
    assert head is not None and head.latest_version == 5
    store.requests.clear()
    assert log.has_commit(3) and log.has_commit(5) and store.requests == []
    assert not log.has_commit(6) and store.requests == ["HEAD"], "a version beyond the newest seen is probed"


def test_a_file_system_without_open_file_falls_back_to_exists() -> None:
    store = FakeObjectStore({f"{0:020d}.json": 5_000}, open_file=False)
    log = hadoop_log(store)
    assert log.has_commit(0) and not log.has_commit(1) and log.commit_time(1) is None
    assert store.requests.count("LIST") == 2  # the file system's own exists(): the probe stays correct


def _commit_head(**info: Any) -> bytes:
    return (json.dumps({"commitInfo": info}) + "\n" + json.dumps({"add": {"path": "p"}}) + "\n").encode()


def test_a_whole_second_from_the_store_is_placed_within_its_second_by_the_commits_own_time() -> None:
    from lakemirror.delta_log.commit_times import precise_commit_time

    assert precise_commit_time(7_000, _commit_head(timestamp=7_640, operation="MERGE")) == 7.64
    assert precise_commit_time(7_000, _commit_head(timestamp=7_100, inCommitTimestamp=7_250)) == 7.25
    # A writer's clock off by more than the store's rounding, or nothing to read: the store's time.
    assert precise_commit_time(7_000, _commit_head(timestamp=8_200)) == 7.0
    assert precise_commit_time(7_000, _commit_head(timestamp=6_990)) == 7.0
    assert precise_commit_time(7_000, None) == 7.0
    assert precise_commit_time(7_000, b'{"commitInfo": {"timestamp": 7') == 7.0, "a cut first line"
    assert precise_commit_time(7_000, _commit_head(timestamp="7640")) == 7.0
    assert precise_commit_time(7_000, b'{"add": {"path": "p"}}\n') == 7.0


class HeadReadingStore(FakeObjectStore):
    """An object store whose times are whole seconds, with the commit files' contents."""

    def __init__(self, mtimes: dict[str, int], contents: dict[str, bytes]) -> None:
        super().__init__(mtimes)
        self.contents = contents

    def open(self, path: str) -> Any:
        self.requests.append("GET")
        data = self.contents[path]
        return SimpleNamespace(readNBytes=lambda n: data[:n], close=lambda: None)


def test_on_a_store_with_whole_second_times_a_commit_time_is_read_from_its_commit_once_per_version() -> None:
    from lakemirror.delta_log.commit_times import HadoopCommitLog

    names = [f"{v:020d}.json" for v in range(2)]
    store = HeadReadingStore(dict(zip(names, (9_000, 10_000))),
                             dict(zip(names, (_commit_head(timestamp=9_470), _commit_head(timestamp=10_120)))))
    log = HadoopCommitLog(store, lambda version: f"{version:020d}.json", read_head=True)
    cache: dict[int, float] = {}
    head = probe_head(log.commit_time, applied_through=0, known_latest=None, cache=cache)
    assert head == SourceHead(1, {1: 10.12})
    assert log.commit_time(0) == 9.47 and store.requests.count("GET") == 2
    for _ in range(5):  # an idle table's probes stat the newest version again, and read nothing more
        assert probe_head(log.commit_time, applied_through=1, known_latest=1, cache=cache) == SourceHead(1, {1: 10.12})
    assert store.requests.count("GET") == 2
    # The table recreated at the path (another file, another time) is read again.
    store.mtimes[names[1]], store.contents[names[1]] = 20_000, _commit_head(timestamp=20_300)
    assert log.commit_time(1) == 20.3 and store.requests.count("GET") == 3
    # Milliseconds from the store (a local or HDFS file system): nothing is read.
    store.mtimes[names[0]] = 9_471
    assert log.commit_time(0) == 9.471 and store.requests.count("GET") == 3
