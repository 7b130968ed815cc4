"""The lag probe's history read finds the oldest unapplied commit even while the source commits."""

from __future__ import annotations

from lakemirror.sources.change_feed import head_from_history
from lakemirror.sources.retention import RetentionWindow, headroom_seconds

NOW = 1_000_000.0


class Log:
    """A source's history; each read may first see ``commits_per_read`` new commits land."""

    def __init__(self, first: int, latest: int, commits_per_read: int = 0) -> None:
        self.first, self.latest, self.commits_per_read, self.reads = first, latest, commits_per_read, 0

    def newest(self, n: int) -> dict[int, float]:
        if self.reads:  # the first read sees the log as it is; commits land between reads
            self.latest += self.commits_per_read
        self.reads += 1
        low = max(self.first, self.latest - n + 1)
        return {v: NOW - 100.0 + v * 0.01 for v in range(low, self.latest + 1)}


def test_a_commit_between_the_two_reads_does_not_hide_the_needed_commit() -> None:
    log = Log(first=0, latest=200, commits_per_read=20)  # a burst of commits during each read
    head = head_from_history(log.newest, since_version=10, window=32)
    assert 11 in head.commit_times
    headroom = headroom_seconds(applied_through=10, latest_version=head.latest_version,
                                commit_times=head.commit_times, window=RetentionWindow(), now=NOW)
    assert headroom > 6 * 86400  # the window is a week and the commit is 100 s old: not "closes in 0s"


def test_a_commit_the_log_no_longer_holds_is_reported_missing() -> None:
    log = Log(first=50, latest=200)  # versions before 50 were cleaned up
    head = head_from_history(log.newest, since_version=10, window=32)
    assert 11 not in head.commit_times and head.latest_version == 200
    assert log.reads == 2  # one read back, no retries: nothing committed meanwhile


def test_a_caught_up_table_reads_only_the_newest_commits() -> None:
    log = Log(first=0, latest=200)
    head = head_from_history(log.newest, since_version=200, window=2)
    assert log.reads == 1 and head.latest_version == 200
