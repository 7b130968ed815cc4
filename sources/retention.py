"""How long until a source version the replica still needs can disappear (Delta's VACUUM and log
cleanup): past that, the stream that needs it fails and the table has to be resynced.

A change-feed reader needs, for every version it has not applied yet, the commit's log entry and
the data (or ``_change_data``) files it points to. Both have a retention clock:

- ``delta.deletedFileRetentionDuration`` (default 7 days): VACUUM may delete a file this long after
  a later commit removed it. A file added by version v can be removed at the earliest by the next
  commit, so the files of v are safe until at least ``commit_time(v) + deletedFileRetention``.
- ``delta.logRetentionDuration`` (default 30 days): log entries older than this may be cleaned up
  when a checkpoint is written.

The headroom of a table is therefore the time left until the earlier of the two for the OLDEST
version not yet applied: ``commit_time(v) + min(both) - now``. When the replica is caught up, the
next needed version is not even committed, and the headroom is the whole window. Pure: no Spark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"
LOG_RETENTION = "delta.logRetentionDuration"
DEFAULT_DELETED_FILE_RETENTION_SECONDS = 7 * 86400.0
DEFAULT_LOG_RETENTION_SECONDS = 30 * 86400.0

_UNITS = {
    "week": 604800.0, "day": 86400.0, "hour": 3600.0, "minute": 60.0, "second": 1.0,
    "millisecond": 1e-3, "microsecond": 1e-6,
}
_PART = re.compile(r"(-?\d+(?:\.\d+)?)\s*([a-z]+)")


def parse_interval(text: str) -> float:
    """Seconds of a Delta interval such as ``interval 7 days`` or ``interval 1 day 12 hours``."""
    raw = text.strip().lower()
    body = raw[len("interval"):].strip() if raw.startswith("interval") else raw
    parts = _PART.findall(body)
    if not parts or _PART.sub("", body).strip():
        raise ValueError(f"not a Delta interval: {text!r} (expected e.g. 'interval 7 days')")
    total = 0.0
    for number, unit in parts:
        key = unit[:-1] if unit.endswith("s") and unit[:-1] in _UNITS else unit
        if key not in _UNITS:
            raise ValueError(f"unknown unit {unit!r} in interval {text!r}")
        total += float(number) * _UNITS[key]
    return total


@dataclass(frozen=True)
class RetentionWindow:
    deleted_file_retention_seconds: float = DEFAULT_DELETED_FILE_RETENTION_SECONDS
    log_retention_seconds: float = DEFAULT_LOG_RETENTION_SECONDS

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> "RetentionWindow":
        """From a table's properties; an unparsable value keeps the (safer) shorter default."""
        def read(name: str, default: float) -> float:
            value = properties.get(name)
            if value is None:
                return default
            try:
                return parse_interval(value)
            except ValueError:
                return min(default, DEFAULT_DELETED_FILE_RETENTION_SECONDS)
        return cls(read(DELETED_FILE_RETENTION, DEFAULT_DELETED_FILE_RETENTION_SECONDS),
                   read(LOG_RETENTION, DEFAULT_LOG_RETENTION_SECONDS))

    @property
    def seconds(self) -> float:
        return min(self.deleted_file_retention_seconds, self.log_retention_seconds)

    @property
    def limiting_property(self) -> str:
        """The table property that sets :attr:`seconds` (the deleted-file retention on a tie: Delta
        refuses reads past it)."""
        if self.log_retention_seconds < self.deleted_file_retention_seconds:
            return LOG_RETENTION
        return DELETED_FILE_RETENTION


def headroom_seconds(*, applied_through: int, latest_version: int, commit_times: Mapping[int, float],
                     window: RetentionWindow, now: float) -> float:
    """Seconds until the oldest unapplied version may be vacuumed or log-cleaned (0 = may be gone).

    ``commit_times`` must hold the commit time of ``applied_through + 1`` when behind; when it does
    not (the log entry is already gone), the headroom is 0.
    """
    if latest_version <= applied_through:
        return window.seconds
    committed = commit_times.get(applied_through + 1)
    if committed is None:
        return 0.0
    return max(0.0, committed + window.seconds - now)


#: Delta's error class for a read it refuses at a version past the source's deleted-file retention.
TIME_TRAVEL_REFUSED = "DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION"


def time_travel_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is Delta refusing to read a version.

    Delta 4 refuses ``VERSION AS OF v`` when ``v`` is not the table's latest version and its commit
    is older than ``delta.deletedFileRetentionDuration``, whether or not ``v``'s files are still
    there: a table idle for longer than its retention can be read at its latest version until the
    next commit lands, and not at that version after it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if TIME_TRAVEL_REFUSED in str(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
