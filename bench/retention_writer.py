"""The retention run's writer: ``python -m bench.retention_writer SOURCE CONTROL [options]``.

Changes a Delta source with Spark (a ``local[1]`` session, in a process of its own) while lakemirror
bootstraps it, and VACUUMs it with a retention shorter than the bootstrap. Spark, not delta-rs:
the source keeps deletion vectors (``delta.enableDeletionVectors``, set at its creation), so an
UPDATE or DELETE marks rows instead of rewriting the snapshot's files, and those files stay
readable after a VACUUM (delta-rs does not write deletion vectors).

Driven through files in the folder CONTROL:

- it writes ``ready`` once its Spark session is up and warm (a MERGE and a VACUUM on a scratch
  table), then waits for ``go`` (written by the benchmark once the daemon has pinned its snapshot
  version, so that the snapshot holds no deletion vector a VACUUM could remove);
- every ``--interval`` seconds (or as fast as it can when a commit takes longer) one MERGE changes
  keys chosen by :func:`bench.retention.plan_step`: updates, deletes, re-inserts of deleted keys, a
  few inserts; beside the commits, ``--vacuum-seconds`` after the end of the previous one, a thread
  runs a plain ``VACUUM``, which keeps what the source's own ``delta.deletedFileRetentionDuration``
  (set by the benchmark at the source's creation, in seconds) protects, with
  ``spark.databricks.delta.retentionDurationCheck.enabled`` off. Not ``VACUUM … RETAIN <n> HOURS``:
  Delta rounds ``n`` to whole hours (``VacuumCommand``: ``TimeUnit.HOURS.toMillis(math.round(h))``),
  so 0.01-0.49 hours is a VACUUM with no retention at all, which can also delete files a concurrent
  MERGE has written but not yet committed; each commit and VACUUM is appended
  to ``events.jsonl`` as it ends;
- when ``stop`` appears (JSON ``{"cdf_from": N}``) it stops changing, reads the change feed from
  version N afresh (what a new reader starting there would get: it must fail once a VACUUM has
  removed that version's change data) and writes ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.retention import HotKeys, StepSizes, plan_step
from lakemirror.delta_log.layout import LOG_DIR

RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
#: How many tasks VACUUM's listing of the table's folders is split into. Spark's default (10,000,
#: ``spark.sql.sources.parallelPartitionDiscovery.parallelism``) made each VACUUM of the 20M-row
#: source 45-79 s of tiny tasks in this writer's one task slot, where the MERGEs then queued behind
#: it; with 2 a VACUUM took 4.6-6.5 s and a MERGE 5-7 s (throwaway, writer alone, under load).
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def latest_version(path: Path) -> int:
    """The table's latest version, from its log's file names (this writer is the source's only
    writer; a listing costs no Spark job)."""
    return max(int(p.name.split(".")[0]) for p in (path / LOG_DIR).glob("*.json"))


def merge_step(spark: Any, path: Path, changes: list[tuple[int, str]], stamp: int, hot_ranges: str) -> None:
    """One MERGE: updates, deletes and inserts of ``changes``. ``hot_ranges`` (a predicate on the
    target's id) lets Delta skip every file outside the writer's key ranges."""
    rows = [(k, stamp, f"w{stamp}", op) for k, op in changes]
    spark.createDataFrame(rows, "id BIGINT, v BIGINT, payload STRING, op STRING").createOrReplaceTempView("writer_step")
    spark.sql(f"""MERGE INTO delta.`{path}` t USING writer_step s ON t.id = s.id AND ({hot_ranges})
        WHEN MATCHED AND s.op = 'd' THEN DELETE
        WHEN MATCHED AND s.op = 'u' THEN UPDATE SET v = s.v, payload = s.payload
        WHEN NOT MATCHED AND s.op = 'i' THEN INSERT (id, v, payload) VALUES (s.id, s.v, s.payload)""")


def cdf_read(spark: Any, path: Path, starting_version: int) -> dict[str, Any]:
    """A fresh change-feed read from ``starting_version``: works, or the first line of its error."""
    try:
        rows = (spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", starting_version).load(str(path)).count())
        return {"cdf_from": starting_version, "cdf_read_works": True, "cdf_rows": rows}
    except Exception as exc:  # noqa: BLE001 (any failure is the answer: the feed from there is gone)
        java = getattr(exc, "java_exception", None)  # py4j's error: the JVM's exception says what failed
        text = str(java.toString()) if java is not None else f"{type(exc).__name__}: {exc}"
        return {"cdf_from": starting_version, "cdf_read_works": False,
                "cdf_error": (text.strip().splitlines() or [""])[0][:300]}


def run(args: argparse.Namespace) -> int:
    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.spark import local_session

    control, path = Path(args.control), Path(args.source)
    spark = local_session(RuntimeSettings(master="local[1]", shuffle_partitions=1, driver_memory="1g",
                                          spark_conf={RETENTION_CHECK: "false", LISTING_PARALLELISM: "2"}),
                          app_name="bench-retention-writer")
    warm_up(spark, control / "warm-up", path)
    (control / "ready").touch()
    while not (control / "go").exists():
        if (control / "stop").exists():  # stopped before it began: nothing to report
            spark.stop()
            return 0
        time.sleep(0.05)
    try:
        result = changes_until_stopped(spark, path, control, args)
        stop = json.loads((control / "stop").read_text() or "{}")
        if "cdf_from" in stop:
            result.update(cdf_read(spark, path, int(stop["cdf_from"])))
    except Exception as exc:  # noqa: BLE001 (reported to the benchmark, which says the run failed)
        (control / "result.json").write_text(json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:500]}"}))
        raise
    (control / "result.json").write_text(json.dumps(result))
    spark.stop()
    return 0


def warm_up(spark: Any, scratch: Path, source: Path) -> None:
    """A MERGE and a VACUUM on a scratch table of the source's kind, and one read of the source,
    before the benchmark starts the daemon: a JVM just started spends its first minutes loading
    and compiling Delta's code, which would otherwise delay the first commits of the run."""
    spark.sql(f"CREATE TABLE delta.`{scratch}` (id BIGINT, v BIGINT, payload STRING) USING delta "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'true')")
    spark.range(0, 100).selectExpr("id", "id AS v", "'p' AS payload").write.format("delta").mode("append").save(str(scratch))
    merge_step(spark, scratch, [(1, "u"), (2, "d"), (100, "i")], 0, "t.id < 10 OR t.id >= 90")
    spark.sql(f"VACUUM delta.`{scratch}` RETAIN 0 HOURS").collect()
    spark.read.format("delta").load(str(source)).where("id < 10").count()


def changes_until_stopped(spark: Any, path: Path, control: Path, args: argparse.Namespace) -> dict[str, Any]:
    """MERGEs until ``stop`` appears, VACUUMs beside them in a thread of their own (a VACUUM takes
    seconds; the commits go on meanwhile, as a table's writers do while it is vacuumed). Each
    commit and VACUUM is logged to ``events.jsonl`` as it ends."""
    rng = random.Random(args.seed)
    keys = HotKeys.of_source(args.rows, args.hot)
    hot_ranges = f"t.id < {min(args.hot, args.rows)} OR t.id >= {max(0, args.rows - args.hot)}"
    lock = threading.Lock()
    stopped = threading.Event()
    failed: list[BaseException] = []
    steps = 0
    with (control / "events.jsonl").open("a") as events:
        def log(event: dict[str, Any]) -> None:
            with lock:
                events.write(json.dumps(event) + "\n")
                events.flush()

        def vacuums() -> None:
            try:
                while not stopped.wait(args.vacuum_seconds):
                    began = time.time()
                    spark.sql(f"VACUUM delta.`{path}`").collect()
                    log({"vacuum": began, "seconds": round(time.time() - began, 2)})
            except BaseException as exc:  # noqa: BLE001 (raised again by the main thread)
                failed.append(exc)

        vacuum = threading.Thread(target=vacuums, name="vacuum", daemon=True)
        vacuum.start()
        try:
            while not (control / "stop").exists() and not failed:
                tick = time.time()
                steps += 1
                step = plan_step(rng, keys, StepSizes())
                merge_step(spark, path, step.changes, steps, hot_ranges)
                keys = step.after
                log({"commit": latest_version(path), "began": tick, "at": time.time(), **step.counts})
                time.sleep(max(0.0, args.interval - (time.time() - tick)))
        finally:
            stopped.set()
            vacuum.join()
    if failed:
        raise failed[0]
    return {"last_version": latest_version(path), "steps": steps}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="the source table's folder (a Delta table with deletion vectors on)")
    parser.add_argument("control", help="the folder of the control files (ready, go, stop, events.jsonl, result.json)")
    parser.add_argument("--rows", type=int, required=True, help="the source's ids are 0 .. rows-1")
    parser.add_argument("--hot", type=int, default=2000, help="how many of the first and of the last ids are changed")
    parser.add_argument("--interval", type=float, default=1.5, help="seconds between the starts of two commits")
    parser.add_argument("--vacuum-seconds", type=float, default=10.0, help="seconds between two VACUUMs")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.hot <= 0:
        parser.error("--rows and --hot must be > 0")
    if not (Path(args.source) / LOG_DIR).is_dir():
        parser.error(f"{args.source} is not a Delta table (no {LOG_DIR}): write the source first")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
