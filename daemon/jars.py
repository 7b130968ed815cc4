"""Delta's jars: resolved from Maven Central once, then used offline from a local folder.

``lakemirror fetch-jars`` (run by ``make setup``) has Spark's own Ivy resolver fetch
:data:`MAVEN_PACKAGES` and their dependencies, then copies the jars into the jars directory with a
manifest. Every later session loads them with ``spark.jars``: no network at start, no Ivy at run
time.

The resolution uses the Ivy settings shipped beside this module (``ivysettings.xml``): Maven
Central over https is the only repository, so a stray POM in ``~/.m2`` or an unreachable
third-party host cannot break or clutter it. Ivy runs in a ``spark-submit`` child whose output is
kept in a log file; on failure :class:`FetchFailed` carries one line with the cause (the artifact,
the URL tried, the network error) and the log's path.

Optional groups (:data:`OPTIONAL_PACKAGES`) are resolved by the same command into a subfolder of
their own, with their own manifest, and a session loads them only when a setting needs them:
hadoop-aws and the AWS SDK v2 bundle it pulls (about 690 MB) when a location is ``s3a://``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

SPARK_VERSION = "4.2.0"
DELTA_VERSION = "4.4.0"
SCALA = "2.13"
SPARK_MINOR = ".".join(SPARK_VERSION.split(".")[:2])

#: Every Maven package the daemon's sessions load, one coordinate per line (group:artifact:version);
#: their dependencies come along. Adding a line here is enough: a manifest fetched for another list
#: is stale, so ``make setup`` fetches again.
MAVEN_PACKAGES: tuple[str, ...] = (
    f"io.delta:delta-spark_{SPARK_MINOR}_{SCALA}:{DELTA_VERSION}",  # Delta Lake
    f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK_VERSION}",  # Kafka source
)
#: The Hadoop that pyspark 4.2 ships; hadoop-aws must match it exactly.
HADOOP_VERSION = "3.5.0"
#: Optional groups, each fetched into ``<jars dir>/<group>/`` with its own manifest and loaded only
#: when needed: ``s3`` (S3 through ``s3a://``) when a location or conf of the session names it.
OPTIONAL_PACKAGES: dict[str, tuple[str, ...]] = {
    "s3": (f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",),  # pulls the AWS SDK v2 bundle
}
MANIFEST = "lakemirror-jars.json"
IVY_SETTINGS = Path(__file__).with_name("ivysettings.xml")


class JarsMissing(RuntimeError):
    pass


class FetchFailed(RuntimeError):
    """The resolution failed; ``str()`` is one line with the cause and where the full log is."""


@dataclass(frozen=True)
class Resolution:
    """What one resolution retrieved and Ivy's own output (its resolution messages and report)."""

    jars: tuple[Path, ...]
    log: str


def cache_root() -> Path:
    return Path.home() / ".cache" / "lakemirror"


def default_jars_dir() -> Path:
    env = os.environ.get("LAKEMIRROR_JARS_DIR")
    if env:
        return Path(env)
    return cache_root() / f"jars-spark{SPARK_VERSION}-delta{DELTA_VERSION}"


def default_ivy_cache() -> Path:
    """Ivy's download cache, kept between fetches so that a second fetch needs no download."""
    env = os.environ.get("LAKEMIRROR_IVY_CACHE")
    return Path(env) if env else cache_root() / "ivy"


def group_dir(jars_dir: str | Path | None, group: str | None = None) -> Path:
    """Where a group's jars live: the jars directory itself for :data:`MAVEN_PACKAGES`, a
    subfolder for an optional group."""
    folder = Path(jars_dir) if jars_dir else default_jars_dir()
    return folder / group if group else folder


def jar_paths(jars_dir: str | Path | None = None, group: str | None = None) -> list[str]:
    """The cached jars (of :data:`MAVEN_PACKAGES`, or of the optional ``group``), or
    :class:`JarsMissing` saying how to fetch them."""
    folder = group_dir(jars_dir, group)
    packages = OPTIONAL_PACKAGES[group] if group else MAVEN_PACKAGES
    manifest = folder / MANIFEST
    if not manifest.is_file():
        what = f"The {group!r} jars ({', '.join(packages)})" if group else "Delta's jars"
        raise JarsMissing(
            f"{what} are not in {folder}. Run `lakemirror fetch-jars` (or `make setup`) once "
            f"with access to Maven Central; later runs work offline.")
    content = json.loads(manifest.read_text())
    fetched = content.get("packages", [])
    if sorted(fetched) != sorted(packages):
        absent = sorted(set(packages) - set(fetched))
        raise JarsMissing(f"the jars in {folder} were fetched for another package list (missing: "
                          f"{', '.join(absent) or 'none'}); run `lakemirror fetch-jars` again")
    paths = [str(folder / n) for n in content["jars"]]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise JarsMissing(f"{len(missing)} jar(s) listed in {manifest} are missing, e.g. {missing[0]}; "
                          f"run `lakemirror fetch-jars` again")
    return paths


def resolve(coordinates: Sequence[str], ivy_cache: Path, work_dir: Path,
            env: Mapping[str, str] | None = None) -> Resolution:
    """Resolve ``coordinates`` with Spark's Ivy and :data:`IVY_SETTINGS`, retrieving the jars into
    ``work_dir/jars``; :class:`FetchFailed` with one line if anything cannot be fetched.

    ``env`` replaces the child's environment (the tests give it another home); Java options in its
    ``SPARK_SUBMIT_OPTS`` reach the JVM that resolves.
    """
    from pyspark.find_spark_home import _find_spark_home

    spark_home = _find_spark_home()
    ivy_cache.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    # spark-submit resolves --packages before it runs anything; an empty script then ends the JVM.
    script = work_dir / "resolved.py"
    script.write_text("")
    child_env = dict(os.environ if env is None else env)
    child_env.update(SPARK_HOME=spark_home, PYSPARK_PYTHON=sys.executable)
    command = [
        os.path.join(spark_home, "bin", "spark-submit"), "--master", "local[1]",
        "--conf", "spark.ui.enabled=false",
        "--conf", f"spark.jars.ivySettings={IVY_SETTINGS}",
        # Spark's Ivy user dir: the jars are retrieved to work_dir/jars and its resolution files kept
        # there; the downloads go to the settings' own cache, ${lakemirror.ivy.cache}.
        "--conf", f"spark.jars.ivy={work_dir}",
        "--driver-java-options", f"-Dlakemirror.ivy.cache={ivy_cache}",
        "--packages", ",".join(coordinates), str(script)]
    proc = subprocess.run(command, env=child_env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, check=False)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        log_file = ivy_cache / "fetch-jars.log"
        log_file.write_text(log)
        raise FetchFailed(f"{failure_summary(log)} (full log: {log_file})")
    return Resolution(tuple(sorted(Path(work_dir, "jars").glob("*.jar"))), log)


def failure_summary(log: str) -> str:
    """One line from a failed resolution's output: what failed, the first URL tried, and the
    network error if Ivy met one."""
    cause = None
    for line in log.splitlines():
        match = re.match(r'Exception in thread "main" [\w.$]+: (.*)', line.strip())
        if match:
            cause = match.group(1).strip().strip("[]")
            break
    if cause is None:
        lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
        cause = lines[-1] if lines else "spark-submit exited without output"
    parts = [f"could not fetch the jars from Maven Central: {cause}"]
    tried = re.search(r"^\s*(?:====\s*\S+: tried|-- artifact \S+:)\s*\n\s*(\S+:/\S+)", log, re.MULTILINE)
    if tried:
        parts.append(f"tried {tried.group(1)}")
    network = re.search(r"^\s*((?:Host \S+ not found|Server access error|[\w.]*(?:UnknownHost|Connect|"
                        r"SocketTimeout|SSL\w*)Exception)[^\n]*)", log, re.MULTILINE)
    if network:
        parts.append(network.group(1).strip())
    return "; ".join(parts)


def fetch(jars_dir: str | Path | None = None, packages: Sequence[str] = MAVEN_PACKAGES,
          ivy_cache: Path | None = None) -> Path:
    """Resolve ``packages`` from Maven Central (network needed once) and copy the jars and a
    manifest to ``jars_dir``."""
    folder = Path(jars_dir) if jars_dir else default_jars_dir()
    with tempfile.TemporaryDirectory(prefix="lakemirror-ivy-") as work:
        resolution = resolve(packages, ivy_cache or default_ivy_cache(), Path(work))
        if not resolution.jars:
            raise FetchFailed(f"Ivy resolved no jars for {', '.join(packages)}")
        folder.mkdir(parents=True, exist_ok=True)
        for jar in resolution.jars:
            shutil.copy2(jar, folder / jar.name)
    (folder / MANIFEST).write_text(json.dumps(
        {"packages": list(packages), "jars": [j.name for j in resolution.jars]}, indent=2))
    return folder


def fetch_missing(jars_dir: str | Path | None = None, refresh: bool = False) -> list[Path]:
    """Fetch :data:`MAVEN_PACKAGES`, then each optional group, whose cache is missing, stale or
    incomplete (every one with ``refresh``); the folders written."""
    written = []
    for group, packages in ((None, MAVEN_PACKAGES), *OPTIONAL_PACKAGES.items()):
        if not refresh:
            try:
                jar_paths(jars_dir, group)
                continue
            except JarsMissing:
                pass
        written.append(fetch(group_dir(jars_dir, group), packages))
    return written
