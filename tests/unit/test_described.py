"""A source's description kept between launches: reused while the source's log shows it holds (pure),
and the launch's use of it (the in-memory twins of the source, its commit files and the store)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from lakemirror.checkpoints.descriptions import FileDescriptionStore, InMemoryDescriptionStore
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sources.catalog import TableInfo
from lakemirror.delta_log.commit_files import MemoryCommitFiles, changes_metadata, digest
from lakemirror.sources.described import Described, stale
from lakemirror.sources.memory import MemoryChangeSource
from lakemirror.supervisor.change_feed.source_description import SourceDescription
from lakemirror.tables import TableLocation

LOC = TableLocation(TableName("src", "s", "t"), "/lake/src/s/t")
COLUMNS = (Column("id", "bigint", False), Column("v", "string"))


def _commit(*actions: dict[str, object]) -> bytes:
    return "\n".join(json.dumps(a) for a in actions).encode() + b"\n"


DATA = _commit({"commitInfo": {"operation": "WRITE"}}, {"add": {"path": "a.parquet", "dataChange": True}})
SCHEMA_CHANGE = _commit({"commitInfo": {"operation": "ADD COLUMNS"}}, {"metaData": {"id": "t-1"}})
FEATURE_CHANGE = _commit({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7}})
CREATE = _commit({"protocol": {"minReaderVersion": 1}}, {"metaData": {"id": "t-1"}}, {"commitInfo": {}})


def _kept(version: int = 1, commit: bytes = DATA) -> Described:
    info = TableInfo(LOC, "t-1", COLUMNS, {"delta.enableChangeDataFeed": "true"}, ("id",))
    return Described.of(info, version, commit)


def test_a_description_holds_while_no_later_commit_changes_metadata() -> None:
    files = MemoryCommitFiles({0: CREATE, 1: DATA, 2: DATA, 3: DATA})
    assert stale(_kept(1), files.read) is None
    assert files.reads == 4, "the kept version and every commit after it, up to the first missing"


def test_a_later_schema_or_feature_change_makes_it_stale() -> None:
    assert stale(_kept(1), MemoryCommitFiles({1: DATA, 2: DATA, 3: SCHEMA_CHANGE}).read) == (
        "version 3 changes the table's metadata or protocol")
    assert "version 2 changes" in (stale(_kept(1), MemoryCommitFiles({1: DATA, 2: FEATURE_CHANGE}).read) or "")


def test_a_recreated_or_cleaned_up_table_makes_it_stale() -> None:
    recreated = _commit({"commitInfo": {"operation": "WRITE", "timestamp": 2}}, {"add": {"path": "b.parquet"}})
    assert "recreated" in (stale(_kept(1), MemoryCommitFiles({0: CREATE, 1: recreated}).read) or "")
    assert "gone" in (stale(_kept(1), MemoryCommitFiles({2: DATA}).read) or "")


def test_too_many_commits_since_are_not_read() -> None:
    files = MemoryCommitFiles({v: DATA for v in range(1, 20)})
    assert stale(_kept(1), files.read, max_commits=5) == "more than 5 commits since version 1"
    assert files.reads == 6


def test_what_counts_as_a_metadata_change() -> None:
    assert not changes_metadata(DATA)
    assert changes_metadata(SCHEMA_CHANGE) and changes_metadata(FEATURE_CHANGE)
    assert not changes_metadata(_commit({"commitInfo": {"userMetadata": "metaData protocol"}})), \
        "the words inside another action are no change"
    assert changes_metadata(b'{"metaData": {\n') and changes_metadata(b"\xff\xfe"), "unreadable: a change"


def test_a_description_comes_back_from_its_document_and_a_damaged_one_is_none() -> None:
    kept = _kept(7)
    assert Described.from_json(json.loads(json.dumps(kept.as_json()))) == kept
    assert kept.info(LOC) == TableInfo(LOC, "t-1", COLUMNS, {"delta.enableChangeDataFeed": "true"}, ("id",))
    assert kept.digest == digest(DATA)
    for damaged in (None, [], {"format": 99}, {**kept.as_json(), "columns": [["id"]]}, {**kept.as_json(), "version": "x"}):
        assert Described.from_json(damaged) is None


class CountingSource(MemoryChangeSource):
    described = 0

    def describe(self) -> TableInfo:
        self.described += 1
        return super().describe()


def _launches(files: MemoryCommitFiles | None = None) -> tuple[CountingSource, SourceDescription]:
    source = CountingSource(LOC, COLUMNS, key=("id",), table_id="t-1")
    store = InMemoryDescriptionStore()
    return source, SourceDescription(source, LOC, files if files is not None else MemoryCommitFiles({0: CREATE, 1: DATA}),
                                     store, "src__s__t", "src.s.t")


def test_the_first_launch_describes_and_keeps_the_next_reuses() -> None:
    source, description = _launches()
    first = description.describe()
    assert source.described == 1
    assert description.store is not None and description.store.load("src__s__t")["version"] == 1
    again = description.describe()
    assert source.described == 1, "no commit since changed the metadata: nothing described"
    assert again == first


def test_a_relaunch_or_a_metadata_change_describes_afresh_and_keeps_the_new_one() -> None:
    files = MemoryCommitFiles({0: CREATE, 1: DATA})
    source, description = _launches(files)
    description.describe()
    description.describe(reuse=False)
    assert source.described == 2, "a relaunch (a retry) never reuses what was read before it"
    files.commits[2] = SCHEMA_CHANGE
    source.columns = (*COLUMNS, Column("added", "int"))
    assert description.describe().columns == source.columns
    assert source.described == 3
    assert description.store is not None and description.store.load("src__s__t")["version"] == 2
    assert description.describe().columns == source.columns and source.described == 3


def test_a_source_whose_commit_files_cannot_be_read_is_described_every_launch() -> None:
    source = CountingSource(LOC, COLUMNS, key=("id",))
    unreadable = SourceDescription(source, LOC, None, InMemoryDescriptionStore(), "src__s__t", "src.s.t")
    unreadable.describe()
    unreadable.describe()

    class Broken(MemoryCommitFiles):
        def newest(self) -> int | None:
            raise PermissionError("denied")

    broken = replace(unreadable, commits=Broken({0: CREATE}))
    broken.describe()
    broken.describe()
    assert source.described == 4
    assert broken.store is not None and broken.store.load("src__s__t") is None


def test_the_file_store_round_trips_and_shrugs_off_damage(tmp_path: Path) -> None:
    store = FileDescriptionStore(tmp_path / "pipe")
    assert store.load("a") is None
    store.save("a", {"format": 1, "x": [1, 2]})
    assert store.load("a") == {"format": 1, "x": [1, 2]}
    assert store.path("a") == tmp_path / "pipe" / "a" / "description.json"
    store.path("a").write_text("{not json")
    assert store.load("a") is None
    (tmp_path / "blocked").write_text("a file where the folder should be")
    FileDescriptionStore(tmp_path / "blocked").save("a", {"format": 1})  # logged, never raised
