"""Upper bounds shared by the settings (the pipeline's and ``lakemirror replicate``'s) and the control
API: durations, names, paths and secrets. A value past them is refused at validate with the bound,
instead of overflowing later (a drain timeout of 1e10 seconds passed validation and crashed the
daemon at SIGTERM: no wait takes a timeout that large) or making every message that quotes it as
long as the value (a 40,000-character schema name).
"""

from __future__ import annotations

from typing import Final, Iterable

DAY: Final = 86400.0
#: Durations that bound a wait or an interval: at most a year.
YEAR: Final = 366 * DAY
#: Horizons and warnings measured against data retention: at most ten years.
DECADE: Final = 10 * YEAR
#: Catalog, schema, table and column names (Unity Catalog's limit is 255 characters).
MAX_NAME_CHARS: Final = 255
#: Local paths and URIs (Linux's PATH_MAX).
MAX_PATH_CHARS: Final = 4096
#: Values of Spark confs and Delta table properties.
MAX_VALUE_CHARS: Final = 16384
#: Secrets (tokens, passwords): longer than any a service issues.
MAX_SECRET_CHARS: Final = 16384


def bounded(value: str, what: str, limit: int, kind: str) -> str:
    """``value`` when it has at most ``limit`` characters; else ``ValueError`` naming ``what``, its
    length and the bound (never the value: it may be 40,000 characters, or a secret)."""
    if len(value) > limit:
        raise ValueError(f"{what} is {len(value)} characters long; {kind} has at most {limit}")
    return value


def name(value: str, what: str) -> str:
    """A catalog, schema, table, column or other object name: at most :data:`MAX_NAME_CHARS`."""
    return bounded(value, what, MAX_NAME_CHARS, "a name")


def names(values: Iterable[str], what: str) -> None:
    """:func:`name` for each of ``values``."""
    for value in values:
        name(value, what)


def path(value: str, what: str) -> str:
    """A local path, a URI or a URL: at most :data:`MAX_PATH_CHARS`."""
    return bounded(value, what, MAX_PATH_CHARS, "a path")


def secret(value: str, what: str) -> str:
    """A token or password: at most :data:`MAX_SECRET_CHARS`."""
    return bounded(value, what, MAX_SECRET_CHARS, "a secret")


def table_name(value: str, what: str) -> str:
    """A full table name ``catalog.schema.table``: each part a :func:`name`."""
    from lakemirror.identifiers import TableName

    bounded(value, what, 3 * MAX_NAME_CHARS + 8, "a full table name")  # three names, dots, quotes
    parsed = TableName.parse(value)
    for part, kind in ((parsed.catalog, "catalog"), (parsed.schema, "schema"), (parsed.table, "table")):
        name(part, f"the {kind} name of {what}")
    return value
