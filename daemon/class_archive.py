"""The driver JVM's class-data-sharing archive: the classes a session loads, mapped from one file.

Starting an embedded session loads and verifies tens of thousands of classes (Spark, Scala,
Hadoop, Delta) before the first table is described, and every daemon start pays it again. The
JDK's class data sharing (dynamic AppCDS archives, JEP 350, in every JDK since 13) records the
classes one JVM loaded, parsed and verified, in a file the next JVM maps instead: a session and
its first Delta work start several seconds sooner (``make bench ONLY=startup`` shows the start).

- :func:`build` records one: a session in a child process does what a daemon's start does (a Delta
  table with its change feed created, written, merged, described, read back as a batch and as a
  stream), with ``-XX:ArchiveClassesAtExit``; the JVM writes the archive when it exits, and it is
  renamed into place only then. ``make setup`` builds it (``lakemirror build-class-archive``).
- :func:`java_options` is what a session adds to the driver's Java options while an archive for
  this JVM, this Spark and these jars exists (:func:`archive_path`): ``-XX:SharedArchiveFile`` with
  ``-Xshare:auto``, so a JVM that finds the archive does not match (another JDK build, jars
  changed in place) validates it, ignores it and starts as without it. Its CDS messages are not
  printed. A user's own ``-Xshare:off`` in ``runtime.spark_conf``'s
  ``spark.driver.extraJavaOptions`` comes after ours and wins.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

#: The archive's name changes with what it was recorded against: the JVM (its path and version), the
#: Spark build (PySpark's version) and Delta's jars (names and sizes). A session that loads more jars
#: (hadoop-aws for ``s3a://``) maps the same archive: the JVM takes from it only the classes whose
#: class files are unchanged and loads the others as without it.
FORMAT = 1


def archive_key(java_version: str, java_binary: str, spark_version: str, jars: Sequence[str]) -> str:
    """The digest naming the archive of one JVM, Spark build and jar list (pure)."""
    parts = [f"format={FORMAT}", f"java={java_version}", f"binary={java_binary}", f"spark={spark_version}"]
    parts += sorted(f"jar={Path(j).name}:{_size(j)}" for j in jars)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def archive_dir() -> Path:
    from lakemirror.daemon.jars import cache_root

    env = os.environ.get("LAKEMIRROR_CLASS_ARCHIVE_DIR")
    return Path(env) if env else cache_root() / "class-archive"


def archive_path(java_version: str, jars: Sequence[str]) -> Path:
    """Where the archive of this JVM (``java_version``: its ``-version`` line), the installed Spark
    and Delta's ``jars`` is kept."""
    import pyspark

    java = os.path.realpath(shutil.which("java") or "java")
    key = archive_key(java_version, java, pyspark.__version__, jars)
    return archive_dir() / f"session-{key}.jsa"


def recorded_archive() -> Path:
    """Where the archive of this machine's JVM, Spark and Delta's cached jars is (or would be) kept."""
    from lakemirror.daemon.jars import jar_paths
    from lakemirror.daemon.java_check import check_java

    return archive_path(check_java(), jar_paths())


def java_options(archive: Path) -> str:
    """The driver's Java options that map ``archive`` where it exists; empty where it does not."""
    if not archive.is_file():
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def recorded_java_options() -> str:
    """The driver's Java options mapping the archive recorded for this machine's JVM, Spark and
    Delta's jars (empty without one): for a JVM started outside :func:`~.spark.local_session`, the
    Spark Connect server of ``scripts/connect-server.sh``."""
    return java_options(recorded_archive())


#: What the recording session does: the classes of a daemon's start and first batches.
def _record_workload(spark: object, folder: Path) -> None:
    from lakemirror.sql_exec import run_sql

    table = f"delta.`{folder / 'source'}`"
    replica = f"delta.`{folder / 'replica'}`"
    run_sql(spark, f"CREATE TABLE {table} (id BIGINT NOT NULL, v STRING, d DECIMAL(38, 6), t TIMESTAMP) "
                   "USING DELTA TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    run_sql(spark, f"INSERT INTO {table} VALUES (1, 'a', 1.5, TIMESTAMP'2026-01-01 00:00:00'), (2, 'b', NULL, NULL)")
    run_sql(spark, f"CREATE TABLE {replica} USING DELTA AS SELECT * FROM {table}")
    run_sql(spark, f"UPDATE {table} SET v = 'B' WHERE id = 2")
    run_sql(spark, f"DELETE FROM {table} WHERE id = 1")
    run_sql(spark, f"DESCRIBE DETAIL {table}").collect()
    run_sql(spark, f"DESCRIBE HISTORY {table}").collect()
    for version in (2, 3):  # the update, then the delete: one change per key each, as a batch holds them
        changes = (spark.read.format("delta").option("readChangeFeed", "true")  # type: ignore[attr-defined]
                   .option("startingVersion", str(version)).option("endingVersion", str(version))
                   .load(str(folder / "source")))
        changes.createOrReplaceTempView("lakemirror_changes")
        run_sql(spark, f"MERGE INTO {replica} r USING (SELECT * FROM lakemirror_changes WHERE _change_type <> "
                       "'update_preimage') c ON r.id = c.id WHEN MATCHED AND c._change_type = 'delete' THEN DELETE "
                       "WHEN MATCHED THEN UPDATE SET r.v = c.v WHEN NOT MATCHED AND c._change_type <> 'delete' "
                       "THEN INSERT (id, v, d, t) VALUES (c.id, c.v, c.d, c.t)")

    def apply(batch: object, batch_id: int) -> None:
        batch.count()  # type: ignore[attr-defined]

    stream = (spark.readStream.format("delta").option("readChangeFeed", "true")  # type: ignore[attr-defined]
              .option("startingVersion", "0").load(str(folder / "source")))
    query = (stream.writeStream.foreachBatch(apply).trigger(availableNow=True)
             .option("checkpointLocation", str(folder / "stream-offsets")).start())
    query.awaitTermination()


def record(target: Path) -> None:
    """In this process: a session whose JVM writes the archive to ``target`` when it exits."""
    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.spark import local_session

    rt = RuntimeSettings(spark_conf={"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={target}"})
    spark = local_session(rt, class_archive=False)
    with tempfile.TemporaryDirectory(prefix="lakemirror-class-archive-") as folder:
        _record_workload(spark, Path(folder))
    spark.stop()


def build(force: bool = False, timeout: float = 900.0) -> tuple[Path, bool]:
    """Record the archive of this machine's JVM, Spark and jars unless it exists (``force``: again);
    (its path, whether it was written now). Raises with the child's last lines when it fails."""
    target = recorded_archive()
    if target.is_file() and not force:
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    try:
        done = subprocess.run([sys.executable, "-m", "lakemirror.daemon.class_archive", str(partial)],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0 or not partial.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise RuntimeError(f"recording the class archive failed (exit {done.returncode}): {tail}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    for stale in target.parent.glob("session-*.jsa"):  # archives of a JVM, Spark or jars no longer installed
        if stale != target:
            stale.unlink(missing_ok=True)
    return target, True


if __name__ == "__main__":
    record(Path(sys.argv[1]))
