"""Replaying a change-feed table's dead letters: the pure planner (which letters one write settles,
its transaction id, the keys read back from their letters, the state at the applied version when its
snapshot is gone, what each letter becomes) and the pipeline's desk over the dead-letter table's
in-memory twin (counts, list, skip, and a replay placed between the table's batches). The Spark
side runs in tests/integration/test_feed_letter_replay_spark.py."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Iterator, Sequence

import pytest

from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.events.dead_letters import PENDING, REPLAYED, SKIPPED, Resolution
from lakemirror.sinks.merge import letter_replay as lr
from lakemirror.sinks.merge.feed_letters import FeedLetter, InMemoryFeedLetters, StoredFeedLetter
from lakemirror.sinks.merge.feed_replay import ReplayTarget
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.connect_types import json_value_text
from lakemirror.supervisor.change_feed.dead_letters import FeedLetterDesk
from lakemirror.tables import TableLocation


def letter(key: str, version: int, table: str = "src.sales.orders", status: str = PENDING) -> StoredFeedLetter:
    one = FeedLetter(table, key, version, "update_postimage", "{}", "CHECK positive violated")
    return StoredFeedLetter(one.id, table, key, version, "update_postimage", one.reason, status)


# -- which letters one write settles, and its transaction id -------------------------------------------

def test_a_replay_settles_every_pending_letter_of_the_named_keys_and_no_other() -> None:
    a1, a2, b1 = letter('{"id": 1}', 3), letter('{"id": 1}', 7), letter('{"id": 2}', 5)
    done = letter('{"id": 1}', 2, status=SKIPPED)
    other_table = letter('{"id": 1}', 4, table="src.sales.customers")
    [one] = lr.keys_to_replay([a1], [a1, a2, b1, done, other_table])
    assert (one.table, one.key, one.ids) == ("src.sales.orders", '{"id": 1}', (a1.id, a2.id))
    assert one.newest_version == 7
    both = lr.keys_to_replay([b1, a2], [a1, a2, b1])
    assert [r.key for r in both] == ['{"id": 1}', '{"id": 2}'] and both[0].ids == (a1.id, a2.id)
    # a letter named explicitly is replayed whatever its status (the operator's word)
    assert lr.keys_to_replay([done], [done])[0].ids == (done.id,)


def test_the_same_letters_replay_under_the_same_transaction_and_others_under_another() -> None:
    a1, a2, b1 = letter('{"id": 1}', 3), letter('{"id": 1}', 7), letter('{"id": 2}', 5)
    first = lr.replay_txn("lakemirror/p/orders/e0", lr.keys_to_replay([a1], [a1, a2]))
    assert first == lr.replay_txn("lakemirror/p/orders/e0", lr.keys_to_replay([a2], [a1, a2]))  # a repeat: skipped
    assert first.app_id.startswith("lakemirror/p/orders/e0/replay/") and first.version == 7
    assert lr.replay_txn("lakemirror/p/orders/e0", lr.keys_to_replay([a1, b1], [a1, a2, b1])) != first
    assert lr.replay_txn("lakemirror/p/orders/e1", lr.keys_to_replay([a1], [a1, a2])).app_id != first.app_id


def test_a_letter_newer_than_the_applied_version_is_never_written_from_an_older_state() -> None:
    replays = lr.keys_to_replay([letter('{"id": 1}', 3), letter('{"id": 2}', 9)], [])
    assert set(lr.unapplied(replays, 8)) == {'{"id": 2}'} and "version 9" in lr.unapplied(replays, 8)['{"id": 2}']
    assert lr.unapplied(replays, 9) == {}


# -- keys read back from their letters -----------------------------------------------------------------

def test_a_key_of_several_columns_with_a_null_reads_back_as_the_values_it_was_made_of() -> None:
    values = {"region": None, "id": 7, "price": Decimal("12345678901234567890.123456"),
              "at": datetime(2026, 3, 29, 2, 30, 0, 123456), "day": date(1, 1, 1), "tag": bytearray(b"\x00\xff"),
              "ratio": float("nan"), "name": "Zoë \"quoted\""}
    text = json_value_text(values)
    columns = [("region", "string"), ("id", "bigint"), ("price", "decimal(38,6)"), ("at", "timestamp"),
               ("day", "date"), ("tag", "binary"), ("ratio", "double"), ("name", "string")]
    back = lr.key_values(text, columns)
    assert back[:6] == (None, 7, Decimal("12345678901234567890.123456"), datetime(2026, 3, 29, 2, 30, 0, 123456),
                        date(1, 1, 1), bytearray(b"\x00\xff"))
    assert back[6] != back[6] and back[7] == 'Zoë "quoted"'
    assert lr.key_values('{"id": 0.1}', [("id", "double")]) == (0.1,)


@pytest.mark.parametrize("text, columns, said", [
    ('{"id": 1}', [("id", "bigint"), ("region", "string")], "lacks the key column(s) region"),
    ('{"id": "x"}', [("id", "bigint")], "key column id (bigint) holds \"x\""),
    ('{"id": 1.5}', [("id", "int")], "key column id (int)"),
    ('{"id": [1]}', [("id", "array<int>")], "of type array<int>"),
    ("not json", [("id", "bigint")], "is not JSON"),
    ('[1]', [("id", "bigint")], "not an object"),
])
def test_a_key_that_cannot_be_read_back_says_which_column_and_why(text: str, columns: list[tuple[str, str]],
                                                                   said: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        lr.key_values(text, columns)
    assert said in str(err.value)


# -- the state at V when the snapshot at V is gone ----------------------------------------------------

@pytest.mark.parametrize("first, in_latest, source", [
    (None, True, lr.FROM_LATEST),          # no change since V: the latest row is the row at V
    (None, False, lr.ABSENT),              # no change since V and no row now: none at V
    ("update_preimage", True, lr.FROM_FIRST_CHANGE),   # updated after V: its before-image is the row at V
    ("delete", False, lr.FROM_FIRST_CHANGE),           # deleted after V (or deleted and re-inserted in one commit)
    ("insert", True, lr.ABSENT),                       # inserted after V: no row at V
])
def test_the_first_change_after_the_applied_version_tells_the_state_at_it(first: str | None, in_latest: bool,
                                                                          source: str) -> None:
    assert lr.state_source(first, in_latest) == source


def test_a_post_image_without_its_before_image_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="cannot be told"):
        lr.state_source("update_postimage", True)


def test_the_first_change_ranks_before_images_first_inside_a_version() -> None:
    plan = plan_merge([Column("id", "bigint", False), Column("amount", "decimal(10,2)")], ["id"])
    expr = lr.first_change_expr(plan)
    assert expr.startswith("min_by(struct(`id` AS `id`, `amount` AS `amount`, `_change_type` AS `__lm_op`)")
    assert "WHEN 'update_preimage' THEN 0 WHEN 'delete' THEN 0 WHEN 'insert' THEN 1" in expr


# -- what becomes of each letter -----------------------------------------------------------------------

def test_each_letter_says_what_became_of_it() -> None:
    [one] = lr.keys_to_replay([letter('{"id": 1}', 3)], [letter('{"id": 1}', 5)])
    [upserted, _] = lr.written(one, True, 8, "dst.sales.orders")
    assert upserted.status == REPLAYED and "row of version 8 written to dst.sales.orders" in upserted.resolution
    assert "one write for the key's 2 letters" in upserted.resolution
    [deleted, _] = lr.written(one, False, 8, "dst.sales.orders", repeated=True)
    assert "no row at source version 8: deleted" in deleted.resolution and "Delta skipped the repeat" in deleted.resolution
    [again, _] = lr.refused(one, "CHECK positive violated by amount -1")
    assert (again.status, again.reason) == (PENDING, "the replica refused it: CHECK positive violated by amount -1")
    [waiting, _] = lr.not_replayed(one, "the table is not streaming")
    assert waiting.status == PENDING and waiting.reason is None and "not streaming" in waiting.resolution
    assert [r.status for r in lr.skipped([letter('{"id": 2}', 4)])] == [SKIPPED]


# -- the pipeline's desk over the dead-letter table's twin ---------------------------------------------

class Table:
    """A change-feed table as the desk sees it: its letters' label and its batch lock."""

    def __init__(self, label: str, target: "ReplayTarget | str") -> None:
        self.letter_label = label
        self.target = target
        self.lock = threading.Lock()

    @contextmanager
    def between_batches(self) -> Iterator["ReplayTarget | str"]:
        with self.lock:
            yield self.target


def target(label: str = "src.sales.orders", through: int = 8) -> ReplayTarget:
    plan = plan_merge([Column("id", "bigint", False), Column("amount", "decimal(10,2)")], ["id"])
    return ReplayTarget(label, TableLocation(TableName.parse(label)), TableLocation(TableName("dst", "sales", "orders")),
                        plan, through, "lakemirror/p/orders/e0")


def desk_with(tables: dict[str, Table], store: InMemoryFeedLetters, calls: list[Any]) -> FeedLetterDesk:
    def replay(session: Any, t: ReplayTarget, replays: Sequence[lr.KeyReplay]) -> list[Resolution]:
        held = [name for name, table in tables.items() if table.lock.locked()]
        calls.append((t.label, [r.ids for r in replays], held))
        return [x for r in replays for x in lr.written(r, True, t.applied_through, "dst.sales.orders")]
    return FeedLetterDesk(store, lambda: tables, lambda: "session", clock=lambda: 1_000.0, replay=replay)


def record(desk: FeedLetterDesk, store: InMemoryFeedLetters, *letters: FeedLetter, batch: int = 1) -> None:
    store.append(None, letters, TxnId(f"lakemirror/p/x/e0/dead-letters/{batch}", batch), 1_000.0)
    desk.recorded(letters)


def test_the_desk_counts_lists_skips_and_replays_between_the_tables_batches() -> None:
    store, calls = InMemoryFeedLetters(), []
    tables = {"orders": Table("src.sales.orders", target()), "customers": Table("src.sales.customers",
                                                                                 "table customers is not streaming")}
    desk = desk_with(tables, store, calls)
    o1 = FeedLetter("src.sales.orders", '{"id": 1}', 3, "update_postimage", "{}", "CHECK")
    o1b = FeedLetter("src.sales.orders", '{"id": 1}', 6, "update_postimage", "{}", "CHECK")
    o2 = FeedLetter("src.sales.orders", '{"id": 2}', 4, "insert", "{}", "CHECK")
    c1 = FeedLetter("src.sales.customers", '{"id": 9}', 5, "insert", "{}", "NOT NULL")
    record(desk, store, o1, o2, c1)
    record(desk, store, o1, o2, c1)          # the batch replayed after a crash: counted once
    record(desk, store, o1b, batch=2)
    assert desk.pending() == {"orders": 3, "customers": 1} and desk.recorded_counts() == {"orders": 3, "customers": 1}
    listed = desk.dead_letters(table="orders")
    assert [x["id"] for x in listed] == [o1.id, o1b.id, o2.id] and listed[0]["source"] == "src.sales.orders"
    assert listed[0]["table"] == "orders" and [x["id"] for x in desk.dead_letters(table="src.sales.customers")] == [c1.id]

    report = desk.resolve_now("skip", [o2.id, "nope"])
    assert [(r.id, r.status) for r in report.resolutions] == [(o2.id, SKIPPED)] and report.unknown == ("nope",)
    assert store.rows[o2.id].status == SKIPPED and desk.pending() == {"orders": 2, "customers": 1}

    report = desk.resolve_now("replay", None)          # every pending letter
    statuses = {r.id: r.status for r in report.resolutions}
    assert statuses == {o1.id: REPLAYED, o1b.id: REPLAYED, c1.id: PENDING}
    assert calls == [("src.sales.orders", [(o1.id, o1b.id)], ["orders"])]   # one write for the key, under its lock
    assert "not streaming" in (store.rows[c1.id].resolution or "") and store.rows[c1.id].reason == "NOT NULL"
    assert desk.pending() == {"customers": 1}
    assert [x["id"] for x in desk.dead_letters(status=REPLAYED)] == [o1.id, o1b.id]
    desk.close()


def test_a_restarted_desk_counts_what_the_table_holds() -> None:
    store = InMemoryFeedLetters()
    first = desk_with({}, store, [])
    record(first, store, FeedLetter("src.sales.orders", '{"id": 1}', 3, "insert", "{}", "CHECK"),
           FeedLetter("src.sales.orders", '{"id": 2}', 3, "insert", "{}", "CHECK"))
    first.resolve_now("skip", [next(iter(store.rows))])
    restarted = desk_with({"orders": Table("src.sales.orders", target())}, store, [])
    assert restarted.pending() == {}
    restarted.seed()
    restarted.close()                                  # waits for the seed on the desk's thread
    assert restarted.pending() == {"orders": 1} and restarted.recorded_counts() == {}


def test_a_replay_of_a_table_that_left_the_pipeline_says_so_and_keeps_the_letter() -> None:
    store = InMemoryFeedLetters()
    desk = desk_with({}, store, [])
    gone = FeedLetter("src.sales.old", '{"id": 1}', 3, "insert", "{}", "CHECK")
    record(desk, store, gone)
    [r] = desk.resolve_now("replay", [gone.id]).resolutions
    assert r.status == PENDING and "not a running table of this pipeline" in r.resolution
    assert desk.pending() == {"src.sales.old": 1}
    with pytest.raises(ValueError, match="unknown verb"):
        desk.resolve_dead_letters("forget", None)


# -- a table's side: its status, its batch lock, the version a replay writes --------------------------

def test_a_table_shows_its_pending_letters_and_lends_its_batch_lock_to_a_replay(tmp_path: Any) -> None:
    from lakemirror.checkpoints.state import TableProgress
    from lakemirror.supervisor.change_feed.prepare import Prepared
    from tests.unit.runner_fakes import NoSpark, table_runner

    store = InMemoryFeedLetters()
    desk = desk_with({}, store, [])
    from dataclasses import replace

    runner = table_runner("orders", context={"feed_letters": desk})
    runner.ctx.spec = replace(runner.ctx.spec, checkpoint_root=str(tmp_path))
    assert runner.letter_label == "src.s.orders" and runner.describe() is None
    record(desk, store, FeedLetter("src.s.orders", '{"id": 1}', 3, "insert", "{}", "CHECK"))
    desk.tables = lambda: {"orders": runner}
    assert runner.describe() == {"dead_letters_pending": 1}

    with runner.between_batches() as why:                       # not streaming yet: no replay, said why
        assert runner.apply_batch.lock.locked() and isinstance(why, str) and "not streaming" in why
    plan = plan_merge([Column("id", "bigint", False)], ["id"])
    runner.prepared = Prepared(None, plan, TableProgress(epoch=2, bootstrap_version=5, bootstrapped=True))  # type: ignore[arg-type]
    runner.live.applied_through = 8
    runner.live.query = object()                                # Spark Connect (no JVM of its own), always-on
    with runner.between_batches() as why:                       # query: its batches cannot be held off
        assert isinstance(why, str) and "Spark Connect" in why and "apply_workers" in why

    class Gate:                                                 # with turns: a gate of files no batch passes
        applying = False                                        # without a turn, which the held lock withholds

    runner.turns.gate = Gate()  # type: ignore[assignment]
    with runner.between_batches() as target:
        assert runner.turns.lock.locked() and runner.apply_batch.lock.locked()
        assert isinstance(target, ReplayTarget) and target.applied_through == 8
    runner.turns.gate, runner.live.query = None, None

    class OwnJvm(NoSpark):
        _jvm = object()

    runner._session = OwnJvm()  # type: ignore[assignment]
    with runner.between_batches() as target:
        assert isinstance(target, ReplayTarget) and target.applied_through == 8
        assert (target.app_id, target.label, str(target.replica.name)) == (f"lakemirror/p/{runner.slug}/e2",
                                                                          "src.s.orders", "dst.s.orders")
    # the last committed batch ended inside version 9 (a rate limit split it): some of 9 is applied
    checkpoint = tmp_path / "p" / runner.slug / "e2"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "offsets" / "4").write_text('v1\n{}\n{"sourceVersion":1,"reservoirVersion":9,"index":3}\n')
    (checkpoint / "commits" / "4").write_text("v1\n{}\n")
    with runner.between_batches() as target:
        assert isinstance(target, ReplayTarget) and target.applied_through == 9
    runner.live.draining = True                                 # paused (halted): no batch runs, a replay may
    with runner.between_batches() as target:
        assert isinstance(target, ReplayTarget) and target.applied_through == 9
    runner.resync("resync requested by an operator")            # the replica is rebuilt: nothing to replay into
    with runner.between_batches() as why:
        assert isinstance(why, str) and "not streaming" in why


def test_the_newest_version_a_committed_batch_touched(tmp_path: Any) -> None:
    from lakemirror.supervisor.offline.replica_transactions import touched_through

    assert touched_through(str(tmp_path / "none")) is None
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, offset in ((0, '{"reservoirVersion":5,"index":-1}'), (1, '{"reservoirVersion":7,"index":0}'),
                          (2, '{"reservoirVersion":9,"index":-1}')):
        (tmp_path / "offsets" / str(batch)).write_text(f"v1\n{{}}\n{offset}\n")
    assert touched_through(str(tmp_path)) is None                        # nothing committed
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    assert touched_through(str(tmp_path)) == 4                           # ended before version 5
    (tmp_path / "commits" / "1").write_text("v1\n{}\n")
    assert touched_through(str(tmp_path)) == 7                           # ended inside version 7 (planned, not committed: 2)


def test_status_and_metrics_show_the_pending_letters_per_table() -> None:
    from prometheus_client import CollectorRegistry

    from lakemirror.daemon.metrics import Metrics
    from lakemirror.daemon.status import render_feed_letters

    rows = [{"table": "customers", "detail": {"apply": {"path": "merge"}}},
            {"table": "orders", "detail": {"dead_letters_pending": 2, "apply": {"path": "merge"}}}]
    assert render_feed_letters(rows).startswith("dead letters pending: orders 2 (`lakemirror dead-letters CONFIG`")
    assert render_feed_letters(rows[:1]) == ""
    registry = CollectorRegistry()
    metrics = Metrics("p", registry)
    pending = {"orders": 2}
    metrics.watch_feed_letters(lambda: pending, lambda: {"orders": 3})
    value = registry.get_sample_value
    assert value("lakemirror_feed_dead_letters_pending", {"pipeline": "p", "table": "orders"}) == 2
    assert value("lakemirror_feed_dead_letters_total", {"pipeline": "p", "table": "orders"}) == 3
    pending.clear()                                                        # all resolved: 0, not gone
    assert value("lakemirror_feed_dead_letters_pending", {"pipeline": "p", "table": "orders"}) == 0


def test_a_letters_write_that_loses_a_concurrent_commit_is_tried_again_and_nothing_else_is() -> None:
    from lakemirror.sinks.merge.feed_letters import retry_conflicts

    tries: list[int] = []

    def conflicted() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException: Files were added by a "
                               "concurrent update")
        return "written"

    assert retry_conflicts(conflicted, "letters", sleep=lambda s: None) == "written" and len(tries) == 3
    with pytest.raises(OSError):
        retry_conflicts(lambda: (_ for _ in ()).throw(OSError("disk full")), "letters", sleep=lambda s: None)
    tries.clear()
    with pytest.raises(RuntimeError, match="ConcurrentAppendException"):
        retry_conflicts(conflicted, "letters", attempts=2, sleep=lambda s: None)


def test_the_daemon_serves_its_change_feed_letters_or_says_where_they_are(tmp_path: Any) -> None:
    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.dead_letter_api import NoFeedLetters
    from lakemirror.daemon.settings import load_settings

    base = {"source_catalog": "app", "destination_catalog": "lake", "schema_name": "sales",
            "checkpoint_volume": str(tmp_path / "cp"), "runtime": {"mode": "local", "warehouse": str(tmp_path / "wh")}}
    desk = DaemonContext(load_settings(None, base)).feed_letter_desk()
    assert isinstance(desk, FeedLetterDesk)
    assert str(desk.store.location.name) == "lake.sales._lakemirror_dead_letters"  # type: ignore[attr-defined]
    events = DaemonContext(load_settings(None, {**base, "source": {"kind": "files", "path": str(tmp_path),
                                                                   "name": "shop"}})).feed_letter_desk()
    assert isinstance(events, NoFeedLetters) and events.code == 404 and "/api/events/shop/dead-letters" in events.error
    postgres = DaemonContext(load_settings(None, {**base, "destination": {
        "kind": "postgres", "host": "h", "database": "d", "user": "u", "schema": "mirror"}})).feed_letter_desk()
    assert isinstance(postgres, NoFeedLetters) and postgres.code == 409 and "schema mirror" in postgres.error


def test_a_replay_over_connect_waits_for_the_servers_batch_in_flight_and_says_when_it_cannot() -> None:
    from lakemirror.supervisor.change_feed.dead_letters import server_batches_held_off

    class Gate:
        def __init__(self, applying_for: int) -> None:
            self.looks = applying_for

        @property
        def applying(self) -> bool:
            self.looks -= 1
            return self.looks >= 0

    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert server_batches_held_off(Gate(3), True, wait=1.0, clock=lambda: now[0], sleep=sleep) is None
    assert now[0] > 0  # it waited for the batch in flight to end
    stuck = server_batches_held_off(Gate(10**6), True, wait=1.0, clock=lambda: now[0], sleep=sleep)
    assert stuck is not None and "applying on the Spark Connect server" in stuck and "again" in stuck
    assert server_batches_held_off(None, False) is None  # no query runs: nothing to hold off
    always_on = server_batches_held_off(None, True)
    assert always_on is not None and "apply_workers" in always_on and "skip" in always_on
