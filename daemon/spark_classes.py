"""Whether the JVM classes a Spark conf names exist in the jars a local session loads.

``spark.sql.extensions`` set to a class that is in no jar passed ``lakemirror validate`` and then
failed at start with Spark's ``ClassNotFoundException``, which names no setting. In local mode the
session's class path is known before it starts: Spark's own jars (pyspark's ``jars`` folder), the
cached jars lakemirror loads (:mod:`lakemirror.daemon.jars`) and the local files of the user's
``spark.jars``. A class named by a conf (:func:`lakemirror.daemon.spark_conf_rules.classes`) that is
in none of them is a problem for that conf. The check is skipped, saying nothing, when the class path
is not all known: jars not cached yet (the start-up check reports that), ``spark.jars.packages``,
or a ``spark.jars`` entry that is not a local file.
"""

from __future__ import annotations

import importlib.util
import struct
import zipfile
from pathlib import Path
from typing import Iterable, Mapping

from lakemirror.daemon import spark_conf_rules
from lakemirror.daemon.jars import OPTIONAL_PACKAGES, JarsMissing, jar_paths


def spark_jars_folder() -> Path | None:
    """pyspark's ``jars`` folder (found without importing pyspark), or None."""
    spec = importlib.util.find_spec("pyspark")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    folder = Path(locations[0]) / "jars" if locations else None
    return folder if folder is not None and folder.is_dir() else None


def class_path(jars_dir: str | None, spark_jars: str | None) -> list[Path] | None:
    """Every jar of a local session, lakemirror's and the user's first; None when not all are known."""
    try:
        ours = [Path(p) for p in jar_paths(jars_dir)]
    except JarsMissing:
        return None
    for group in OPTIONAL_PACKAGES:
        try:
            ours += [Path(p) for p in jar_paths(jars_dir, group)]
        except JarsMissing:
            pass  # an optional group absent: its classes are not on the class path
    users = []
    for entry in (e.strip() for e in (spark_jars or "").split(",") if e.strip()):
        local = Path(entry[len("file:"):] if entry.startswith("file:") else entry)
        if ("://" in entry and not entry.startswith("file:")) or not local.is_file():
            return None
        users.append(local)
    spark = spark_jars_folder()
    if spark is None:
        return None
    return users + ours + sorted(spark.glob("*.jar"))


def _central_directory(jar: Path) -> bytes | None:
    """The raw central directory of a zip file (its list of entry names), or None when it cannot
    be found simply (then :mod:`zipfile` reads the file)."""
    with open(jar, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 65_557))
        tail = f.read()
        end = tail.rfind(b"PK\x05\x06")
        if end < 0 or len(tail) < end + 22:
            return None
        cd_size, cd_offset = struct.unpack("<II", tail[end + 12:end + 20])
        if cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:  # zip64: its own record says where
            locator = tail.rfind(b"PK\x06\x07", 0, end)
            if locator < 0:
                return None
            (record,) = struct.unpack("<Q", tail[locator + 8:locator + 16])
            f.seek(record)
            head = f.read(56)
            if head[:4] != b"PK\x06\x06":
                return None
            cd_size, cd_offset = struct.unpack("<QQ", head[40:56])
        f.seek(cd_offset)
        return f.read(cd_size)


def _named(directory: bytes, name: bytes) -> bool:
    """Whether a file header of the central directory names exactly ``name``: the name follows the
    header's 46 bytes, which start with its signature and give the name's length."""
    at = directory.find(name)
    while at >= 0:
        header = at - 46
        if header >= 0 and directory[header:header + 4] == b"PK\x01\x02" \
                and struct.unpack("<H", directory[header + 28:header + 30])[0] == len(name):
            return True
        at = directory.find(name, at + 1)
    return False


def _holds(jar: Path, entries: Iterable[str]) -> set[str]:
    """Which of ``entries`` (``a/b/C.class``) the jar has."""
    try:
        directory = _central_directory(jar)
        if directory is not None:
            return {e for e in entries if _named(directory, e.encode())}
        with zipfile.ZipFile(jar) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile, struct.error):
        return set()
    return {e for e in entries if e in names}


def missing(wanted: Iterable[str], jars: Iterable[Path]) -> list[str]:
    """The classes of ``wanted`` that no jar of ``jars`` holds (each jar's list of entries is read
    only while some class is still unfound)."""
    left = {name: name.replace(".", "/") + ".class" for name in wanted}
    for jar in jars:
        if not left:
            break
        found = _holds(jar, left.values())
        left = {name: entry for name, entry in left.items() if entry not in found}
    return sorted(left)


def missing_class_problems(spark_conf: Mapping[str, str], jars_dir: str | None) -> list[tuple[str, str]]:
    """``(conf, message)`` for each class a conf names that a local session could not load."""
    named = [(key, name) for key, value in spark_conf.items() for name in spark_conf_rules.classes(key, value)]
    if not named or "spark.jars.packages" in spark_conf:
        return []
    jars = class_path(jars_dir, spark_conf.get("spark.jars"))
    if jars is None:
        return []
    absent = set(missing({name for _, name in named}, jars))
    return [(key, f"{key}: the class {name} is in no jar of the session (Spark's own, lakemirror's cached jars, "
                  f"spark.jars); check its spelling, or add its jar to spark.jars")
            for key, name in named if name in absent]
