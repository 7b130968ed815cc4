"""Throughput into PostgreSQL: lakemirror's COPY + guarded upsert against a per-row upsert writer.

The baseline is the shape of the Real-Time Mode review's Lakebase ``foreach`` sink (seed 003): one
``INSERT … ON CONFLICT (key) DO UPDATE`` (or ``DELETE``) per change row, committed by time
(``max_dwell_ms``, 1 s here). lakemirror's path is :class:`lakemirror.sinks.postgres.executor.PostgresReplica`:
the batch's winners per key, COPY into staging, one guarded upsert and delete, the progress row, one
commit. Both start from the same bootstrapped table and take the same change rows (updates,
inserts, deletes of a seeded random mix); rows per second is change rows over wall-clock seconds
of the apply (lakemirror's includes planning the batch on the driver). No Spark.

Runs a throwaway server with scripts/postgres.sh. ``python -m bench.postgres_sink [--rows N]``
prints the figures; ``make bench ONLY=postgres`` records them in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from lakemirror.schema import Column
from lakemirror.sinks.postgres.executor import Connector, PostgresReplica, PostgresTarget
from lakemirror.sinks.postgres.plan import ReplicaTable

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = (Column("id", "bigint", False), Column("name", "string"), Column("amount", "decimal(12,2)"),
           Column("qty", "int"), Column("updated", "timestamp"))
MAX_DWELL_SECONDS = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _changes(table_rows: int, change_rows: int, seed: int) -> pa.Table:
    """A batch of change-feed rows, one version each: 70% updates, 20% inserts, 10% deletes."""
    rng = random.Random(seed)
    ids, ops, names, amounts, qtys, versions = [], [], [], [], [], []
    next_id = table_rows
    for i in range(change_rows):
        r = rng.random()
        if r < 0.7:
            key, op = rng.randrange(table_rows), "update_postimage"
        elif r < 0.9:
            key, op, next_id = next_id, "insert", next_id + 1
        else:
            key, op = rng.randrange(table_rows), "delete"
        ids.append(key)
        ops.append(op)
        names.append(f"name-{key}-{i}")
        amounts.append(f"{rng.randrange(1_000_000) / 100:.2f}")
        qtys.append(rng.randrange(1000))
        versions.append(2 + i)  # one version per row: the per-row writer's order is the feed's order
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    import decimal

    return pa.table({
        "id": pa.array(ids, pa.int64()), "name": names,
        "amount": pa.array([decimal.Decimal(a) for a in amounts], pa.decimal128(12, 2)),
        "qty": pa.array(qtys, pa.int32()), "updated": pa.array([now] * change_rows, pa.timestamp("us", "UTC")),
        "_change_type": ops, "_commit_version": pa.array(versions, pa.int64()),
        "_commit_timestamp": pa.array([now] * change_rows, pa.timestamp("us", "UTC"))})


def _snapshot(table_rows: int) -> pa.Table:
    import decimal

    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    return pa.table({"id": pa.array(range(table_rows), pa.int64()), "name": [f"name-{i}" for i in range(table_rows)],
                     "amount": pa.array([decimal.Decimal("1.00")] * table_rows, pa.decimal128(12, 2)),
                     "qty": pa.array([1] * table_rows, pa.int32()),
                     "updated": pa.array([now] * table_rows, pa.timestamp("us", "UTC"))})


def per_row_upsert(conn: psycopg.Connection[Any], schema: str, changes: pa.Table) -> None:
    """The baseline: each change row its own statement, a commit every ``MAX_DWELL_SECONDS``."""
    upsert = (f'INSERT INTO "{schema}".t (id, name, amount, qty, updated, _lakemirror_position) '
              f"VALUES (%s, %s, %s, %s, %s, 0) ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, "
              f"amount = EXCLUDED.amount, qty = EXCLUDED.qty, updated = EXCLUDED.updated")
    delete = f'DELETE FROM "{schema}".t WHERE id = %s'
    conn.autocommit = False
    last_commit = time.monotonic()
    with conn.cursor() as cur:
        for row in changes.to_pylist():
            if row["_change_type"] == "delete":
                cur.execute(delete, (row["id"],))
            else:
                cur.execute(upsert, (row["id"], row["name"], row["amount"], row["qty"], row["updated"]))
            if time.monotonic() - last_commit >= MAX_DWELL_SECONDS:
                conn.commit()
                last_commit = time.monotonic()
    conn.commit()


def _contents(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(f'SELECT id, name, amount, qty, updated FROM "{schema}".t ORDER BY id').fetchall()


def postgres_throughput(table_rows: int, change_rows: int, seed: int = 42) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="lakemirror-bench-pg-"))
    root.chmod(0o755)
    port, data = _free_port(), root / "data"
    script = str(ROOT / "scripts" / "postgres.sh")
    subprocess.run([script, "start", str(port), str(data)], check=True, capture_output=True)
    try:
        changes, snapshot = _changes(table_rows, change_rows, seed), _snapshot(table_rows)
        results: dict[str, tuple[float, list[tuple[Any, ...]]]] = {}
        for system, schema in (("lakemirror (COPY + guarded upsert)", "lm"), ("per-row INSERT … ON CONFLICT", "rows")):
            target = PostgresTarget("127.0.0.1", port, "postgres", schema, "postgres")
            replica = PostgresReplica(Connector(target), "bench", ReplicaTable(schema, "t", ("id",), COLUMNS))
            replica.prepare(True)
            replica.bootstrap(snapshot, version=1, epoch=1)
            with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                                 autocommit=True) as conn:
                conn.execute("CHECKPOINT")
                started = time.perf_counter()
                if system.startswith("lakemirror"):
                    replica.apply(changes, epoch=1, batch_id=0)
                else:
                    per_row_upsert(conn, schema, changes)
                seconds = time.perf_counter() - started
                conn.autocommit = True
                results[system] = (seconds, _contents(conn, schema))
        base = results["per-row INSERT … ON CONFLICT"][0]
        same = len({json.dumps(c, default=str) for _, c in results.values()}) == 1
        return [{"system": s, "table_rows": table_rows, "change_rows": change_rows, "seconds": round(sec, 3),
                 "rows_per_second": round(change_rows / sec), "speedup_vs_per_row": round(base / sec, 1),
                 "same_final_table": same} for s, (sec, _) in results.items()]
    finally:
        subprocess.run([script, "stop", str(port), str(data)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def render(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    lines = ["## Throughput into PostgreSQL", "",
             f"`bench/postgres_sink.py` (no Spark): a {r0['table_rows']:,}-row table takes one batch of "
             f"{r0['change_rows']:,} change rows (70% updates, 20% inserts, 10% deletes), by lakemirror's sink "
             "and by a per-row `INSERT … ON CONFLICT` writer that commits every second; a local PostgreSQL 15 "
             "from scripts/postgres.sh (fsync off).", "",
             "| system | seconds | change rows / s | vs per-row | same final table |", "|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['system']} | {r['seconds']} | {r['rows_per_second']:,} | {r['speedup_vs_per_row']}x | "
                     f"{'yes' if r['same_final_table'] else 'NO'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table-rows", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=100_000, help="change rows in the batch")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    for r in postgres_throughput(args.table_rows, args.rows, args.seed):
        print(json.dumps(r))


if __name__ == "__main__":
    main()
