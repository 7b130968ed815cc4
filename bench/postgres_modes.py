"""Snapshot against incremental into PostgreSQL, by change fraction: where a triggered cycle's
crossover lies (``destination.snapshot_above_fraction``, :mod:`lakemirror.sinks.postgres.modes`).

For each change fraction f, a replica of ``table_rows`` rows (bootstrapped fresh each time) is
brought to the same new state in two ways, each timed on the wall clock after a ``CHECKPOINT``:

- incremental: one batch of ``f × table_rows`` change rows (70% updates, 20% inserts, 10% deletes,
  as ``bench/postgres_sink.py``) through :meth:`PostgresReplica.apply` — planning the winners on the
  driver, COPY into staging, guarded delete and upsert, tombstones, progress row, one commit;
- snapshot: the resulting table (read back from the replica) through :meth:`PostgresReplica.refresh`
  — COPY into a new table, primary key built after the load, renames and fresh tombstones in one
  transaction, the old table dropped.

Both final tables are compared row for row. The crossover is where the snapshot's time meets the
incremental's, interpolated linearly between the two measured fractions around it. Only the
Postgres side is timed: a cycle's Spark side reads the change rows (incremental) or the whole
table (snapshot) on top, which moves the true crossover up, never down. No Spark.

``python -m bench.postgres_modes [--table-rows N] [--fractions 0.01,0.05,…] [--repeats R]``;
``python -m bench --only postgres_modes`` records it in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import psycopg
import pyarrow as pa

from bench.postgres_sink import COLUMNS, ROOT, _changes, _free_port, _snapshot
from lakemirror.sinks.postgres.executor import Connector, PostgresReplica, PostgresTarget
from lakemirror.sinks.postgres.modes import cycle_batch_id
from lakemirror.sinks.postgres.plan import ReplicaTable

FRACTIONS = (0.01, 0.05, 0.10, 0.20, 0.40, 0.60, 0.80, 1.0)
NAMES = [c.name for c in COLUMNS]


def _read_back(conn: psycopg.Connection[Any], schema: str) -> pa.Table:
    """The replica's rows as a snapshot (the source's state after the changes)."""
    rows = conn.execute(f'SELECT {", ".join(NAMES)} FROM "{schema}".t ORDER BY id').fetchall()
    cols = list(zip(*rows)) if rows else [[] for _ in NAMES]
    template = _snapshot(1)
    return pa.table({n: pa.array(list(c), template.schema.field(n).type) for n, c in zip(NAMES, cols)})


def _contents(conn: psycopg.Connection[Any], schema: str) -> str:
    rows = conn.execute(f'SELECT {", ".join(NAMES)} FROM "{schema}".t ORDER BY id').fetchall()
    return json.dumps(rows, default=str)


def crossover(points: Sequence[dict[str, Any]]) -> float | None:
    """The change fraction at which the snapshot's time meets the incremental's (linear between the
    measured fractions around it); None when the incremental stays cheaper at every fraction. A
    snapshot already cheaper at the smallest fraction answers that fraction."""
    pts = sorted(points, key=lambda p: p["fraction"])
    for i, p in enumerate(pts):
        gain = p["incremental_s"] - p["snapshot_s"]
        if gain < 0:
            continue
        if i == 0:
            return float(p["fraction"])
        q = pts[i - 1]
        before = q["incremental_s"] - q["snapshot_s"]  # negative: incremental was cheaper there
        share = -before / (gain - before) if gain != before else 0.0
        return round(q["fraction"] + share * (p["fraction"] - q["fraction"]), 4)
    return None


def postgres_modes(table_rows: int, fractions: Sequence[float] = FRACTIONS, repeats: int = 3,
                   seed: int = 42) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="lakemirror-bench-pgmodes-"))
    root.chmod(0o755)
    port, data = _free_port(), root / "data"
    script = str(ROOT / "scripts" / "postgres.sh")
    subprocess.run([script, "start", str(port), str(data)], check=True, capture_output=True)
    try:
        target = PostgresTarget("127.0.0.1", port, "postgres", "modes", "postgres")
        replica = PostgresReplica(Connector(target), "bench", ReplicaTable("modes", "t", ("id",), COLUMNS))
        snapshot = _snapshot(table_rows)
        out: list[dict[str, Any]] = []
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            for fraction in fractions:
                change_rows = max(1, round(table_rows * fraction))
                changes = _changes(table_rows, change_rows, seed)
                head = change_rows + 1  # _changes gives each row its own version, from 2
                incremental, full, same = [], [], True
                for attempt in range(repeats):
                    epoch = 1 + attempt
                    replica.bootstrap(snapshot, version=1, epoch=epoch)
                    conn.execute("CHECKPOINT")
                    started = time.perf_counter()
                    replica.apply(changes, epoch=epoch, batch_id=0)
                    incremental.append(time.perf_counter() - started)
                    after = _read_back(conn, "modes")
                    wanted = _contents(conn, "modes")
                    conn.execute("CHECKPOINT")
                    started = time.perf_counter()
                    replica.refresh(after, head, epoch, cycle_batch_id(head))
                    full.append(time.perf_counter() - started)
                    same = same and _contents(conn, "modes") == wanted
                    conn.execute('TRUNCATE "modes".lakemirror_progress')
                inc, snap = statistics.median(incremental), statistics.median(full)
                out.append({"table_rows": table_rows, "fraction": fraction, "change_rows": change_rows,
                            "incremental_s": round(inc, 3), "snapshot_s": round(snap, 3),
                            "snapshot_over_incremental": round(snap / inc, 2), "repeats": repeats,
                            "same_final_table": same})
                print(f"  {out[-1]}", flush=True)
        point = crossover(out)
        for r in out:
            r["crossover_fraction"] = point
        return out
    finally:
        subprocess.run([script, "stop", str(port), str(data)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def render(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    point = r0.get("crossover_fraction")
    lines = ["## Snapshot or incremental into PostgreSQL, by change fraction", "",
             f"`bench/postgres_modes.py` (no Spark): a {r0['table_rows']:,}-row replica brought to the same new "
             "state by one batch of change rows (70% updates, 20% inserts, 10% deletes; guarded upsert) or by a "
             "snapshot of the result (COPY into a new table, primary key, atomic swap); medians of "
             f"{r0['repeats']}; local PostgreSQL 15 from scripts/postgres.sh (fsync off). Postgres side only: the "
             "source reads of a cycle come on top.", "",
             "| changed | change rows | incremental s | snapshot s | snapshot / incremental | same table |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['fraction']:.0%} | {r['change_rows']:,} | {r['incremental_s']} | {r['snapshot_s']} | "
                     f"{r['snapshot_over_incremental']} | {'yes' if r['same_final_table'] else 'NO'} |")
    lines += ["", "Crossover: " + (f"{point:.1%} of the rows changed" if point is not None
                                   else f"none up to {runs[-1]['fraction']:.0%} (incremental cheaper throughout)")]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table-rows", type=int, default=200_000)
    parser.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    runs = postgres_modes(args.table_rows, [float(f) for f in args.fractions.split(",")], args.repeats, args.seed)
    print("\n".join(render(runs)))


if __name__ == "__main__":
    main()
