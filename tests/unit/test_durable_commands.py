"""An accepted control command survives the process (lakemirror.supervisor.control.command_inbox): journalled
before its 202, recorded by the next supervisor before the table starts when the process dies first,
never applied twice, and refused when it cannot be journalled. Fake runners whose state is a "disk"
that outlives the process, and the real file journal in a temporary folder; no Spark."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.commands import CommandJournal, FileCommandJournal, InMemoryCommandJournal
from lakemirror.checkpoints.stream_dir import query_id
from lakemirror.daemon.http import ControlServer
from lakemirror.sources.kafka_offsets import StaticOffsets
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.command_inbox import OPERATOR_RESYNC
from lakemirror.supervisor.control.loop import CommandNotRecorded, CommandRefused, Draining, Supervisor
from lakemirror.supervisor.events.stream_runner import EventStreamRunner
from lakemirror.supervisor.offline.recorded_tables import RecordedTable
from tests.unit.test_control import post
from tests.unit.test_supervisor import POLICY, FakeClock, FakeRunner


@dataclass
class Disk:
    """One table's state as a process killed now leaves it."""

    paused: bool = False
    epoch: int = 0
    bootstrapped: bool = False
    bootstraps: int = 0  # epochs begun


class DiskRunner(FakeRunner):
    """A runner whose pause and progress are on the disk; a launch of a table not bootstrapped begins
    a new epoch's bootstrap at once (as a table runner's launch does once it has pinned its snapshot)."""

    def __init__(self, name: str, disk: Disk) -> None:
        super().__init__(name)
        self.disk = disk
        self.write_error: OSError | None = None

    def pause_persisted(self, paused: bool) -> None:
        if self.write_error is not None:
            raise self.write_error
        self.disk.paused = paused

    def persisted_pause(self) -> bool:
        return self.disk.paused

    def resync(self, reason: str) -> None:
        super().resync(reason)
        self.disk.bootstrapped = False

    def launch(self) -> None:
        super().launch()
        if not self.disk.bootstrapped:
            self.disk.epoch += 1
            self.disk.bootstraps += 1
            self.disk.bootstrapped = True
        self.pending.append(sm.StreamStarted())


class Process:
    """One daemon process: a supervisor over the disks, with the journal at ``journal``."""

    def __init__(self, disks: dict[str, Disk], journal: CommandJournal, tables: list[str] | None = None,
                 recorded: dict[str, RecordedTable] | None = None) -> None:
        self.disks = disks
        self.runners: dict[str, DiskRunner] = {}
        self.journal = journal
        self.tables = list(disks) if tables is None else tables
        self.sup = Supervisor(runner_factory=self.make, list_tables=lambda: list(self.tables), policy=POLICY,
                              clock=FakeClock(), rand=lambda: 0.0, journal=journal,
                              epochs=lambda table: str(disks[table].epoch),
                              recorded=(lambda: recorded) if recorded is not None else None)

    def make(self, name: str) -> DiskRunner:
        self.runners[name] = DiskRunner(name, self.disks[name])
        return self.runners[name]

    def start(self) -> "Process":
        self.sup.start()
        self.sup.tick()
        return self

    def state(self, name: str) -> str:
        return {v.table: v.state for v in self.sup.views()}[name]


def running(disks: dict[str, Disk], path: Path) -> Process:
    return Process(disks, FileCommandJournal(path)).start()


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return layout.commands_file(tmp_path / "pipeline")


# -- accepted, then the process dies before the tick ---------------------------------------------

def test_a_pause_accepted_then_killed_before_the_tick_holds_at_the_next_start_and_the_table_never_runs(
        journal_path: Path) -> None:
    disks = {"a": Disk(), "b": Disk()}
    first = running(disks, journal_path)
    assert first.state("a") == "running"
    assert first.sup.command("pause", "a") is True  # the 202 ...
    # ... then SIGKILL before the next tick: no drain, nothing applied.
    assert disks["a"].paused is False
    second = Process(disks, FileCommandJournal(journal_path)).start()
    assert (second.state("a"), second.runners["a"].launches, disks["a"].paused) == ("paused", 0, True)
    assert second.state("b") == "running"
    assert FileCommandJournal(journal_path).pending() == [], "forgotten once recorded in the table's state"


def test_a_resume_accepted_then_killed_starts_the_paused_table_at_the_next_start(journal_path: Path) -> None:
    disks = {"a": Disk(paused=True)}
    first = running(disks, journal_path)
    assert first.state("a") == "paused"
    first.sup.command("resume", "a")
    second = Process(disks, FileCommandJournal(journal_path)).start()
    assert (second.state("a"), second.runners["a"].launches, disks["a"].paused) == ("running", 1, False)


def test_a_resync_accepted_then_killed_rebuilds_the_replica_once_at_the_next_start(journal_path: Path) -> None:
    disks = {"a": Disk()}
    first = running(disks, journal_path)
    assert (disks["a"].epoch, disks["a"].bootstraps) == (1, 1)
    first.sup.command("resync", "a")
    second = Process(disks, FileCommandJournal(journal_path)).start()
    assert second.runners["a"].resyncs == [OPERATOR_RESYNC]
    assert (second.state("a"), disks["a"].epoch, disks["a"].bootstraps) == ("running", 2, 2)
    assert FileCommandJournal(journal_path).pending() == []


def test_commands_accepted_before_a_kill_are_recorded_in_the_order_they_were_accepted(journal_path: Path) -> None:
    disks = {"a": Disk(), "b": Disk()}
    first = running(disks, journal_path)
    for verb, table in (("pause", "a"), ("pause", "b"), ("resume", "a"), ("resync", "b"), ("pause", "b")):
        assert first.sup.command(verb, table)
    second = Process(disks, FileCommandJournal(journal_path)).start()
    assert (second.state("a"), disks["a"].paused) == ("running", False)
    # b: paused, resynced (which unpauses it), paused again: paused, with its rebuild recorded for its resume
    assert (second.state("b"), disks["b"].paused, second.runners["b"].launches) == ("paused", True, 0)
    assert second.runners["b"].resyncs == [OPERATOR_RESYNC] and disks["b"].bootstrapped is False
    second.sup.command("resume", "b")
    second.sup.tick()
    assert (second.state("b"), disks["b"].epoch, disks["b"].bootstraps) == ("running", 2, 2)


def test_pipeline_wide_commands_are_one_journal_write_all_or_none(journal_path: Path) -> None:
    disks = {"a": Disk(), "b": Disk()}
    first = running(disks, journal_path)
    assert first.sup.command_all("pause", ["a", "nope", "b", "a"]) == ["a", "b"]
    assert [(c.verb, c.table) for c in FileCommandJournal(journal_path).pending()] == [("pause", "a"), ("pause", "b")]
    second = Process(disks, FileCommandJournal(journal_path)).start()
    assert {second.state("a"), second.state("b")} == {"paused"}


# -- never applied twice ---------------------------------------------------------------------------

def test_a_resync_whose_bootstrap_began_before_the_kill_is_not_applied_again(journal_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Killed after the resync took effect (its new epoch's bootstrap began) but before the journal
    forgot it: the next start finds it, and rebuilding the replica again would be a second resync."""
    disks = {"a": Disk()}
    first = running(disks, journal_path)
    assert disks["a"].epoch == 1
    first.sup.command("resync", "a")
    journalled = journal_path.read_bytes()
    first.sup.tick()  # applied: the old epoch's progress reset, the new bootstrap begun
    assert (disks["a"].epoch, disks["a"].bootstraps, first.runners["a"].resyncs) == (2, 2, [OPERATOR_RESYNC])
    journal_path.write_bytes(journalled)  # killed before the journal forgot it
    with caplog.at_level(logging.INFO):
        second = Process(disks, FileCommandJournal(journal_path)).start()
    assert second.runners["a"].resyncs == [], "not rebuilt a second time"
    assert (second.state("a"), disks["a"].epoch, disks["a"].bootstraps) == ("running", 2, 2)
    assert "bootstrapped anew since the resync was accepted" in caplog.text
    assert FileCommandJournal(journal_path).pending() == []


def test_a_resync_recorded_before_the_kill_whose_bootstrap_had_not_begun_bootstraps_once(journal_path: Path) -> None:
    """Killed after the resync reset the table's progress, before its bootstrap began (the same epoch):
    applied again, which changes nothing, and the table bootstraps one new epoch."""
    disks = {"a": Disk()}
    first = running(disks, journal_path)
    first.sup.command("resync", "a")
    journalled = journal_path.read_bytes()
    first.sup.shutdown(5.0)  # records the resync without starting anything ...
    assert (disks["a"].bootstrapped, disks["a"].epoch) == (False, 1)
    journal_path.write_bytes(journalled)  # ... killed before the journal forgot it
    second = Process(disks, FileCommandJournal(journal_path)).start()
    assert (second.state("a"), disks["a"].epoch, disks["a"].bootstraps) == ("running", 2, 2)


def test_two_resyncs_accepted_before_one_tick_rebuild_once() -> None:
    disks = {"a": Disk()}
    p = Process(disks, InMemoryCommandJournal()).start()
    p.sup.command("resync", "a")
    p.sup.command("resync", "a")
    p.sup.tick()
    assert (p.runners["a"].resyncs, disks["a"].bootstraps) == ([OPERATOR_RESYNC], 2)
    assert p.journal.pending() == []


# -- refused rather than accepted ------------------------------------------------------------------

def test_a_command_that_cannot_be_journalled_is_refused_and_never_applied() -> None:
    journal = InMemoryCommandJournal()
    p = Process({"a": Disk()}, journal).start()
    journal.write_error = OSError(28, "No space left on device")
    with pytest.raises(CommandNotRecorded) as refused:
        p.sup.command("pause", "a")
    message = str(refused.value)
    assert "pause a: not accepted" in message and "No space left on device" in message
    assert journal.where in message and "send it again" in message
    p.sup.tick()
    assert (p.state("a"), p.disks["a"].paused) == ("running", False)
    journal.write_error = None
    assert p.sup.command("pause", "a") is True
    p.sup.tick()
    assert p.state("a") == "paused"


def test_the_http_route_answers_503_naming_the_reason_when_the_command_cannot_be_journalled() -> None:
    journal = InMemoryCommandJournal()
    p = Process({"orders": Disk()}, journal).start()
    srv = ControlServer("127.0.0.1", 0, CollectorRegistry(), p.sup.views, {"pipeline_id": "p"}, commands=p.sup.command)
    srv.start()
    try:
        journal.write_error = PermissionError(13, "Permission denied")
        code, answer = post(f"{srv.url}/tables/orders/pause")
        assert code == 503 and "not accepted" in answer["error"] and "Permission denied" in answer["error"], answer
        journal.write_error = None
        assert post(f"{srv.url}/tables/orders/pause")[0] == 202
    finally:
        srv.close()
    p.sup.tick()
    assert p.state("orders") == "paused"


def test_the_refusals_share_one_type_the_http_layer_answers_503() -> None:
    assert issubclass(Draining, CommandRefused) and issubclass(CommandNotRecorded, CommandRefused)


def test_a_resync_whose_tables_epoch_cannot_be_read_is_refused() -> None:
    def epochs(table: str) -> str | None:
        raise ValueError("state/a.json: Expecting value: line 1 column 1 (char 0)")

    sup = Supervisor(runner_factory=FakeRunner, list_tables=lambda: ["a"], policy=POLICY, clock=FakeClock(),
                     journal=InMemoryCommandJournal(), epochs=epochs)
    sup.start()
    with pytest.raises(CommandNotRecorded, match="resync a: not accepted: the table's state cannot be read"):
        sup.command("resync", "a")
    assert sup.command("pause", "a") is True, "a pause needs no epoch"


def test_a_journal_unreadable_at_start_refuses_commands_and_is_applied_once_it_can_be_read(
        caplog: pytest.LogCaptureFixture) -> None:
    first = InMemoryCommandJournal()
    disks = {"a": Disk()}
    Process(disks, first).start().sup.command("pause", "a")
    journal = InMemoryCommandJournal(first.stored)
    journal.read_error = PermissionError(13, "Permission denied")
    with caplog.at_level(logging.ERROR):
        p = Process(disks, journal).start()
    assert "cannot be read" in caplog.text and "refused until then" in caplog.text
    assert p.state("a") == "running", "the tables start meanwhile"
    with pytest.raises(CommandNotRecorded, match="the command journal .* cannot be read .*Permission denied"):
        p.sup.command("resume", "a")
    assert journal.stored == first.stored, "never written over"
    journal.read_error = None
    p.sup.tick()
    assert (p.state("a"), disks["a"].paused, journal.stored) == ("paused", True, [])


def test_a_command_whose_state_cannot_be_written_holds_the_tables_later_ones_behind_it(
        journal_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The pause cannot be written to the table's state; the resume accepted after it must not take
    effect first (a restart would then replay the pause after it and leave the table paused)."""
    disks = {"a": Disk(), "b": Disk()}
    p = running(disks, journal_path)
    p.runners["a"].write_error = OSError(30, "Read-only file system")
    p.sup.command("pause", "a")
    p.sup.command("pause", "b")
    p.sup.command("resume", "a")
    with caplog.at_level(logging.ERROR):
        p.sup.tick()
        p.sup.tick()
    assert caplog.text.count("cannot be applied") == 1, "said once, then tried again quietly"
    assert (p.state("a"), disks["a"].paused) == ("running", False)
    assert (p.state("b"), disks["b"].paused) == ("paused", True), "another table's commands go on"
    assert [(c.verb, c.table) for c in FileCommandJournal(journal_path).pending()] == [("pause", "a"), ("resume", "a")]
    p.runners["a"].write_error = None
    p.sup.tick()
    assert (p.state("a"), disks["a"].paused) == ("running", False), "paused, then resumed, in that order"
    assert p.runners["a"].halts and FileCommandJournal(journal_path).pending() == []


# -- the drain, and tables that have no runner yet -------------------------------------------------

def test_the_drain_records_what_is_queued_and_the_journal_forgets_it(journal_path: Path) -> None:
    disks = {"a": Disk()}
    p = running(disks, journal_path)
    p.sup.command("pause", "a")
    p.sup.shutdown(5.0)
    assert disks["a"].paused is True and FileCommandJournal(journal_path).pending() == []
    with pytest.raises(Draining):
        p.sup.command("resume", "a")
    assert FileCommandJournal(journal_path).pending() == []


def test_a_command_for_a_table_listed_from_the_records_waits_in_the_journal_for_its_runner(
        journal_path: Path) -> None:
    """The catalog cannot be listed at start: the table is known from the records only. Its pause is
    accepted, waits (journalled) for its runner, and holds across a kill until the table exists."""
    disks = {"a": Disk()}
    recorded = {"a": RecordedTable("a", None, None, None, started=False)}
    first = Process(disks, FileCommandJournal(journal_path), recorded=recorded)
    first.sup._list_tables = lambda: (_ for _ in ()).throw(OSError("catalog unreachable"))  # noqa: SLF001
    first.start()
    assert first.sup.command("pause", "a") is True
    first.sup.tick()
    assert first.runners == {} and [c.verb for c in FileCommandJournal(journal_path).pending()] == ["pause"]
    second = Process(disks, FileCommandJournal(journal_path), recorded=recorded).start()
    assert (second.state("a"), second.runners["a"].launches, disks["a"].paused) == ("paused", 0, True)


def test_commands_of_a_table_not_in_the_pipeline_after_a_restart_wait_for_it(journal_path: Path) -> None:
    disks = {"a": Disk(), "gone": Disk()}
    running(disks, journal_path).sup.command("pause", "gone")
    p = Process(disks, FileCommandJournal(journal_path), tables=["a"]).start()
    assert [c.table for c in FileCommandJournal(journal_path).pending()] == ["gone"], "kept until it is back"
    p.tables.append("gone")
    p.sup._discover(0.0)  # noqa: SLF001 (the discovery loop finds it again)
    assert (p.state("gone"), disks["gone"].paused) == ("paused", True)
    assert FileCommandJournal(journal_path).pending() == []


# -- an event source: its epoch is its query checkpoint's id ---------------------------------------

class QuietEventRunner(EventStreamRunner):
    """The real event-source runner (pause kept in the state store, resync retiring the checkpoint),
    its launch counted instead of starting a query."""

    launches = 0

    def launch(self) -> None:
        self.launches += 1


def event_supervisor(folder: Path, journal_path: Path) -> tuple[Supervisor, dict[str, QuietEventRunner]]:
    from lakemirror.checkpoints.state import FileStateStore
    from lakemirror.sources.memory_events import MemoryEventSource
    from lakemirror.sinks.events.memory_sink import memory_event_sink
    from lakemirror.supervisor.events.stream_runner import EventStreamSpec

    made: dict[str, QuietEventRunner] = {}

    def make(name: str) -> QuietEventRunner:
        spec = EventStreamSpec("shop", "files", path=str(folder / "inbox"))
        source = MemoryEventSource("files", offsets=StaticOffsets())
        made[name] = QuietEventRunner(spec, None, folder, memory_event_sink(spec, source.decoder, "p"),  # type: ignore[arg-type]
                                      source=source, states=FileStateStore(folder.parent))
        return made[name]

    sup = Supervisor(runner_factory=make, list_tables=lambda: ["events:shop"], policy=POLICY, clock=FakeClock(),
                     journal=FileCommandJournal(journal_path),
                     epochs=lambda _: query_id(layout.event_checkpoint(folder)))
    return sup, made


def checkpoint(folder: Path, query: str) -> Path:
    cp = layout.event_checkpoint(folder)
    (cp / "offsets").mkdir(parents=True)
    (cp / "metadata").write_text('{"id":"%s"}' % query)
    return cp


def test_an_event_sources_pause_accepted_then_killed_holds_at_the_next_start(tmp_path: Path, journal_path: Path) -> None:
    folder = tmp_path / "pipeline" / "events" / "shop"
    sup, _ = event_supervisor(folder, journal_path)
    sup.start()
    assert sup.command("pause", "events:shop")
    again, made = event_supervisor(folder, journal_path)
    again.start()
    assert made["events:shop"].launches == 0 and made["events:shop"].persisted_pause() is True
    assert {v.table: v.state for v in again.views()}["events:shop"] == "paused"


def test_an_event_sources_resync_whose_replay_began_before_the_kill_is_not_applied_again(
        tmp_path: Path, journal_path: Path) -> None:
    folder = tmp_path / "pipeline" / "events" / "shop"
    checkpoint(folder, "query-1")
    sup, made = event_supervisor(folder, journal_path)
    sup.start()
    sup.command("resync", "events:shop")
    assert [c.epoch for c in FileCommandJournal(journal_path).pending()] == ["query-1"]
    journalled = journal_path.read_bytes()
    sup.tick()
    assert not layout.event_checkpoint(folder).exists(), "the old checkpoint retired: the replay starts afresh"
    checkpoint(folder, "query-2")  # the replay's query started on a new checkpoint ...
    journal_path.write_bytes(journalled)  # ... and the process was killed before the journal forgot the resync
    again, _ = event_supervisor(folder, journal_path)
    again.start()
    assert query_id(layout.event_checkpoint(folder)) == "query-2", "the replay under way is not thrown away"
    assert FileCommandJournal(journal_path).pending() == []


# -- the composition root wires the pipeline's journal -----------------------------------------------

def test_the_daemons_supervisors_journal_in_the_pipelines_folder(tmp_path: Path) -> None:
    from lakemirror.checkpoints.state import TableProgress
    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.metrics import Metrics
    from lakemirror.daemon.settings import load_settings
    from lakemirror.identifiers import TableName

    def context(**changes: Any) -> DaemonContext:
        return DaemonContext(load_settings(None, {
            "pipeline_id": "main", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
            "tables": ["orders"], "checkpoint_volume": str(tmp_path / "ck"),
            "runtime": {"warehouse": str(tmp_path / "wh")}, **changes})).replace(
            spark=object(), metrics=Metrics("main", CollectorRegistry()))

    ctx = context()
    ctx.states.save(TableName("src", "sales", "orders").slug, TableProgress(epoch=3, bootstrapped=True))
    sup = ctx.supervisor
    sup._seed(0.0)  # noqa: SLF001 (no Spark: the table is listed from the records, not started)
    assert sup.command("resync", "orders")
    stored = FileCommandJournal(tmp_path / "ck" / "main" / "commands.json").pending()
    assert [(c.verb, c.table, c.epoch) for c in stored] == [("resync", "orders", "3")]

    (tmp_path / "in").mkdir()
    events = context(pipeline_id="shop", tables=None, source={"kind": "files", "name": "shop",
                                                              "path": str(tmp_path / "in")})
    checkpoint(tmp_path / "ck" / "shop" / "events" / "shop", "query-7")
    sup = events.supervisor
    sup._seed(0.0)  # noqa: SLF001
    assert sup.command("resync", "events:shop")
    stored = FileCommandJournal(tmp_path / "ck" / "shop" / "commands.json").pending()
    assert [(c.verb, c.table, c.epoch) for c in stored] == [("resync", "events:shop", "query-7")]


# -- the REST API's pipeline-wide commands -----------------------------------------------------------

def test_the_apis_pipeline_pause_is_one_journal_write_and_refused_whole_when_it_cannot_be_made(
        tmp_path: Path) -> None:
    from tests.unit.test_api import Daemon, body, call

    daemon = Daemon(tmp_path)
    try:
        assert call("POST", f"{daemon.url}/api/continuous-sync", body(tmp_path))[0] == 201
        handle = daemon.registry.get("p2")
        assert handle is not None
        journal = handle.supervisor.commands.journal
        assert isinstance(journal, InMemoryCommandJournal)
        journal.write_error = OSError(28, "No space left on device")
        code, answer = call("POST", f"{daemon.url}/api/continuous-sync/p2/pause")
        assert code == 503 and "not accepted" in answer["error"] and "No space left" in answer["error"], answer
        daemon.registry.tick_all()
        assert not daemon.runners[("p2", "orders")].paused and not daemon.runners[("p2", "customers")].paused
        journal.write_error = None
        writes = journal.writes
        assert call("POST", f"{daemon.url}/api/continuous-sync/p2/pause")[0] == 202
        assert journal.writes == writes + 1 and [c.table for c in journal.stored] == ["customers", "orders"]
        daemon.registry.tick_all()
        assert daemon.runners[("p2", "orders")].paused and journal.stored == []
    finally:
        daemon.close()
