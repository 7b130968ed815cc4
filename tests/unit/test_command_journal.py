"""The command journal (lakemirror.checkpoints.commands) on a real folder and as its twin, and the
pure plan of which journalled commands still need applying (lakemirror.supervisor.control.command_plan)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.commands import Command, FileCommandJournal, InMemoryCommandJournal
from lakemirror.checkpoints.stream_dir import query_id
from lakemirror.supervisor.control.command_plan import Step, plan, resync_tables


def journal_at(tmp_path: Path) -> FileCommandJournal:
    return FileCommandJournal(layout.commands_file(tmp_path / "p"), clock=lambda: 1000.0)


# -- the file -----------------------------------------------------------------------------------

def test_appended_commands_are_on_disk_before_append_returns_and_a_new_process_reads_them_in_order(
        tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    first = journal.append([("pause", "orders", None)])
    second = journal.append([("resync", "customers", "3"), ("resume", "orders", None)])
    assert [c.seq for c in first + second] == [1, 2, 3]
    doc = json.loads((tmp_path / "p" / "commands.json").read_text())
    assert doc["format"] == 1 and [c["verb"] for c in doc["commands"]] == ["pause", "resync", "resume"]
    again = journal_at(tmp_path)  # what a process started after a kill reads
    assert again.pending() == [Command(1, "pause", "orders", 1000.0), Command(2, "resync", "customers", 1000.0, "3"),
                               Command(3, "resume", "orders", 1000.0)]
    again.remove([1, 3])
    assert [c.seq for c in journal_at(tmp_path).pending()] == [2]
    # Numbering goes on after the highest pending command: acceptance order holds across restarts.
    assert [c.seq for c in again.append([("pause", "orders", None)])] == [4]
    assert sorted(os.listdir(tmp_path / "p")) == ["commands.json"], "no temporary file is left behind"


def test_a_journal_that_cannot_be_written_accepts_nothing_and_keeps_what_it_had(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    journal.append([("pause", "orders", None)])
    before = journal.path.read_bytes()
    journal.path.unlink()
    journal.path.mkdir()  # the rename cannot replace it (root ignores permissions: a folder in the way cannot be)
    with pytest.raises(OSError):
        journal.append([("resume", "orders", None)])
    assert [c.name for c in journal.path.parent.iterdir() if c.name.endswith(".tmp")] == [], "its temporary file removed"
    journal.path.rmdir()
    journal.path.write_bytes(before)
    assert [(c.seq, c.verb) for c in journal.pending()] == [(1, "pause")], "the refused command is not in memory either"
    assert [(c.seq, c.verb) for c in journal_at(tmp_path).pending()] == [(1, "pause")]


def test_an_unparseable_journal_is_set_aside_with_an_error_and_the_pipeline_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = layout.commands_file(tmp_path / "p")
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"format": 1, "commands": [{"seq": 1, "ver')
    journal = FileCommandJournal(path)
    with caplog.at_level(logging.ERROR):
        assert journal.pending() == []
    [aside] = [p for p in path.parent.iterdir() if p.name.startswith("commands.json.unreadable-")]
    assert aside.read_bytes().startswith(b'{"format": 1')
    assert "cannot be read" in caplog.text and str(aside) in caplog.text and "send again" in caplog.text
    assert [c.seq for c in journal.append([("pause", "orders", None)])] == [1]
    assert [c.verb for c in FileCommandJournal(path).pending()] == ["pause"]


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"[]", b'{"format": 99, "commands": []}', b"null"])
def test_a_document_that_is_not_a_journal_of_this_format_is_set_aside(tmp_path: Path, content: bytes) -> None:
    path = layout.commands_file(tmp_path)
    path.write_bytes(content)
    assert FileCommandJournal(path).pending() == []
    assert not path.exists() and len(list(tmp_path.glob("commands.json.unreadable-*"))) == 1


def test_an_entry_that_is_not_a_command_is_left_out_and_the_others_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = layout.commands_file(tmp_path)
    good = Command(2, "resume", "orders", 5.0).as_json()
    path.write_text(json.dumps({"format": 1, "commands": [
        {"seq": 1, "verb": "drop", "table": "orders", "accepted_at": 1.0}, good,
        {"seq": True, "verb": "pause", "table": "x", "accepted_at": 1.0}, {"seq": 3, "verb": "pause", "table": "",
                                                                           "accepted_at": 1.0}, "junk"]}))
    with caplog.at_level(logging.ERROR):
        assert FileCommandJournal(path).pending() == [Command(2, "resume", "orders", 5.0)]
    assert caplog.text.count("not a command") == 4


def test_unknown_verbs_are_refused_before_anything_is_written() -> None:
    journal = InMemoryCommandJournal()
    with pytest.raises(ValueError, match="unknown command 'drop'"):
        journal.append([("pause", "a", None), ("drop", "a", None)])
    assert journal.stored == [] and journal.writes == 0


# -- the twin: what survives, and removals that cannot be written --------------------------------

def test_a_removal_that_cannot_be_written_goes_to_disk_with_the_next_change(caplog: pytest.LogCaptureFixture) -> None:
    """Applied, not forgotten on disk: a later command must not find the stale one before it after a restart."""
    journal = InMemoryCommandJournal()
    pause, = journal.append([("pause", "orders", None)])
    journal.write_error = OSError(28, "No space left on device")
    with caplog.at_level(logging.WARNING):
        journal.remove([pause.seq])
    assert "could not be updated" in caplog.text
    assert journal.pending() == [] and [c.verb for c in journal.stored] == ["pause"]
    with pytest.raises(OSError):
        journal.append([("resume", "orders", None)])
    journal.write_error = None
    resume, = journal.append([("resume", "orders", None)])
    assert journal.stored == [resume], "the owed removal is written with the next change"


def test_a_twin_built_from_what_a_killed_one_stored_reads_it_and_numbers_on() -> None:
    old = InMemoryCommandJournal(clock=lambda: 7.0)
    old.append([("pause", "a", None), ("resync", "b", "2")])
    new = InMemoryCommandJournal(old.stored)
    assert [(c.seq, c.verb, c.table, c.epoch) for c in new.pending()] == [(1, "pause", "a", None), (2, "resync", "b", "2")]
    assert new.append([("resume", "a", None)])[0].seq == 3
    new.read_error = OSError(13, "Permission denied")
    assert new.pending(), "read once: later reads are the journal's own list"
    unreadable = InMemoryCommandJournal(old.stored)
    unreadable.read_error = OSError(13, "Permission denied")
    with pytest.raises(OSError):
        unreadable.pending()
    with pytest.raises(OSError):
        unreadable.append([("pause", "a", None)])  # a journal it could not read is never written over
    assert unreadable.stored == old.stored


# -- the plan -----------------------------------------------------------------------------------

def c(seq: int, verb: str, table: str = "a", epoch: str | None = None) -> Command:
    return Command(seq, verb, table, 0.0, epoch)


def test_a_resync_whose_table_moved_to_another_epoch_is_done_and_one_at_the_same_epoch_is_applied() -> None:
    steps = plan([c(1, "resync", "a", "3"), c(2, "resync", "b", "3"), c(3, "resync", "c", None)],
                 {"a": "4", "b": "3", "c": "1"})
    assert [(s.command.table, s.apply) for s in steps] == [("a", False), ("b", True), ("c", False)]
    assert steps[0].done is not None and "epoch 3, now 4" in steps[0].done
    assert steps[2].done is not None and "epoch none, now 1" in steps[2].done


def test_a_resync_whose_epoch_cannot_be_read_is_applied() -> None:
    assert plan([c(1, "resync", "a", "3")], {}) == [Step(c(1, "resync", "a", "3"), True)]


def test_pause_and_resume_are_always_applied_in_order_and_a_repeat_in_a_row_is_one() -> None:
    steps = plan([c(1, "pause"), c(2, "pause"), c(3, "pause", "b"), c(4, "resume"), c(5, "pause"),
                  c(6, "resync", epoch="1"), c(7, "resync", epoch="1")], {"a": "1"})
    assert [(s.command.seq, s.apply) for s in steps] == [(1, True), (2, False), (3, True), (4, True), (5, True),
                                                         (6, True), (7, False)]
    assert steps[1].done == "the same pause as the command before it"


def test_resync_tables_names_each_table_once_in_order() -> None:
    assert resync_tables([c(1, "resync", "b"), c(2, "pause", "a"), c(3, "resync", "a"), c(4, "resync", "b")]) == \
        ["b", "a"]


# -- an event source's epoch: the id of its query's checkpoint -----------------------------------

def test_query_id_is_the_checkpoints_metadata_id(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    assert query_id(checkpoint) is None, "no checkpoint yet"
    checkpoint.mkdir()
    assert query_id(checkpoint) is None, "a checkpoint whose query never started"
    (checkpoint / "metadata").write_text('{"id":"5f1c2a9e-0b6d-4c1e-9a57-3c2d1e0f4b8a"}')
    assert query_id(checkpoint) == "5f1c2a9e-0b6d-4c1e-9a57-3c2d1e0f4b8a"
    (checkpoint / "metadata").write_text("garbage")
    with pytest.raises(ValueError, match="metadata"):
        query_id(checkpoint)
    (checkpoint / "metadata").write_text('{"other": 1}')
    with pytest.raises(ValueError, match="no query id"):
        query_id(checkpoint)
