"""The thin executor of the Postgres sink: runs the statements of :mod:`.statements` on a server.

Each call opens its own connection (within the target's connection cap), so a server restarted
between batches costs nothing but a reconnect. Inside a call, a lost connection is retried with
exponential backoff (the ``backoff`` package) for up to ``retry_seconds``; a batch's transaction is
idempotent (its progress row is claimed first and commits with the data), so a retry after a
commit whose answer was lost finds the progress row and reports a replay: nothing is lost or
applied twice. Vendor errors are translated here, once, into lakemirror's Transient/Terminal errors.

A row the server refuses (a constraint, a value out of range, a NUL character in text) fails the
batch's set-based transaction; the batch is then applied again row by row, each row under a
savepoint, and each refused row is stored in ``lakemirror_dead_letters`` with the server's reason,
in the same transaction: the stream goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

import backoff
import psycopg
from psycopg import errors as pg_errors

from lakemirror.errors import DestinationConflict, LakemirrorError, SchemaIncompatible, TerminalError, TransientError
from lakemirror.secrets import redact
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.postgres import statements as q
from lakemirror.sinks.postgres.plan import POSITION, BatchPlan, DeadRow, ReplicaTable, derived_name, diff_replica
from lakemirror.sinks.postgres.plan import plan_batch, snapshot_rows
from lakemirror.sinks.postgres.protocol import SinkResult, staged_row_json
from lakemirror.sinks.postgres.waits import LockWait, ServerCalls, lock_wait_query, waiting_sessions_query

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The ``application_name`` of every connection lakemirror opens (``pg_stat_activity`` shows it).
APPLICATION_NAME = "lakemirror"
#: Errors that concern a row's data, not the connection or the statement: the row is dead-lettered.
ROW_ERRORS = (pg_errors.DataError, pg_errors.IntegrityError)


@dataclass(frozen=True)
class PostgresTarget:
    """Where replicas go: one database and schema. Built from the configuration by the daemon."""

    host: str
    port: int
    database: str
    schema: str
    user: str
    password: str | None = field(default=None, repr=False)
    sslmode: str = "prefer"
    #: The cap on the server (executors' tasks and the daemon together; checked at config load).
    max_connections: int = 4
    #: The daemon's own connections at once (:class:`Connector`'s slots); None: ``max_connections``.
    pool_connections: int | None = None
    statement_timeout_seconds: float = 60.0
    connect_timeout_seconds: int = 10
    retry_seconds: float = 60.0
    tombstone_horizon_seconds: float = 7 * 86400.0

    def describe(self) -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/{self.database} (schema {self.schema})"

    def connect_kwargs(self) -> dict[str, Any]:
        timeout_ms = max(1, int(self.statement_timeout_seconds * 1000))
        return {"host": self.host, "port": self.port, "dbname": self.database, "user": self.user,
                "password": self.password, "sslmode": self.sslmode, "connect_timeout": self.connect_timeout_seconds,
                "application_name": APPLICATION_NAME, "autocommit": True,
                # Per connection: every statement of the sink is bounded; timestamps travel in UTC.
                "options": f"-c statement_timeout={timeout_ms} -c TimeZone=UTC"}


class Connector:
    """Opens connections to a target, at most ``pool_connections`` at a time (shared by all tables)."""

    def __init__(self, target: PostgresTarget,
                 connect: Callable[..., psycopg.Connection[Any]] = psycopg.connect) -> None:
        self.target = target
        self._connect = connect
        self._slots = threading.BoundedSemaphore(target.pool_connections or target.max_connections)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self._slots:
            conn = self._connect(**self.target.connect_kwargs())
            try:
                yield conn
            finally:
                conn.close()

    def _detail(self, exc: BaseException) -> str:
        known = (self.target.password,) if self.target.password else ()
        return redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, known)

    def unreachable(self, exc: BaseException) -> str:
        """Why a connection failed, and what to check (a wait's reason, a failure's message)."""
        return (f"cannot reach the server {self.target.describe()} ({self._detail(exc)}); check that it runs and "
                f"that destination.host, port and database are right")

    def translate(self, exc: BaseException, table: str) -> LakemirrorError:
        """A lakemirror error for a psycopg one, saying what to do (credentials redacted)."""
        if isinstance(exc, LakemirrorError):
            return exc
        detail = self._detail(exc)
        where = f"{table}: {self.target.describe()}"
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return TerminalError(f"{where}: permission denied ({detail}). Grant the user USAGE and CREATE on the "
                                 f"schema and ownership of lakemirror's tables in it.", table=table, code="permission")
        if isinstance(exc, pg_errors.QueryCanceled):
            return TransientError(f"{where}: a statement ran past statement_timeout_seconds="
                                  f"{self.target.statement_timeout_seconds:g} ({detail}); raise it or make batches "
                                  f"smaller (max_files_per_trigger).", table=table, code="postgres_timeout")
        if isinstance(exc, psycopg.OperationalError):
            if "database" in detail and "does not exist" in detail:
                return TerminalError(f"{where}: {detail}; check destination.database (the database must exist: "
                                     f"lakemirror creates schemas and tables, not databases).", table=table,
                                     code="postgres_login")
            if refused_login(exc):
                return TerminalError(f"{where}: the server refused the login ({detail}); check destination.user and "
                                     f"the password it is given (destination.password, password_env or "
                                     f"password_file).", table=table, code="postgres_login")
            return TransientError(f"{table}: {self.unreachable(exc)}. Retried with backoff.", table=table,
                                  code="postgres_unavailable")
        return TerminalError(f"{where}: {type(exc).__name__}: {detail}", table=table, code="postgres_error")

    def check_server(self, application_name: str = APPLICATION_NAME) -> tuple[str | None, LockWait | None]:
        """Whether the server answers (None, or why it does not: :meth:`unreachable`), and a lock
        that one of lakemirror's sessions (``application_name``) waits for; (None, None) when no
        connection slot is free to ask. For writers out of the daemon's sight (Real-Time Mode's)."""
        if not self._slots.acquire(blocking=False):
            return None, None
        try:
            kwargs = {**self.target.connect_kwargs(), "connect_timeout": 2,
                      "options": "-c statement_timeout=2000 -c TimeZone=UTC"}
            try:
                conn = self._connect(**kwargs)
            except psycopg.Error as exc:
                return self.unreachable(exc), None
            with conn:
                pids = [int(r[0]) for r in conn.execute(waiting_sessions_query(application_name)).fetchall()]
                row = conn.execute(lock_wait_query(pids[0])).fetchone() if pids else None
        finally:
            self._slots.release()
        return None, (LockWait(row[0], tuple(str(h) for h in row[1] or ())) if row is not None else None)

    def lock_wait(self, pid: int) -> LockWait | None:
        """Whether server process ``pid`` waits for a lock, and who holds it (:mod:`.waits`); None
        when it does not, or when no connection slot is free to ask (a look-up never waits for one)."""
        if not self._slots.acquire(blocking=False):
            return None
        try:
            kwargs = {**self.target.connect_kwargs(), "connect_timeout": 2,
                      "options": "-c statement_timeout=2000 -c TimeZone=UTC"}
            with self._connect(**kwargs) as conn:
                row = conn.execute(lock_wait_query(pid)).fetchone()
        finally:
            self._slots.release()
        if row is None:
            return None
        return LockWait(row[0], tuple(str(h) for h in row[1] or ()))


def refused_login(exc: BaseException) -> bool:
    """The server refused the login: a wrong password, an unknown user, no pg_hba.conf entry."""
    text = str(exc)
    return ("authentication failed" in text or "no pg_hba.conf entry" in text or "no password supplied" in text
            or ("role" in text and "does not exist" in text))


def _not_worth_retrying(exc: Exception) -> bool:
    """A timeout or a refused login: retrying at once would fail the same way."""
    if isinstance(exc, pg_errors.QueryCanceled):
        return True
    return refused_login(exc) or "does not exist" in str(exc)


def _owner(comment: str | None) -> str | None:
    """The pipeline named in a replica's comment (set at bootstrap), or None."""
    try:
        mark = json.loads(comment or "")
    except ValueError:
        return None
    return mark.get(q.OWNER_MARK) if isinstance(mark, dict) else None


class PostgresReplica:
    """A replica table in Postgres (:class:`~.protocol.ReplicaSink`): COPY, then guarded SQL."""

    def __init__(self, connector: Connector, pipeline_id: str, table: ReplicaTable, *, label: str | None = None,
                 calls: ServerCalls | None = None,
                 fault: Callable[[str], None] = lambda point: None) -> None:
        self.connector = connector
        self.pipeline_id = pipeline_id
        self.table = table
        self.label = label or f"{table.schema}.{table.name}"
        #: Where the call in flight is recorded, for the supervisor to see its waits (:mod:`.waits`).
        self.calls = calls if calls is not None else ServerCalls(
            self.label, retry_seconds=connector.target.retry_seconds,
            statement_timeout_seconds=connector.target.statement_timeout_seconds)
        #: The crash-test hook (supervisor/change_feed/table_runner.py: FAULT_POINTS), called inside a batch's
        #: transaction at ``postgres_after_copy`` and ``postgres_before_commit``, and inside a
        #: refresh's after the swap, before its COMMIT (``postgres_refresh_swapped``); a no-op unless armed.
        self._fault = fault

    @property
    def target(self) -> PostgresTarget:
        return self.connector.target

    # -- the retry boundary ---------------------------------------------------------------------

    def _run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``work`` on a fresh connection; a lost connection retried with backoff; errors translated."""
        calls = self.calls

        def note(details: Any) -> None:
            exc = details.get("exception")
            log.warning("%s: Postgres connection lost (%s); retry %d in %.1fs", self.label,
                        str(exc).strip().splitlines()[0] if exc else "?", details["tries"], details["wait"])
            calls.retrying(self.connector.unreachable(exc) if exc is not None else "the connection was lost")

        @backoff.on_exception(backoff.expo, psycopg.OperationalError, max_time=self.target.retry_seconds,
                              max_value=5, giveup=_not_worth_retrying, on_backoff=note, jitter=backoff.full_jitter)
        def attempt() -> T:
            with self.connector.connection() as conn:
                calls.connected(_backend_pid(conn))
                return work(conn)

        calls.begin()
        try:
            return attempt()
        except (psycopg.Error, OSError) as exc:
            raise self.connector.translate(exc, self.label) from exc
        finally:
            calls.end()

    # -- ReplicaSink ----------------------------------------------------------------------------

    def prepare(self, allow_evolution: bool) -> bool:
        """Connect, create the schema and lakemirror's own tables, and follow the source's columns;
        True when columns were added to the replica."""
        t = self.table

        def work(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                conn.execute(q.ensure_schema(t.schema))
                conn.execute(q.create_progress(t.schema))
                conn.execute(q.create_dead_letters(t.schema))
            have = [(str(n), str(ty)) for n, ty in conn.execute(q.replica_columns(t)).fetchall()]
            if not have:
                return False  # not bootstrapped yet
            diff = diff_replica(t, have)
            if diff.is_empty:
                return False
            if not diff.is_additive:
                raise SchemaIncompatible(
                    f"{self.label}: the Postgres replica cannot follow the source schema ({diff.describe()}). "
                    f"Resync the table to rebuild the replica, or revert the change on the source.", table=self.label)
            if not allow_evolution:
                raise SchemaIncompatible(
                    f"{self.label}: the source has new columns ({diff.describe()}) and allow_schema_evolution is "
                    f"false. Set allow_schema_evolution: true, or exclude the columns.", table=self.label)
            conn.execute(q.add_columns(t, tuple(c.name for c in diff.added)))
            log.info("%s: added columns to the Postgres replica: %s", self.label, diff.describe())
            return True

        return self._run(work)

    def _owner_mark(self, epoch: int) -> str:
        return json.dumps({q.OWNER_MARK: self.pipeline_id, "epoch": epoch}, sort_keys=True)

    def bootstrap(self, snapshot: "pa.Table", version: int, epoch: int) -> None:
        """Load ``snapshot`` into a new table, then swap it in for the replica, in one transaction,
        with fresh tombstones and the epoch's progress row (batch -1, ``last_version`` = ``version``)."""
        rows = self.refresh(snapshot, version, epoch, q.BOOTSTRAP_BATCH)
        log.info("%s: bootstrapped %d rows at source version %d (epoch %d)", self.label, rows, version, epoch)

    def refresh(self, snapshot: "pa.Table", version: int, epoch: int, batch_id: int) -> int:
        """Replace the replica with ``snapshot`` (the source at ``version``) atomically; the rows loaded.

        One transaction: claim the progress row ``(epoch, batch_id)`` (found already: this refresh
        committed before, nothing is done), COPY the rows into ``<table>__lm_loading``, build its
        primary key, then rename the replica to ``<table>__lm_old`` and the loaded table to the
        replica's name, with fresh tombstones, the ownership mark, the dead letters and the progress
        row's counts. Until the COMMIT readers see the old table whole (the COPY takes no lock on
        it; the renames take its ACCESS EXCLUSIVE lock only at the end); a reader waiting on that
        lock reads the new table once it is released. The old table is dropped after the COMMIT."""
        t = self.table
        rows, dead = snapshot_rows(snapshot, t, version)

        def work(conn: psycopg.Connection[Any]) -> int:
            conn.execute(q.drop_table(t.schema, t.retired))  # left by a refresh killed after its commit
            with conn.transaction():
                conn.execute(q.ensure_schema(t.schema))
                conn.execute(q.create_progress(t.schema))
                conn.execute(q.create_dead_letters(t.schema))
                found = conn.execute(q.table_comment(t.schema, t.name)).fetchall()
                if found and _owner(found[0][0]) != self.pipeline_id:
                    raise DestinationConflict(
                        f"{self.label}: the Postgres table {t.schema}.{t.name} already exists and was not created "
                        f"by pipeline {self.pipeline_id!r}; lakemirror writes only into tables it created: set "
                        f"destination.schema to another one", table=self.label)
                if conn.execute(q.claim_batch(t.schema, self.pipeline_id, t.name, epoch, batch_id,
                                              None, version)).fetchone() is None:
                    return 0  # committed before (a crash before its state was saved)
                loading_pk, pk = derived_name(t.name, "__lm_loading_pk"), derived_name(t.name, "__lm_pk")
                old_pk = derived_name(t.name, "__lm_old_pk")
                conn.execute(q.drop_table(t.schema, t.loading))
                conn.execute(q.create_loading(t, t.loading))
                with conn.cursor().copy(q.copy_into(t.schema, t.loading, [*t.column_names, POSITION])) as copy:
                    for row in rows:
                        copy.write_row(row)
                conn.execute(q.add_primary_key(t, t.loading, loading_pk))
                if found:
                    conn.execute(q.rename_table(t.schema, t.name, t.retired))
                    conn.execute(q.rename_constraint_of(t.schema, t.retired, pk, old_pk))
                conn.execute(q.rename_table(t.schema, t.loading, t.name))
                conn.execute(q.rename_constraint(t, loading_pk, pk))
                conn.execute(q.drop_table(t.schema, t.tombstones))
                conn.execute(q.create_tombstones(t))
                conn.execute(q.mark_owner(t, self._owner_mark(epoch)))
                self._dead_letters(conn, epoch, batch_id, dead)
                conn.execute(q.finish_batch(t.schema, self.pipeline_id, t.name, epoch, batch_id,
                                            len(rows), 0, 0, len(dead)))
                self._fault("postgres_refresh_swapped")
            conn.execute(q.drop_table(t.schema, t.retired))
            return len(rows)

        return self._run(work)

    def apply(self, changes: "pa.Table", epoch: int, batch_id: int) -> SinkResult:
        plan = plan_batch(changes, self.table)
        if plan.stats.rows_read == 0:
            return SinkResult(plan.stats, ApplyCounts(), replayed=False)

        def work(conn: psycopg.Connection[Any]) -> SinkResult:
            try:
                return self._apply(conn, plan, epoch, batch_id, careful=False)
            except ROW_ERRORS as exc:
                log.warning("%s: batch %d has a row Postgres refuses (%s); applying it row by row", self.label,
                            batch_id, str(exc).strip().splitlines()[0])
                return self._apply(conn, plan, epoch, batch_id, careful=True)

        return self._run(work)

    def last_applied(self, epoch: int) -> int | None:
        t = self.table

        def work(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(q.last_applied(t.schema, self.pipeline_id, t.name, epoch)).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return self._run(work)

    # -- one batch ------------------------------------------------------------------------------

    def _apply(self, conn: psycopg.Connection[Any], plan: BatchPlan, epoch: int, batch_id: int,
               careful: bool) -> SinkResult:
        t = self.table
        with conn.transaction():
            claimed = conn.execute(q.claim_batch(t.schema, self.pipeline_id, t.name, epoch, batch_id,
                                                 plan.first_version, plan.last_version)).fetchone()
            if claimed is None:
                row = conn.execute(q.batch_counts(t.schema, self.pipeline_id, t.name, epoch, batch_id)).fetchone()
                counts = ApplyCounts(*(int(v) for v in row)) if row else ApplyCounts()
                return SinkResult(plan.stats, counts, replayed=True)
            conn.execute(q.create_staging(t))
            dead = list(plan.dead)
            if careful:
                ins = upd = dele = 0
                for staged in plan.rows:
                    try:
                        with conn.transaction():  # a savepoint: a refused row rolls back alone
                            self._copy(conn, [staged])
                            i, u, d = self._statements(conn, staged.row_no)
                    except ROW_ERRORS as exc:
                        dead.append(DeadRow(staged.position // 2, staged.op, _reason(exc),
                                            staged_row_json(t, staged)))
                        continue
                    ins, upd, dele = ins + i, upd + u, dele + d
            else:
                self._copy(conn, plan.rows)
                self._fault("postgres_after_copy")
                conn.execute(q.analyze_staging())
                ins, upd, dele = self._statements(conn, None)
            self._dead_letters(conn, epoch, batch_id, dead)
            conn.execute(q.purge_tombstones(t, self.target.tombstone_horizon_seconds))
            conn.execute(q.finish_batch(t.schema, self.pipeline_id, t.name, epoch, batch_id, ins, upd, dele,
                                        len(dead)))
            self._fault("postgres_before_commit")
        if dead:
            log.warning("%s: batch %d: %d row(s) refused, kept in %s.%s", self.label, batch_id, len(dead),
                        t.schema, q.DEAD_LETTER_TABLE)
        return SinkResult(plan.stats, ApplyCounts(ins, upd, dele), replayed=False, dead=len(dead))

    def _copy(self, conn: psycopg.Connection[Any], rows: Any) -> None:
        with conn.cursor().copy(q.copy_staging(self.table)) as copy:
            for staged in rows:
                copy.write_row((staged.row_no, staged.op, staged.position, *staged.values))

    def _statements(self, conn: psycopg.Connection[Any], row_no: int | None) -> tuple[int, int, int]:
        t = self.table
        deleted = conn.execute(q.guarded_delete(t, row_no)).fetchone()
        conn.execute(q.write_tombstones(t, row_no))
        written = conn.execute(q.guarded_upsert(t, row_no)).fetchone()
        conn.execute(q.clear_tombstones(t, row_no))
        assert deleted is not None and written is not None
        return int(written[0]), int(written[1]), int(deleted[0])

    def _dead_letters(self, conn: psycopg.Connection[Any], epoch: int, batch_id: int, dead: list[DeadRow]) -> None:
        t = self.table
        for d in dead:
            conn.execute(q.dead_letter(t.schema, self.pipeline_id, t.name, epoch, batch_id, d.commit_version, d.op,
                                       d.reason, d.row_json))


def _backend_pid(conn: Any) -> int | None:
    """The server process of ``conn`` (None for a stand-in connection without one)."""
    try:
        return int(conn.info.backend_pid)
    except (AttributeError, TypeError, ValueError):
        return None


def _reason(exc: BaseException) -> str:
    """The server's reason for refusing a row: SQLSTATE, message and detail."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) or str(exc).strip().splitlines()[0]
    detail = getattr(diag, "message_detail", None)
    state = getattr(exc, "sqlstate", None)
    return " ".join(p for p in (f"[{state}]" if state else "", primary, f"({detail})" if detail else "") if p)
