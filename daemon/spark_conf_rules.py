"""The Spark confs lakemirror's own session depends on, and how a user's ``runtime.spark_conf``
combines with them. Pure.

A session applies lakemirror's confs first and the user's after, so a user's value used to replace
lakemirror's silently: ``spark.sql.extensions`` set to another extension dropped Delta's (every
``MERGE`` then failed), and ``spark.jars`` dropped Delta's jars. Now:

- confs that hold lists (:data:`MERGED`) are joined: lakemirror's entries first, then the user's
  that are not already there;
- confs whose value lakemirror needs as it is (:data:`REQUIRED`) are refused at validate when the
  user gives another value, saying why;
- every other conf the user sets wins, as before (``spark.sql.shuffle.partitions`` and the like are
  tuning, checked like the field they override: :mod:`lakemirror.daemon.spark_values`).
"""

from __future__ import annotations

import re
from typing import Mapping

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

#: Confs whose value lakemirror needs as it is: (the value, why).
REQUIRED: dict[str, tuple[str, str]] = {
    "spark.sql.catalog.spark_catalog": (DELTA_CATALOG, "lakemirror reads and writes Delta tables through Delta's "
                                        "catalog"),
    "spark.sql.session.timeZone": ("UTC", "Spark reads a timestamp without a zone in the session's time zone, and "
                                   "a replica must not shift with where the daemon runs"),
}
#: Confs that hold lists, with their separator: lakemirror's entries are kept, the user's added.
MERGED: dict[str, str] = {
    "spark.sql.extensions": ",",
    "spark.jars": ",",
    "spark.driver.extraJavaOptions": " ",
}
#: Confs whose value is a comma-separated list of JVM class names.
CLASS_LISTS = ("spark.sql.extensions", "spark.plugins", "spark.extraListeners", "spark.sql.queryExecutionListeners",
               "spark.sql.streaming.streamingQueryListeners", "spark.serializer", "spark.kryo.registrator")
_CATALOG = re.compile(r"^spark\.sql\.catalog\.[^.]+$")
_CLASS = re.compile(r"^[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*$")


def names_classes(key: str) -> bool:
    """Whether the conf's value names JVM classes (a list of them, or one catalog's class)."""
    return key in CLASS_LISTS or bool(_CATALOG.match(key))


def classes(key: str, value: str) -> list[str]:
    """The class names a conf's value gives (empty for a conf that names none)."""
    if not names_classes(key):
        return []
    return [c.strip() for c in value.split(",") if c.strip()]


def check(key: str, value: str) -> str:
    """``value`` for ``key`` if lakemirror's session can take it; else ``ValueError`` saying why."""
    required = REQUIRED.get(key)
    if required is not None and value.strip() != required[0]:
        raise ValueError(f"{key} must stay {required[0]}: {required[1]}; remove it from runtime.spark_conf")
    for name in classes(key, value):
        if not _CLASS.match(name):
            raise ValueError(f"{key}: {name[:100]!r} is not a Java class name (write package.Class, several "
                             f"separated by commas)")
    return value


def merge(ours: Mapping[str, str], users: Mapping[str, str]) -> dict[str, str]:
    """The session's confs: ``ours``, overridden by ``users``, except that the :data:`MERGED` lists
    keep every entry of ours (the user's entries follow, without repeats) and :data:`REQUIRED` keep
    ours (a different value is refused at validate: :func:`check`)."""
    out = {**ours, **users}
    for key, sep in MERGED.items():
        if key in ours and key in users:
            mine = [e.strip() for e in ours[key].split(sep) if e.strip()]
            theirs = [e.strip() for e in users[key].split(sep) if e.strip() and e.strip() not in mine]
            out[key] = sep.join(mine + theirs)
    for key in REQUIRED:
        if key in ours:
            out[key] = ours[key]
    return out
