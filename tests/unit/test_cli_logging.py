"""The daemon's log: what is an error and what is not."""

from __future__ import annotations


def test_a_batch_refused_by_the_drain_is_not_logged_as_an_error_but_other_batch_errors_are() -> None:
    import logging
    import sys

    from lakemirror.daemon.cli import DrainRefusals
    from lakemirror.supervisor.change_feed.table_runner import Drained

    def record(exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException:  # noqa: BLE001
            info = sys.exc_info()
        return logging.LogRecord("py4j.clientserver", logging.ERROR, __file__, 1,
                                 "There was an exception while executing the Python Proxy on the Python Side.",
                                 None, info)

    refusals = DrainRefusals()
    assert not refusals.filter(record(Drained("src.s.t: draining; batch 3 left for the next run")))
    assert refusals.filter(record(RuntimeError("MERGE failed")))


def test_the_daemon_hands_freed_arrow_memory_back_unless_told_otherwise(monkeypatch) -> None:
    """The system allocator for Arrow: set before pyarrow loads, never over a user's own choice."""
    import os

    from lakemirror.daemon import cli

    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "")  # recorded, so the test leaves the variable as it was
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL")
    try:
        cli.main(["no-such-command"])
    except SystemExit:
        pass
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    try:
        cli.main(["no-such-command"])
    except SystemExit:
        pass
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
