"""Delta's jars: resolved from Maven Central once, then used offline from a local folder.

``lakemirror fetch-jars`` (run by ``make setup``) asks Spark's own Ivy resolver for the
packages below and copies the resulting jars into the jars directory with a manifest. Every later
session loads them with ``spark.jars``: no network at start, no Ivy at run time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

SPARK_VERSION = "4.2.0"
DELTA_VERSION = "4.4.0"
SCALA = "2.13"
SPARK_MINOR = ".".join(SPARK_VERSION.split(".")[:2])

PACKAGES = {
    "delta": [f"io.delta:delta-spark_{SPARK_MINOR}_{SCALA}:{DELTA_VERSION}"],
    "kafka": [f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK_VERSION}"],
}
MANIFEST = "lakemirror-jars.json"


class JarsMissing(RuntimeError):
    pass


def default_jars_dir() -> Path:
    env = os.environ.get("LAKEMIRROR_JARS_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "lakemirror" / f"jars-spark{SPARK_VERSION}-delta{DELTA_VERSION}"


def jar_paths(jars_dir: str | Path | None = None) -> list[str]:
    """The cached jars, or :class:`JarsMissing` saying how to fetch them."""
    folder = Path(jars_dir) if jars_dir else default_jars_dir()
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise JarsMissing(
            f"Delta's jars are not in {folder}. Run `lakemirror fetch-jars` (or `make setup`) once "
            f"with access to Maven Central; later runs work offline.")
    names = json.loads(manifest.read_text())["jars"]
    paths = [str(folder / n) for n in names]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise JarsMissing(f"{len(missing)} jar(s) listed in {manifest} are missing, e.g. {missing[0]}; "
                          f"run `lakemirror fetch-jars` again")
    return paths


def fetch(jars_dir: str | Path | None = None, groups: tuple[str, ...] = ("delta", "kafka")) -> Path:
    """Resolve the packages with Spark's Ivy (network needed once) and copy them to ``jars_dir``."""
    from pyspark.sql import SparkSession

    folder = Path(jars_dir) if jars_dir else default_jars_dir()
    coords = [c for g in groups for c in PACKAGES[g]]
    with tempfile.TemporaryDirectory(prefix="lakemirror-ivy-") as ivy:
        spark = (SparkSession.builder.master("local[1]").appName("lakemirror-fetch-jars")
                 .config("spark.ui.enabled", "false")
                 .config("spark.jars.packages", ",".join(coords))
                 .config("spark.jars.ivy", ivy).getOrCreate())
        spark.stop()
        resolved = sorted(Path(ivy, "jars").glob("*.jar"))
        if not resolved:
            raise JarsMissing(f"Ivy resolved no jars for {coords}; is Maven Central reachable?")
        folder.mkdir(parents=True, exist_ok=True)
        for jar in resolved:
            shutil.copy2(jar, folder / jar.name)
    (folder / MANIFEST).write_text(json.dumps(
        {"packages": coords, "jars": [j.name for j in resolved]}, indent=2))
    return folder
