"""`make torture`: the full crash-torture run; results to docs/RELIABILITY.md.

Every named crash point once, then random SIGKILLs alternating with crash points reached mid-stream,
at least 25 kills in all; then the proof of tests/torture/harness.py (row-for-row equality, no
transaction committed twice, consistent checkpoint rows). Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lakemirror.daemon.settings import RuntimeSettings  # noqa: E402
from lakemirror.daemon.spark import local_session  # noqa: E402
from tests.torture.harness import KillRecord, Torture, render_markdown  # noqa: E402


def machine() -> str:
    import pyspark

    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, PySpark {pyspark.__version__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=25, help="SIGKILLs in the run (at least the 6 named points)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: docs/RELIABILITY.md (docs/RELIABILITY_DELETION_VECTORS.md with --deletion-vectors)")
    parser.add_argument("--deletion-vectors", action="store_true",
                        help="replicas with deletion vectors on: batches applied by sinks/accelerator/dv_merge.py")
    parser.add_argument("--postgres", action="store_true",
                        help="replicas in a PostgreSQL started by scripts/postgres.sh, killed also inside a batch's "
                             "transaction (written to docs/RELIABILITY_POSTGRES.md)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, tables)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = ROOT / "docs" / ("RELIABILITY_DELETION_VECTORS.md" if args.deletion_vectors else
                                    "RELIABILITY_POSTGRES.md" if args.postgres else "RELIABILITY.md")
    properties = {"delta.enableDeletionVectors": "true"} if args.deletion_vectors else None

    workdir = Path(tempfile.mkdtemp(prefix="lakemirror-torture-"))
    postgres: dict[str, object] | None = None
    connect = None
    if args.postgres:
        import socket

        import psycopg

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        workdir.chmod(0o755)
        subprocess.run([str(ROOT / "scripts" / "postgres.sh"), "start", str(port), str(workdir / "pg")], check=True)
        postgres = {"kind": "postgres", "host": "127.0.0.1", "port": port, "database": "postgres",
                    "schema": "torture_pg", "user": "postgres", "retry_seconds": 5}

        def connect() -> object:  # type: ignore[misc]
            return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True)
    print(f"torture: {args.kills} kills, seed {args.seed}, work directory {workdir}", flush=True)
    spark = local_session(RuntimeSettings(master="local[2]", shuffle_partitions=2, driver_memory="2g"),
                          app_name="lakemirror-torture")
    started = time.time()

    def progress(n: int, kill: KillRecord) -> None:
        how = "reached" if kill.reached else "NOT reached, killed on timeout"
        print(f"  kill {n}/{args.kills}: {kill.point} ({how}) after {kill.seconds:.1f}s "
              f"[{time.time() - started:.0f}s]", flush=True)

    try:
        report = Torture(spark, workdir, seed=args.seed, replica_properties=properties, postgres=postgres,
                         connect=connect).run(kills=args.kills, progress=progress)
    except AssertionError as exc:
        print(f"torture FAILED: {exc}\n(work directory kept: {workdir})", file=sys.stderr)
        return 1
    finally:
        spark.stop()
        if args.postgres:
            subprocess.run([str(ROOT / "scripts" / "postgres.sh"), "stop", str(port), str(workdir / "pg")])
    flag = " --deletion-vectors" if args.deletion_vectors else " --postgres" if args.postgres else ""
    command = (f"make torture{' DV=1' if args.deletion_vectors else ''}  # python scripts/torture.py --kills {args.kills} "
               f"--seed {args.seed}{flag}")
    title = ("crash torture, replicas with deletion vectors (sinks/accelerator/dv_merge.py)" if args.deletion_vectors else
             "crash torture, PostgreSQL replicas (sinks/postgres)" if args.postgres else "crash torture")
    skipped_by = ("their progress rows, committed with the data, made them no-ops" if args.postgres else
                  "Delta skipped them by transaction id")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_markdown(report, machine(), command, title, skipped_by))
    print(f"torture passed: {report.kill_count} kills in {report.elapsed_seconds:.0f}s; written to {args.out}")
    for name, detail in report.checks.items():
        print(f"  {name}: {detail}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
