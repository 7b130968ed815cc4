"""The SQL of the Postgres sink, composed with :mod:`psycopg.sql`. Pure: builds statements, runs none.

Identifiers go through ``sql.Identifier``, lakemirror's own values (pipeline id, table name,
epoch, batch id, horizon) through ``sql.Literal``, types from the fixed mapping of
:mod:`.types`. Row values never appear in a statement: they reach Postgres by ``COPY`` only.
Statements are executed without parameters, so a ``%`` inside a quoted identifier stays literal.

The apply of a batch (one transaction, :mod:`.executor`): claim the batch's progress row (a
replay finds it and stops), COPY the winners into a temporary staging table, then the guarded
delete, tombstones, guarded upsert, clearing superseded tombstones, and the progress row's counts.
"""

from __future__ import annotations

from psycopg import sql

from lakemirror.sinks.postgres.plan import POSITION, UPSERT, ReplicaTable
from lakemirror.sinks.merge.planner import DELETE

PROGRESS_TABLE = "lakemirror_progress"
DEAD_LETTER_TABLE = "lakemirror_dead_letters"
STAGING = "lakemirror_staging"
ROW_NO, OP, POS = "_lm_row", "_lm_op", "_lm_position"
#: The progress row of a bootstrap (its snapshot's version is ``last_version``).
BOOTSTRAP_BATCH = -1
OWNER_MARK = "lakemirror_pipeline"


def _ident(*parts: str) -> sql.Identifier:
    return sql.Identifier(*parts)


def _target(t: ReplicaTable) -> sql.Identifier:
    return _ident(t.schema, t.name)


def _tomb(t: ReplicaTable) -> sql.Identifier:
    return _ident(t.schema, t.tombstones)


def _list(names: tuple[str, ...] | list[str], prefix: str | None = None) -> sql.Composable:
    if prefix is None:
        return sql.SQL(", ").join(_ident(n) for n in names)
    return sql.SQL(", ").join(_ident(prefix, n) for n in names)


def _keys_equal(t: ReplicaTable, left: str, right: str) -> sql.Composable:
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(_ident(left, k), _ident(right, k)) for k in t.keys)


def _only_row(row_no: int | None) -> sql.Composable:
    return sql.SQL("") if row_no is None else sql.SQL(" AND s.{} = {}").format(_ident(ROW_NO), sql.Literal(row_no))


def _column_defs(t: ReplicaTable, types_only_for: tuple[str, ...] | None = None) -> list[sql.Composable]:
    return [sql.SQL("{} {}").format(_ident(name), sql.SQL(pg)) for name, pg in t.pg_columns
            if types_only_for is None or name in types_only_for]


# -- the pipeline's own tables --------------------------------------------------------------------

def ensure_schema(schema: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(_ident(schema))


def create_progress(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (pipeline_id text NOT NULL, table_name text NOT NULL, epoch integer NOT NULL, "
        "batch_id bigint NOT NULL, first_version bigint, last_version bigint, rows_inserted bigint, "
        "rows_updated bigint, rows_deleted bigint, rows_dead bigint, applied_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (pipeline_id, table_name, epoch, batch_id))").format(_ident(schema, PROGRESS_TABLE))


def create_dead_letters(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, pipeline_id text NOT NULL, "
        "table_name text NOT NULL, epoch integer NOT NULL, batch_id bigint NOT NULL, commit_version bigint, "
        "op text NOT NULL, reason text NOT NULL, row jsonb, failed_at timestamptz NOT NULL DEFAULT now())"
    ).format(_ident(schema, DEAD_LETTER_TABLE))


def claim_batch(schema: str, pipeline: str, table: str, epoch: int, batch_id: int,
                first_version: int | None, last_version: int | None) -> sql.Composed:
    """Insert the batch's progress row; it returns no row when the batch was committed before."""
    return sql.SQL(
        "INSERT INTO {} (pipeline_id, table_name, epoch, batch_id, first_version, last_version) "
        "VALUES ({}, {}, {}, {}, {}, {}) ON CONFLICT DO NOTHING RETURNING 1").format(
        _ident(schema, PROGRESS_TABLE), sql.Literal(pipeline), sql.Literal(table), sql.Literal(epoch),
        sql.Literal(batch_id), sql.Literal(first_version), sql.Literal(last_version))


def finish_batch(schema: str, pipeline: str, table: str, epoch: int, batch_id: int,
                 inserted: int, updated: int, deleted: int, dead: int) -> sql.Composed:
    return sql.SQL(
        "UPDATE {} SET rows_inserted = {}, rows_updated = {}, rows_deleted = {}, rows_dead = {} "
        "WHERE pipeline_id = {} AND table_name = {} AND epoch = {} AND batch_id = {}").format(
        _ident(schema, PROGRESS_TABLE), sql.Literal(inserted), sql.Literal(updated), sql.Literal(deleted),
        sql.Literal(dead), sql.Literal(pipeline), sql.Literal(table), sql.Literal(epoch), sql.Literal(batch_id))


def batch_counts(schema: str, pipeline: str, table: str, epoch: int, batch_id: int) -> sql.Composed:
    """The counts recorded by the commit that applied a batch first (for a replay's report)."""
    return sql.SQL(
        "SELECT coalesce(rows_inserted, 0), coalesce(rows_updated, 0), coalesce(rows_deleted, 0) FROM {} "
        "WHERE pipeline_id = {} AND table_name = {} AND epoch = {} AND batch_id = {}").format(
        _ident(schema, PROGRESS_TABLE), sql.Literal(pipeline), sql.Literal(table), sql.Literal(epoch),
        sql.Literal(batch_id))


def last_applied(schema: str, pipeline: str, table: str, epoch: int) -> sql.Composed:
    return sql.SQL(
        "SELECT max(last_version) FROM {} WHERE pipeline_id = {} AND table_name = {} AND epoch = {}").format(
        _ident(schema, PROGRESS_TABLE), sql.Literal(pipeline), sql.Literal(table), sql.Literal(epoch))


def dead_letter(schema: str, pipeline: str, table: str, epoch: int, batch_id: int, commit_version: int | None,
                op: str, reason: str, row_json: str) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {} (pipeline_id, table_name, epoch, batch_id, commit_version, op, reason, row) "
        "VALUES ({}, {}, {}, {}, {}, {}, {}, {}::jsonb)").format(
        _ident(schema, DEAD_LETTER_TABLE), sql.Literal(pipeline), sql.Literal(table), sql.Literal(epoch),
        sql.Literal(batch_id), sql.Literal(commit_version), sql.Literal(op), sql.Literal(reason),
        sql.Literal(row_json))


# -- the replica ----------------------------------------------------------------------------------

def create_replica(t: ReplicaTable, name: str, pk_name: str) -> sql.Composed:
    """The replica (or its loading twin ``name``): mapped columns, the position, the primary key."""
    return sql.SQL("CREATE TABLE {} ({}, {} {} NOT NULL, CONSTRAINT {} PRIMARY KEY ({}))").format(
        _ident(t.schema, name), sql.SQL(", ").join(_column_defs(t)), _ident(POSITION), sql.SQL(t.position_type),
        _ident(pk_name), _list(t.keys))


def create_loading(t: ReplicaTable, name: str) -> sql.Composed:
    """The table a snapshot is loaded into: the replica's columns, no index yet (the primary key is
    added after the COPY, one sorted build instead of an index insert per row)."""
    return sql.SQL("CREATE TABLE {} ({}, {} {} NOT NULL)").format(
        _ident(t.schema, name), sql.SQL(", ").join(_column_defs(t)), _ident(POSITION), sql.SQL(t.position_type))


def add_primary_key(t: ReplicaTable, name: str, pk_name: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
        _ident(t.schema, name), _ident(pk_name), _list(t.keys))


def rename_constraint_of(schema: str, table: str, name: str, to: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(_ident(schema, table), _ident(name),
                                                                       _ident(to))


def create_tombstones(t: ReplicaTable) -> sql.Composed:
    return sql.SQL("CREATE TABLE {} ({}, {} {} NOT NULL, deleted_at timestamptz NOT NULL DEFAULT now(), "
                   "PRIMARY KEY ({}))").format(
        _tomb(t), sql.SQL(", ").join(_column_defs(t, t.keys)), _ident(POSITION), sql.SQL(t.position_type),
        _list(t.keys))


def drop_table(schema: str, name: str) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(schema, name))


def rename_table(schema: str, name: str, to: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} RENAME TO {}").format(_ident(schema, name), _ident(to))


def rename_constraint(t: ReplicaTable, name: str, to: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(_target(t), _ident(name), _ident(to))


def copy_into(schema: str, name: str, columns: list[str]) -> sql.Composed:
    return sql.SQL("COPY {} ({}) FROM STDIN").format(_ident(schema, name), _list(columns))


def mark_owner(t: ReplicaTable, mark_json: str) -> sql.Composed:
    return sql.SQL("COMMENT ON TABLE {} IS {}").format(_target(t), sql.Literal(mark_json))


def table_comment(schema: str, name: str) -> sql.Composed:
    """One row (the table's comment, maybe NULL) when the table exists, none otherwise."""
    return sql.SQL("SELECT obj_description(c.oid, 'pg_class') FROM pg_class c JOIN pg_namespace n "
                   "ON n.oid = c.relnamespace WHERE n.nspname = {} AND c.relname = {} AND c.relkind IN ('r', 'p')"
                   ).format(sql.Literal(schema), sql.Literal(name))


def replica_columns(t: ReplicaTable) -> sql.Composed:
    """(name, ``format_type``) of the replica's columns, in order."""
    return sql.SQL("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                   "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "WHERE n.nspname = {} AND c.relname = {} AND a.attnum > 0 AND NOT a.attisdropped "
                   "ORDER BY a.attnum").format(sql.Literal(t.schema), sql.Literal(t.name))


def add_columns(t: ReplicaTable, names: tuple[str, ...]) -> sql.Composed:
    """``ALTER TABLE … ADD COLUMN`` for an additive source change (new columns are nullable)."""
    if not names:
        raise ValueError("no columns to add")
    return sql.SQL("ALTER TABLE {} {}").format(_target(t), sql.SQL(", ").join(
        sql.SQL("ADD COLUMN {}").format(d) for d in _column_defs(t, names)))


# -- one batch ------------------------------------------------------------------------------------

def create_staging(t: ReplicaTable) -> sql.Composed:
    """A temporary table for the batch's winners, dropped at commit (or rollback)."""
    return sql.SQL("CREATE TEMPORARY TABLE {} ({} integer NOT NULL, {} text NOT NULL, {} {} NOT NULL, {}) "
                   "ON COMMIT DROP").format(_ident(STAGING), _ident(ROW_NO), _ident(OP), _ident(POS),
                                            sql.SQL(t.position_type), sql.SQL(", ").join(_column_defs(t)))


def copy_staging(t: ReplicaTable) -> sql.Composed:
    return sql.SQL("COPY {} ({}, {}, {}, {}) FROM STDIN").format(
        _ident(STAGING), _ident(ROW_NO), _ident(OP), _ident(POS), _list(t.column_names))


def analyze_staging() -> sql.Composed:
    """Statistics for the staging table (temporary tables get none by themselves): the joins below
    then hash the batch instead of probing the replica row by row from a guessed size."""
    return sql.SQL("ANALYZE {}").format(_ident(STAGING))


def guarded_delete(t: ReplicaTable, row_no: int | None = None) -> sql.Composed:
    """Delete the keys whose winning change is a delete newer than the row; answers the count."""
    return sql.SQL(
        "WITH gone AS (DELETE FROM {} AS t USING {} AS s WHERE s.{} = {}{} AND {} AND t.{} < s.{} RETURNING 1) "
        "SELECT count(*) FROM gone").format(
        _target(t), _ident(STAGING), _ident(OP), sql.Literal(DELETE), _only_row(row_no), _keys_equal(t, "t", "s"),
        _ident(POSITION), _ident(POS))


def write_tombstones(t: ReplicaTable, row_no: int | None = None) -> sql.Composed:
    """Remember each deleted key with the delete's position (kept if a newer one is there)."""
    return sql.SQL(
        "INSERT INTO {} AS d ({}, {}) SELECT {}, s.{} FROM {} AS s WHERE s.{} = {}{} "
        "ON CONFLICT ({}) DO UPDATE SET {} = EXCLUDED.{}, deleted_at = now() WHERE d.{} < EXCLUDED.{}").format(
        _tomb(t), _list(t.keys), _ident(POSITION), _list(t.keys, "s"), _ident(POS), _ident(STAGING), _ident(OP),
        sql.Literal(DELETE), _only_row(row_no), _list(t.keys), _ident(POSITION), _ident(POSITION),
        _ident(POSITION), _ident(POSITION))


def guarded_upsert(t: ReplicaTable, row_no: int | None = None) -> sql.Composed:
    """Insert or update the keys whose winner is an upsert, unless the row or the key's tombstone
    holds a position at least as new; answers (inserted, updated)."""
    cols = t.column_names
    data = [c for c in cols if c not in t.keys]
    sets = [sql.SQL("{} = EXCLUDED.{}").format(_ident(c), _ident(c)) for c in (*data, POSITION)]
    return sql.SQL(
        "WITH w AS (INSERT INTO {} AS t ({}, {}) SELECT {}, s.{} FROM {} AS s WHERE s.{} = {}{} "
        "AND NOT EXISTS (SELECT 1 FROM {} AS d WHERE {} AND d.{} >= s.{}) "
        "ON CONFLICT ({}) DO UPDATE SET {} WHERE t.{} < EXCLUDED.{} RETURNING (t.xmax = 0) AS fresh) "
        "SELECT count(*) FILTER (WHERE fresh), count(*) FILTER (WHERE NOT fresh) FROM w").format(
        _target(t), _list(cols), _ident(POSITION), _list(cols, "s"), _ident(POS), _ident(STAGING), _ident(OP),
        sql.Literal(UPSERT), _only_row(row_no), _tomb(t), _keys_equal(t, "d", "s"), _ident(POSITION), _ident(POS),
        _list(t.keys), sql.SQL(", ").join(sets), _ident(POSITION), _ident(POSITION))


def clear_tombstones(t: ReplicaTable, row_no: int | None = None) -> sql.Composed:
    """Forget tombstones that a newer upsert of their key has superseded."""
    return sql.SQL("DELETE FROM {} AS d USING {} AS s WHERE s.{} = {}{} AND {} AND d.{} < s.{}").format(
        _tomb(t), _ident(STAGING), _ident(OP), sql.Literal(UPSERT), _only_row(row_no), _keys_equal(t, "d", "s"),
        _ident(POSITION), _ident(POS))


def purge_tombstones(t: ReplicaTable, horizon_seconds: float) -> sql.Composed:
    """Drop tombstones older than the horizon: a change older than that can resurrect its key."""
    return sql.SQL("DELETE FROM {} WHERE deleted_at < now() - {} * interval '1 second'").format(
        _tomb(t), sql.Literal(float(horizon_seconds)))
