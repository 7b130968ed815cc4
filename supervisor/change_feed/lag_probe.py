"""One table's lag probe: reads the source's head and prices the applied version (:mod:`..control.lag`).

The head comes from the source's commit files where they can be read directly (no Spark job;
:func:`~lakemirror.sources.head_probe.probe_head`, with commit times cached across probes), else
from the source's history (:meth:`~lakemirror.sources.contract.ChangeSource.head`). The probe
also prices the change window left (:mod:`lakemirror.sources.retention`) and warns once each time
it runs low.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any, Callable

from lakemirror.sources.change_feed import SourceHead
from lakemirror.delta_log.commit_times import CommitLog
from lakemirror.sources.head_probe import probe_head
from lakemirror.sources.contract import ChangeSource
from lakemirror.sources.retention import RetentionWindow, headroom_seconds
from lakemirror.supervisor.control.lag import LagReading, compute_lag

log = logging.getLogger(__name__)

#: The most commits a probe reads back from the source's head.
MAX_WINDOW = 32
#: How many probes in a row may walk from a cached newest version without looking at its commit file
#: again, where a look is a request to an object store: the look finds a table recreated under the
#: same path with fewer versions (the probe then reads the history), and costs a request per table
#: per interval; one probe in this many makes it.
RESTAT_START_EVERY = 10
#: How long an answer of :meth:`LagProbe.committed_at` that a version is not committed stands: a
#: scrape and a status request asking at once cost one ``stat``.
NOT_COMMITTED_STANDS_SECONDS = 0.25


class LagProbe:
    """Lag readings of one table's replica against its source."""

    def __init__(self, source: ChangeSource[Any], label: str, warning_seconds: float) -> None:
        self.source = source
        self.label = label
        self.warning_seconds = warning_seconds
        self.last: LagReading | None = None
        self._commit_log: CommitLog | None = None  # None: not opened yet, or unavailable
        self._commit_log_opened = False
        self._commit_times: dict[int, float] = {}
        self._known_latest: int | None = None
        self._headroom_low = False
        self._probes = 0  # probes read from the commit files (RESTAT_START_EVERY)
        # committed_at's answers (asked from the threads of /metrics and the status API)
        self._asked = threading.Lock()
        self._committed: tuple[int, float] | None = None
        self._not_committed: tuple[int, float] | None = None  # (version, when it was looked for)

    def reset(self) -> None:
        """Forget what earlier probes learned (a resync: the next epoch may read another table)."""
        self.last = None
        self._commit_log, self._commit_log_opened = None, False
        self._commit_times, self._known_latest = {}, None
        with self._asked:
            self._committed, self._not_committed = None, None

    def committed_at(self, version: int, clock: Callable[[], float] = time.monotonic) -> float | None:
        """When ``version`` was committed, looked at in its commit file (None: not committed, or the
        commit files are not open: before the first probe, or where they cannot be read directly).
        Asked of the version after the one applied, when a reading says the replica is caught up.

        On the driver's own file system the commit file is looked at (one ``stat``). On an object
        store this is asked at every scrape and status request, and a look for a version nobody has
        seen committed would be a request per caught-up table that the scrape waits for: there only
        a version another look has already found (the turn pool's, several times a turn interval for
        an idle table) is priced, once (its file's status and first line), and one not yet found
        waits for the next probe (``lag_interval_seconds``)."""
        log_ = self._commit_log
        if log_ is None:
            return None
        if not getattr(log_, "answers_locally", False):
            known_committed = getattr(log_, "known_committed", None)
            if known_committed is None or not known_committed(version):
                return None
        with self._asked:
            if self._committed is not None and self._committed[0] == version:
                return self._committed[1]
            missing = self._not_committed
            if missing is not None and missing[0] == version and clock() - missing[1] < NOT_COMMITTED_STANDS_SECONDS:
                return None
            try:
                at = log_.commit_time(version)
            except Exception as exc:  # noqa: BLE001 (the probe's own reading stands)
                log.debug("table %s: looking for version %d: %s", self.label, version, exc)
                at = None
            if at is None:
                self._not_committed = (version, clock())
            else:
                self._committed = (version, at)
            return at

    def commit_files(self) -> CommitLog | None:
        """The source's commit files, opened once; None where they cannot be read directly."""
        if not self._commit_log_opened:
            self._commit_log, self._commit_log_opened = self.source.commit_log(), True
        return self._commit_log

    def probe(self, through: int, retention: RetentionWindow | None, now: float) -> LagReading:
        """The lag of a replica that holds every version up to ``through``; ``retention``: the
        source's change window (None: not known yet, no headroom reported)."""
        # Read only as many of the newest commits as the table was behind at the last probe (plus
        # two): a caught-up table reads 2 commit files per probe instead of 32.
        window = MAX_WINDOW if self.last is None else min(MAX_WINDOW, self.last.versions_behind + 2)
        head = self._head_from_commit_files(through) or self.source.head(through, window=window)
        self._known_latest = head.latest_version
        times = dict(head.commit_times)
        # The commit times the probe walked past (commit files) are kept with the reading, so that a
        # batch landing before the next probe reprices it without a read (LagReading.repriced).
        for version, at in self._commit_times.items():
            if through < version <= head.latest_version:
                times.setdefault(version, at)
        headroom = None if retention is None else headroom_seconds(
            applied_through=through, latest_version=head.latest_version, commit_times=times,
            window=retention, now=now)
        needed = through + 1
        if head.latest_version >= needed and needed not in times:
            # The needed commit is gone from the log: lag is at least the oldest commit still there.
            times[needed] = min(t for v, t in times.items() if v > through)
        reading = compute_lag(applied_through=through, latest_version=head.latest_version,
                              commit_times=times, now=now)
        self.last = replace(reading, retention_headroom_seconds=headroom)
        if headroom is not None:
            self._warn_on_headroom(headroom)
        return self.last

    def _head_from_commit_files(self, through: int) -> SourceHead | None:
        """The head read from the source's commit files (no Spark job), or None: use history."""
        log_ = self.commit_files()
        if log_ is None:
            return None
        self._probes += 1
        restat = getattr(log_, "answers_locally", False) or self._probes % RESTAT_START_EVERY == 1
        return probe_head(log_.commit_time, applied_through=through, known_latest=self._known_latest,
                          cache=self._commit_times, restat_start=restat)

    def _warn_on_headroom(self, headroom: float) -> None:
        low = headroom < self.warning_seconds
        if low and not self._headroom_low:
            log.warning("table %s: the change window closes in %.0fs: source versions the replica still needs "
                        "may be vacuumed or log-cleaned (raise delta.deletedFileRetentionDuration / "
                        "delta.logRetentionDuration on the source, or let the table catch up)",
                        self.label, headroom)
        self._headroom_low = low
