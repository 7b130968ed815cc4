"""bench.startup: a start's figures read from the daemon's log lines (pure)."""

from __future__ import annotations

from datetime import datetime

from bench.startup import STEP_NAMES, phases, summarize
from lakemirror.supervisor.change_feed.launch_timing import LaunchTimer, first_batch_line


def _line(at: float, text: str) -> str:
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]
    return f"{stamp} INFO lakemirror.x: {text}"


def _launch(steps: list[tuple[str, float]]) -> str:
    now = [0.0]
    timer = LaunchTimer(lambda: now[0])
    for name, seconds in steps:
        now[0] += seconds
        timer.mark(name)
    return timer.describe()


def test_the_log_lines_of_one_start_become_its_phases() -> None:
    t0 = 1_700_000_000.0
    log = "\n".join([
        _line(t0 + 2.0, "pipeline bench: serving http://127.0.0.1:1234/metrics"),
        "Setting default log level to \"ERROR\".",  # Spark's own lines have no stamp
        _line(t0 + 9.5, "Spark session (local mode) ready in 7.2s"),
        _line(t0 + 11.0, "checkpoint table dst.continuous_sync.checkpoints ready in 1.4s"),
        _line(t0 + 11.1, "table t00: added to the pipeline"),
        _line(t0 + 11.1, "table t01: added to the pipeline"),
        _line(t0 + 15.0, f"table src.bench.t00: stream started {_launch([('record', 0.1), ('describe', 2.0), ('replica', 1.0), ('stream', 0.8)])} after the launch began"),
        _line(t0 + 17.0, f"table src.bench.t01: stream started {_launch([('record', 0.2), ('describe', 3.0), ('replica', 1.5), ('stream', 1.2)])} after the launch began"),
        _line(t0 + 18.0, first_batch_line("src.bench.t00", 4, launch_began=t0 + 11.1, stream_started=t0 + 15.0,
                                          apply_began=t0 + 17.5, ended=t0 + 18.0)),
        _line(t0 + 20.0, first_batch_line("src.bench.t01", 2, launch_began=t0 + 11.1, stream_started=t0 + 17.0,
                                          apply_began=t0 + 19.0, ended=t0 + 20.0)),
    ])
    found = phases(log, t0)
    assert (found["http_at"], found["spark_at"], found["spark_seconds"]) == (2.0, 9.5, 7.2)
    assert (found["checkpoint_table_at"], found["checkpoint_table_seconds"]) == (11.0, 1.4)
    t00 = found["tables"]["t00"]
    assert t00["added_at"] == 11.1 and t00["stream_at"] == 15.0 and t00["launch_seconds"] == 3.9
    assert t00["steps"] == {"record": 0.1, "describe": 2.0, "replica": 1.0, "stream": 0.8}
    assert (t00["first_batch_at"], t00["wait_for_batch_seconds"], t00["apply_seconds"]) == (18.0, 2.5, 0.5)

    summary = summarize({"t00": 18.3, "t01": 20.4}, found)
    assert summary["every_table_ready_s"] == 20.4
    assert summary["ready_s"] == {"min": 18.3, "median": 19.35, "max": 20.4}
    assert summary["launch_steps"]["describe"] == {"min": 2.0, "median": 2.5, "max": 3.0}
    assert summary["stream_at"] == {"min": 15.0, "median": 16.0, "max": 17.0}
    assert summary["wait_for_batch_seconds"] == {"min": 2.0, "median": 2.25, "max": 2.5}
    assert set(summary["launch_steps"]) <= set(STEP_NAMES)


def test_a_start_whose_log_says_nothing_has_no_phases() -> None:
    found = phases("no stamped lines here\n", 0.0)
    assert found == {"tables": {}}
    summary = summarize({}, found)
    assert summary["every_table_ready_s"] is None and summary["stream_at"] is None
