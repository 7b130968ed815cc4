"""Event-source changes (Kafka / Debezium, JSON-lines files) into PostgreSQL replicas, exactly.

The change feed's Postgres sink (:mod:`.executor`) orders changes by one bigint; an event's order is
five numbers (:class:`~lakemirror.sources.change_event.Position` phase, major, minor, micro, then the
operation's rank). The replica keeps them as ``_lakemirror_position bigint[]``, which Postgres
compares element by element, so the same guarded statements (:mod:`.statements`) apply: a change
writes a row only if its order is strictly newer than the row's and than the key's tombstone.

Exactly once without a progress row: every flush is one transaction that folds its events per key
(:func:`lakemirror.sinks.events.guard_plan.plan_batch`), COPYs the winners into staging and applies them
under the guard. A flush applied again (Spark replays a batch after a crash; Real-Time Mode's
``foreach`` is at-least-once; a connection lost during COMMIT) changes nothing, because every row
already holds an order at least as new. Dead letters are keyed by where the message came from
(origin, partition, offset), so a replayed poison message is kept once.

Per table, one writer at a time: a transaction-scoped advisory lock on the table serialises the
flushes of concurrent ``foreach`` tasks (Kafka partitions), so a delete and an older upsert of one
key committed side by side cannot resurrect the key, and the first flush creates the table once.

Tables are created on first use with types inferred from the events (:mod:`lakemirror.sinks.events.event_rows`:
bigint, double precision, boolean, text); new columns are added (``allow_evolution``); a value that
does not fit its column, a NULL key or a row Postgres refuses goes to ``lakemirror_event_dead_letters``
with the reason, and the stream goes on. A truncate deletes every older row and leaves a floor in
``lakemirror_event_floors`` below which later-arriving changes are dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import backoff
import psycopg
from psycopg import sql

from lakemirror.errors import SchemaIncompatible
from lakemirror.schema import Column
from lakemirror.sinks.events.dead_letters import PENDING, StoredLetter, letter_id
from lakemirror.sinks.events.event_rows import convert_row, infer_type
from lakemirror.sinks.events.guard_plan import TablePlan, plan_batch
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.postgres import statements as q
from lakemirror.sinks.postgres.executor import (ROW_ERRORS, Connector, PostgresTarget, _backend_pid,
                                                _not_worth_retrying, _reason)
from lakemirror.sinks.postgres.plan import POSITION, ReplicaTable, derived_name
from lakemirror.sinks.postgres.waits import ServerCalls
from lakemirror.sources.change_event import DELETE, ChangeEvent, Decoded, Order
from lakemirror.sources.event_stream import DecodedBatch, RawEvent, decode_batch

log = logging.getLogger(__name__)

EVENT_POSITION_TYPE = "bigint[]"
FLOORS_TABLE = "lakemirror_event_floors"
EVENT_DEAD_LETTERS = "lakemirror_event_dead_letters"
#: Postgres types read back from the catalog, as the Spark types :func:`convert` checks values against.
_SPARK_OF = {"bigint": "bigint", "integer": "int", "smallint": "smallint", "double precision": "double",
             "real": "double", "boolean": "boolean", "text": "string"}


@dataclass(frozen=True)
class Letter:
    """A message the replicas cannot take, with the reason, kept once per source coordinate."""

    raw: RawEvent
    reason: str
    table: str | None = None


@dataclass
class FlushResult:
    """What one flush did (one transaction)."""

    events: int = 0
    skipped: int = 0
    dead_letters: int = 0
    stale: int = 0
    counts: ApplyCounts = field(default_factory=ApplyCounts)
    seconds: float = 0.0
    tables: dict[str, ApplyCounts] = field(default_factory=dict)
    stale_by_table: dict[str, int] = field(default_factory=dict)
    letters: list[Letter] = field(default_factory=list)    # the flush's dead letters (recorded once each)


def create_floors(schema: str) -> sql.Composed:
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (table_name text PRIMARY KEY, {} bigint[] NOT NULL)").format(
        sql.Identifier(schema, FLOORS_TABLE), sql.Identifier(POSITION))


def create_event_dead_letters(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (pipeline_id text NOT NULL, source text NOT NULL, origin text NOT NULL, "
        "kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL, table_name text, reason text NOT NULL, "
        "message_key text, message_value text, failed_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (pipeline_id, source, origin, kafka_partition, kafka_offset))").format(
        sql.Identifier(schema, EVENT_DEAD_LETTERS))


def _clean(text: str | None) -> str | None:
    return None if text is None else text.replace("\x00", "\ufffd")


class PostgresEventSink:
    """Applies flushes of raw events to the Postgres replicas of one event source.

    Holds one connection, opened on first use and reopened after a loss (each flush is retried
    whole with backoff for up to the target's ``retry_seconds``: it is idempotent). ``close()``
    ends it. Used on the driver by the micro-batch query and on executors by the ``foreach``
    writer of Real-Time Mode (:mod:`.foreach`)."""

    def __init__(self, target: PostgresTarget, pipeline_id: str, source: str, decode: Callable[[RawEvent], Decoded],
                 *, tables: Sequence[str] | None = None, allow_evolution: bool = True,
                 connect: Callable[..., psycopg.Connection[Any]] = psycopg.connect,
                 clock: Callable[[], float] = time.monotonic, calls: ServerCalls | None = None) -> None:
        self.target = target
        self.pipeline_id = pipeline_id
        self.source = source
        self.decode = decode
        self.tables = tuple(tables) if tables is not None else None
        self.allow_evolution = allow_evolution
        self._connector = Connector(target, connect)
        self._connect = connect
        self._clock = clock
        self._conn: psycopg.Connection[Any] | None = None
        self._ready = False
        #: Where the flush in flight is recorded, for the supervisor to see its waits (:mod:`.waits`).
        self.calls = calls if calls is not None else ServerCalls(
            source, retry_seconds=target.retry_seconds, statement_timeout_seconds=target.statement_timeout_seconds)

    # -- connection -----------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(**self.target.connect_kwargs())
            self._ready = False
        if not self._ready:
            with self._conn.transaction():
                # Concurrent foreach tasks set up at once: one at a time (CREATE … IF NOT EXISTS races).
                self._conn.execute(sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(
                    sql.Literal(f"lakemirror:{self.target.schema}")))
                self._conn.execute(q.ensure_schema(self.target.schema))
                self._conn.execute(create_floors(self.target.schema))
                self._conn.execute(create_event_dead_letters(self.target.schema))
            self._ready = True
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    # -- a flush ----------------------------------------------------------------------------------

    def apply(self, raws: Iterable[RawEvent]) -> FlushResult:
        """Decode ``raws``, fold them per key and apply them in one transaction (retried whole)."""
        started = self._clock()
        return self.apply_decoded(decode_batch(raws, self.decode, self.tables), started)

    def apply_decoded(self, decoded: DecodedBatch, started: float | None = None) -> FlushResult:
        """Fold ``decoded`` per key and apply it in one transaction (retried whole); ``started``: when
        the flush began (default: now), for its duration."""
        started = self._clock() if started is None else started
        result = FlushResult()
        result.events, result.skipped = decoded.events, decoded.skipped
        letters = [Letter(raw, letter.reason, letter.table) for raw, letter in decoded.dead_letters]
        plans, refused = plan_batch(decoded.changes)
        letters += [Letter(decoded.raw_of(e), reason, e.table) for e, reason in refused]

        calls = self.calls

        def note(details: Any) -> None:
            self.close()
            exc = details.get("exception")
            log.warning("%s: Postgres connection lost (%s); retry %d in %.1fs", self.source,
                        str(exc).strip().splitlines()[0], details["tries"], details["wait"])
            calls.retrying(self._connector.unreachable(exc) if exc is not None else "the connection was lost")

        @backoff.on_exception(backoff.expo, psycopg.OperationalError, max_time=self.target.retry_seconds,
                              max_value=5, giveup=_not_worth_retrying, on_backoff=note, jitter=backoff.full_jitter)
        def attempt() -> tuple[dict[str, ApplyCounts], dict[str, int], list[Letter]]:
            conn = self._connection()
            calls.connected(_backend_pid(conn))
            tables: dict[str, ApplyCounts] = {}
            stale: dict[str, int] = {}
            dead = list(letters)
            with conn.transaction():
                for table, plan in sorted(plans.items()):
                    tables[table], stale[table], table_dead = self._apply_table(conn, plan, decoded.raw_of)
                    dead += table_dead
                self._dead_letters(conn, dead)
            return tables, stale, dead

        calls.begin()
        try:
            tables, stale, dead = attempt()
        except (psycopg.Error, OSError) as exc:
            # Translated here, where it happens: on an executor (Real-Time Mode) only the message
            # reaches the driver, inside Spark's report of the failed task.
            self.close()
            raise self._connector.translate(exc, self.source) from exc
        finally:
            calls.end()
        result.tables, result.stale_by_table, result.letters = tables, stale, dead
        result.stale, result.dead_letters = sum(stale.values()), len(dead)
        result.counts = ApplyCounts(sum(c.inserted for c in tables.values()), sum(c.updated for c in tables.values()),
                                    sum(c.deleted for c in tables.values()))
        result.seconds = self._clock() - started
        return result

    def _replica(self, conn: psycopg.Connection[Any], plan: TablePlan) -> tuple[ReplicaTable, bool]:
        """The table's replica, created or widened for the plan's columns (under the table's lock)."""
        schema, name = self.target.schema, plan.table
        have = [(str(n), str(t)) for n, t in conn.execute(q.replica_columns(
            ReplicaTable(schema, name, ("k",), (Column("k", "string"),)))).fetchall()]
        existing = {n: _SPARK_OF.get(t, "string") for n, t in have if n != POSITION}

        def inferred(column: str) -> str:
            if column in plan.key_columns:
                i = plan.key_columns.index(column)
                return infer_type(w.keys[i][1] for w in plan.winners)
            return infer_type(w.columns.get(column) for w in plan.upserts)

        wanted = [c for c in plan.column_names() if c != POSITION]
        columns = [Column(n, t) for n, t in existing.items()]
        added = [Column(c, inferred(c)) for c in wanted if c not in existing]
        if existing and added and not self.allow_evolution:
            raise SchemaIncompatible(f"{name}: events carry new columns {[c.name for c in added]} and "
                                     f"allow_schema_evolution is false", table=name)
        keys = plan.key_columns
        table = ReplicaTable(schema, name, keys, tuple(columns + added), position_type=EVENT_POSITION_TYPE)
        if not existing:
            conn.execute(q.create_replica(table, name, derived_name(name, "__lm_pk")))
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, {} bigint[] NOT NULL, deleted_at timestamptz "
                                 "NOT NULL DEFAULT now(), PRIMARY KEY ({}))").format(
                sql.Identifier(schema, table.tombstones),
                sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))
                                   for n, t in table.pg_columns if n in keys),
                sql.Identifier(POSITION), sql.SQL(", ").join(sql.Identifier(k) for k in keys)))
        elif added:
            conn.execute(q.add_columns(table, tuple(c.name for c in added)))
            log.info("%s: added columns to the Postgres replica: %s", name, [c.name for c in added])
        return table, not existing

    def _apply_table(self, conn: psycopg.Connection[Any], plan: TablePlan,
                     raw_of: Callable[[ChangeEvent], RawEvent]) -> tuple[ApplyCounts, int, list[Letter]]:
        schema = self.target.schema
        conn.execute(sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(
            sql.Literal(f"lakemirror:{schema}.{plan.table}")))
        table, _ = self._replica(conn, plan)
        floors = sql.Identifier(schema, FLOORS_TABLE)
        row = conn.execute(sql.SQL("SELECT {} FROM {} WHERE table_name = {}").format(
            sql.Identifier(POSITION), floors, sql.Literal(plan.table))).fetchone()
        floor: Order | None = tuple(row[0]) if row else None
        if plan.truncate is not None and (floor is None or plan.truncate > floor):
            floor = plan.truncate
            conn.execute(sql.SQL("DELETE FROM {} WHERE {} < {}::bigint[]").format(
                sql.Identifier(schema, table.name), sql.Identifier(POSITION), sql.Literal(list(floor))))
            conn.execute(sql.SQL("INSERT INTO {} (table_name, {}) VALUES ({}, {}::bigint[]) ON CONFLICT (table_name) "
                                 "DO UPDATE SET {} = EXCLUDED.{}").format(
                floors, sql.Identifier(POSITION), sql.Literal(plan.table), sql.Literal(list(floor)),
                sql.Identifier(POSITION), sql.Identifier(POSITION)))
        dead: list[Letter] = []
        staged: list[tuple[Any, ...]] = []
        stale = 0
        types = {c.name: c.type for c in table.columns}
        for winner in plan.winners:
            if floor is not None and winner.order() <= floor:
                stale += 1
                continue
            raw = raw_of(winner)
            nulls = [k for k, v in winner.keys if v is None]
            if nulls:
                dead.append(Letter(raw, f"NULL in key column(s) {', '.join(nulls)}: a Postgres primary key cannot "
                                        f"hold NULL", plan.table))
                continue
            values = {**dict(winner.columns), **dict(winner.keys)} if winner.op != DELETE else dict(winner.keys)
            try:
                typed = convert_row(values, types, table.column_names)
                row_values = tuple(typed[c] for c in table.column_names)
            except ValueError as exc:
                dead.append(Letter(raw, f"a value does not fit its column: {exc}", plan.table))
                continue
            staged.append((len(staged), DELETE if winner.op == DELETE else "upsert", list(winner.order()),
                           *(_clean(v) if isinstance(v, str) else v for v in row_values), raw))
        counts, refused = self._write(conn, table, staged) if staged else (ApplyCounts(), [])
        dead += refused
        # Winners that changed nothing: older than the row, its tombstone or the floor (replays, late events).
        stale += len(staged) - len(refused) - counts.inserted - counts.updated - counts.deleted
        return counts, stale, dead

    def _write(self, conn: psycopg.Connection[Any], table: ReplicaTable,
               staged: list[tuple[Any, ...]]) -> tuple[ApplyCounts, list[Letter]]:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(sql.Identifier(q.STAGING)))
        conn.execute(q.create_staging(table))
        try:
            with conn.transaction():  # a savepoint: a refused row sends the flush of this table row by row
                self._copy(conn, table, staged)
                conn.execute(q.analyze_staging())
                return self._statements(conn, table, None), []
        except ROW_ERRORS as exc:
            log.warning("%s: a row Postgres refuses (%s); applying the flush row by row", table.name,
                        str(exc).strip().splitlines()[0])
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(q.STAGING)))
        ins = upd = dele = 0
        refused: list[Letter] = []
        for row in staged:
            try:
                with conn.transaction():
                    self._copy(conn, table, [row])
                    c = self._statements(conn, table, row[0])
            except ROW_ERRORS as exc:
                refused.append(Letter(row[-1], _reason(exc), table.name))
                continue
            ins, upd, dele = ins + c.inserted, upd + c.updated, dele + c.deleted
        return ApplyCounts(ins, upd, dele), refused

    @staticmethod
    def _copy(conn: psycopg.Connection[Any], table: ReplicaTable, rows: Sequence[tuple[Any, ...]]) -> None:
        with conn.cursor().copy(q.copy_staging(table)) as copy:
            for row in rows:
                copy.write_row(row[:-1])

    @staticmethod
    def _statements(conn: psycopg.Connection[Any], table: ReplicaTable, row_no: int | None) -> ApplyCounts:
        deleted = conn.execute(q.guarded_delete(table, row_no)).fetchone()
        conn.execute(q.write_tombstones(table, row_no))
        written = conn.execute(q.guarded_upsert(table, row_no)).fetchone()
        conn.execute(q.clear_tombstones(table, row_no))
        assert deleted is not None and written is not None
        return ApplyCounts(int(written[0]), int(written[1]), int(deleted[0]))

    def _dead_letters(self, conn: psycopg.Connection[Any], letters: Sequence[Letter]) -> None:
        if not letters:
            return
        with conn.cursor() as cur:
            cur.executemany(sql.SQL(
                "INSERT INTO {} (pipeline_id, source, origin, kafka_partition, kafka_offset, table_name, reason, "
                "message_key, message_value) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
            ).format(sql.Identifier(self.target.schema, EVENT_DEAD_LETTERS)),
                [(self.pipeline_id, self.source, d.raw.origin, -1 if d.raw.partition is None else d.raw.partition,
                  d.raw.offset, d.table, d.reason, _clean(d.raw.key), _clean(d.raw.value)) for d in letters])

    def letters(self, messages: bool = True) -> list[StoredLetter]:
        """The dead letters this source has recorded, oldest first (every one pending: the operator's
        skip and replay are not offered here); without ``messages`` their keys and values are left out."""
        values = sql.SQL("message_key, message_value") if messages else sql.SQL("NULL, NULL")
        rows = self._connection().execute(sql.SQL(
            "SELECT origin, kafka_partition, kafka_offset, table_name, reason, failed_at, {} FROM {} "
            "WHERE pipeline_id = %s AND source = %s ORDER BY failed_at, origin, kafka_partition, kafka_offset").format(
            values, sql.Identifier(self.target.schema, EVENT_DEAD_LETTERS)), (self.pipeline_id, self.source)).fetchall()
        out = []
        for origin, partition, offset, table, reason, failed_at, key, value in rows:
            raw = RawEvent(value, key, origin, None if partition == -1 else int(partition), int(offset))
            out.append(StoredLetter(letter_id(raw.origin, raw.partition, raw.offset), raw, table, reason, PENDING,
                                    recorded_at=failed_at))
        return out

    def dead_letter_count(self) -> int:
        """The dead letters this source has recorded (a restarted daemon counts them on from here)."""
        row = self._connection().execute(sql.SQL("SELECT count(*) FROM {} WHERE pipeline_id = %s AND source = %s").format(
            sql.Identifier(self.target.schema, EVENT_DEAD_LETTERS)), (self.pipeline_id, self.source)).fetchone()
        return int(row[0]) if row else 0

    def purge(self, horizon_seconds: float) -> int:
        """Drop tombstones past the horizon in every replica this sink has written."""
        conn = self._connection()
        purged = 0
        rows = conn.execute(sql.SQL("SELECT tablename FROM pg_tables WHERE schemaname = {} AND tablename LIKE "
                                    "'%\\_\\_lm\\_tombstones'").format(sql.Literal(self.target.schema))).fetchall()
        for (name,) in rows:
            cur = conn.execute(sql.SQL("DELETE FROM {} WHERE deleted_at < now() - {} * interval '1 second'").format(
                sql.Identifier(self.target.schema, name), sql.Literal(float(horizon_seconds))))
            purged += cur.rowcount
        return purged

