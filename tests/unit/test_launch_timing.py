"""supervisor.change_feed.launch_timing: a launch's steps timed on an injected clock, and the lines that say
so (pure)."""

from __future__ import annotations

from lakemirror.supervisor.change_feed.launch_timing import LaunchTimer, first_batch_line


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_step_lasts_from_the_previous_mark_to_its_own() -> None:
    clock = Clock()
    timer = LaunchTimer(clock)
    clock.now = 100.2
    timer.mark("record")
    clock.now = 102.0
    timer.mark("describe")
    clock.now = 102.5
    timer.mark("stream")
    clock.now = 110.0  # the time since the last mark is no step's
    assert [(name, round(s, 3)) for name, s in timer.steps] == [("record", 0.2), ("describe", 1.8), ("stream", 0.5)]
    assert timer.started == 100.0 and timer.last_mark == 102.5
    assert timer.describe() == "2.5s (record 0.2s, describe 1.8s, stream 0.5s)"


def test_a_launch_without_steps_is_its_total_alone() -> None:
    assert LaunchTimer(Clock()).describe() == "0.0s"


def test_the_first_batch_line_splits_the_wait_for_the_batch_from_its_apply() -> None:
    line = first_batch_line("src.s.t", 3, launch_began=100.0, stream_started=104.0, apply_began=109.5, ended=110.0)
    assert line == ("table src.s.t: first batch 3 applied 10.0s after the launch began; 5.5s from the stream's "
                    "start to the apply, the apply 0.5s")
    unknown = first_batch_line("src.s.t", 0, launch_began=100.0, stream_started=None, apply_began=101.0, ended=101.2)
    assert unknown == "table src.s.t: first batch 0 applied 1.2s after the launch began, the apply 0.2s"
