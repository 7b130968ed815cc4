"""Capture what Debezium emits for PostgreSQL values at the edges of their types.

Writes tests/unit/data/debezium_postgres_edges.jsonl: every message of a real PostgreSQL 15 →
Debezium 3.7 (pgoutput, JSON converter with schemas) → Kafka run of scripts/debezium.sh for the
table below, rows written once before the connector starts (its snapshot, ``op: r``) and once
after (the log, ``op: c``), then updates and REPLICA IDENTITY FULL deletes; and beside each
message line, for the change's row, PostgreSQL's own text of every column (``"pg"``), read back
from the server (its ``::text`` and its ``to_json``), which the unit tests (tests/unit/test_debezium_edges.py) hold the decoder to.

    .venv/bin/python scripts/capture-debezium-edges.py    # about a minute; needs scripts/setup.sh done
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "unit" / "data" / "debezium_postgres_edges.jsonl"

COLUMNS = """
    id int PRIMARY KEY,
    n38_6 numeric(38,6), n38_0 numeric(38,0), n_var numeric, n_neg numeric(5,-2), n_small numeric(3,5),
    n_wide numeric(60,10), i2 smallint, i4 int, i8 bigint, f4 real, f8 double precision, b boolean,
    t text, vc varchar(10), ch char(3), ba bytea, u uuid, j json, jb jsonb, ai int[], at text[],
    d date, ts timestamp(6), tstz timestamptz, tm time, ttz timetz, iv interval, mo money
"""
NAMES = ["id", "n38_6", "n38_0", "n_var", "n_neg", "n_small", "n_wide", "i2", "i4", "i8", "f4", "f8", "b", "t",
         "vc", "ch", "ba", "u", "j", "jb", "ai", "at", "d", "ts", "tstz", "tm", "ttz", "iv", "mo"]

#: One row per edge, as SQL literals (column order of NAMES without id).
ROWS = {
    1: ["99999999999999999999999999999999.999999", "99999999999999999999999999999999999999",
        "123456789012345678901234567890123456789012345678901.123456789", "9999900", "0.00999",
        "99999999999999999999999999999999999999999999999999.9999999999", "32767", "2147483647",
        "9223372036854775807", "3.4028234e38", "1.7976931348623157e308", "true",
        "'héllo wörld 😀 中文 e\u0301'", "'abcdefghij'", "'abc'", "'\\x00ff00'::bytea",
        "'ffffffff-ffff-ffff-ffff-ffffffffffff'", """'{"b": 1, "a": [1, 2.50, "x"], "n": null}'""",
        """'{"b": 1, "a": [1, 2.50, "x"], "n": null}'""", "'{1,NULL,3}'", """'{"a","",NULL,"with,comma","quo\\"te"}'""",
        "'9999-12-31'", "'9999-12-31 23:59:59.999999'", "'9999-12-31 23:59:59.999999+00'", "'23:59:59.999999'",
        "'23:59:59.999999+14'", "'178000000 years'", "'92233720368547758.07'"],
    2: ["-99999999999999999999999999999999.999999", "-99999999999999999999999999999999999999",
        "-0.000000000000000000001", "-9999900", "-0.00999",
        "-99999999999999999999999999999999999999999999999999.9999999999", "-32768", "-2147483648",
        "-9223372036854775808", "1.4e-45", "5e-324", "false", "''", "''", "''", "'\\x'::bytea",
        "'00000000-0000-0000-0000-000000000000'", "'[]'", "'{}'", "'{}'", "'{}'",
        "'0001-01-01'", "'0001-01-01 00:00:00'", "'0001-01-01 00:00:00+00'", "'00:00:00'", "'00:00:00-12'",
        "'-178000000 years'", "'-92233720368547758.08'"],
    3: ["'NaN'", "0", "'NaN'", "0", "0", "'NaN'", "0", "0", "0", "'NaN'", "'Infinity'", "true",
        "E'tab\\tnewline\\nbackslash\\\\quote\"'", "' x '", "'a'", "'\\x5c00'::bytea",
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'\"just a string\"'", "'[1, \"two\", {\"three\": 3.0}]'",
        "'{{1,2},{3,4}}'", "'{\"NULL\",\"null\"}'",
        "'infinity'", "'infinity'", "'infinity'", "'24:00:00'", "'24:00:00+00'", "'1 day 02:03:04.5'", "'0'"],
    4: ["-0.000001", "-1", "'Infinity'", "-100", "0.00001", "0.0000000001", "-1", "-1", "-1", "'-Infinity'",
        "'-0'", "false", "' '", "' '", "' '", "'\\x00'::bytea", "'123e4567-e89b-12d3-a456-426614174000'",
        "'{\"a\":1,   \"a\":2}'", "'{\"a\":1,   \"a\":2}'", "'{-2147483648,2147483647}'", "'{\"\\\\\"}'",
        "'-infinity'", "'-infinity'", "'-infinity'", "'12:34:56.789'", "'12:34:56.789-03:30'", "'-1 mons'",
        "'-0.01'"],
    5: ["12345678901234567890123456789012.123456", "123456789012345678901234567890", "'-Infinity'", "12300",
        "0.00123", "1.5", "7", "7", "7", "0.1", "0.1", "true", "'𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u200b zero-width'", "'x'", "'xyz'",
        "'\\xdeadbeef'::bytea", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", "'null'", "'null'", "'{NULL}'",
        "'{\"\"}'", "'4713-01-01 BC'", "'4713-01-01 00:00:00 BC'", "'4713-01-01 00:00:00+00 BC'",
        "'00:00:00.000001'", "'00:00:00.000001+00'", "'1 microsecond'", "'1.50'"],
    6: ["0.000001", "0", "0.00000000000000000001", "0", "0", "0", "0", "0", "0", "0", "0", "false", "'0'",
        "'0'", "'0'", "'\\x'::bytea", "'00000000-0000-0000-0000-000000000001'", "'0'", "'0'", "'{0}'", "'{0}'",
        "'5874897-12-31'", "'294276-12-31 23:59:59.999999'", "'294276-12-31 23:59:59.999999+00'",
        "'00:00:00'", "'00:00:00+00'", "'0'", "'0'"],
    7: ["1.500000", "100", "1.500", "0", "0", "1.5000000000", "0", "0", "0", "0", "0", "false", "'x'",
        "'x'", "'x'", "'\\x'::bytea", "'00000000-0000-0000-0000-000000000002'", "'{}'", "'{}'", "'{}'", "'{}'",
        "'1970-01-01'", "'1969-12-31 23:59:59.999999'", "'1969-12-31 23:59:59.999999+00'",
        "'00:00:00'", "'00:00:00+00'", "'0'", "'0'"],
    8: ["NULL"] * 28,
}
STREAMED = 100  # the same rows again under id + 100, written while the connector streams


def insert(db, offset: int) -> None:
    for i, literals in ROWS.items():
        db.execute(f"INSERT INTO public.edges VALUES ({i + offset}, {', '.join(literals)})")


def pg_text(db) -> dict[int, dict[str, dict[str, str | None]]]:
    """Each row's columns as PostgreSQL writes them: ``text`` (the column cast to text) and ``json``
    (``to_json`` of the column, for arrays: the items as JSON values)."""
    cols = ", ".join(f"{n}::text, to_json({n})::text" for n in NAMES)
    out = {}
    for row in db.execute(f"SELECT id, {cols} FROM public.edges").fetchall():
        values = row[1:]
        out[row[0]] = {n: {"text": values[2 * i], "json": values[2 * i + 1]} for i, n in enumerate(NAMES)}
    return out


def main() -> int:
    from kafka import KafkaConsumer

    from lakemirror.tools.debezium_stack import DebeziumStack

    folder = Path(tempfile.mkdtemp(prefix="lakemirror-edges-"))
    folder.chmod(0o755)
    stack = DebeziumStack(folder)
    try:
        stack.start()
        states: list[dict[int, dict[str, dict[str, str | None]]]] = []
        with stack.connect_sql() as db:
            db.execute(f"CREATE TABLE public.edges ({COLUMNS})")
            db.execute("ALTER TABLE public.edges REPLICA IDENTITY FULL")
            insert(db, 0)
            states.append(pg_text(db))
        stack.register(["public.edges"])
        with stack.connect_sql() as db:
            insert(db, STREAMED)
            states.append(pg_text(db))
            db.execute("UPDATE public.edges SET n38_6 = n38_6 / 3, t = t || '!' WHERE id IN (101, 105)")
            states.append(pg_text(db))
            db.execute("DELETE FROM public.edges WHERE id IN (103, 104, 105, 106)")  # infinity, ancient and far dates
        consumer = KafkaConsumer("shop.public.edges", bootstrap_servers=stack.bootstrap_servers,
                                 auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=5000)
        wanted = 2 * len(ROWS) + 2 + 2 * 4  # snapshot, stream, updates, deletes with their tombstones
        messages = []
        deadline = time.time() + 180
        while len(messages) < wanted and time.time() < deadline:
            for m in consumer:
                messages.append(m)
        consumer.close()
        if len(messages) < wanted:
            print(f"only {len(messages)} of {wanted} messages arrived", file=sys.stderr)
            return 1
        with OUT.open("w") as out:
            for m in messages:
                key = m.key.decode() if m.key is not None else None
                value = m.value.decode() if m.value is not None else None
                row_id = json.loads(key)["payload"]["id"] if key else None
                op = json.loads(value)["payload"].get("op") if value else None
                # The row as the change left it (a read: the snapshot; a create: as inserted; an
                # update: as updated; a delete: its before image, the row as last written).
                state = states[{"r": 0, "c": 1}.get(op or "", 2)]
                pg = state.get(row_id) if row_id is not None else None
                out.write(json.dumps({"topic": m.topic, "partition": m.partition, "offset": m.offset,
                                      "key": key, "value": value, "pg": pg}) + "\n")
        print(f"wrote {len(messages)} messages to {OUT}")
        return 0
    finally:
        stack.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
