"""When a bootstrapping table copies its source's change feed into its change log, and whether the
source keeps that feed long enough for the bootstrap to converge. Pure: time is passed in.

Delta refuses to read the change feed from a version that is not the table's latest and whose
commit is older than the table's ``delta.deletedFileRetentionDuration``
(``DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION``, checked when the read is
planned), and VACUUM and log cleanup may take it away after that retention. A bootstrap must
therefore read every change after its pinned version before that change is a *window* old. Planning
and copying chunks can take far longer than a short window (a minute, say), so the change feed is
captured beside them, on a thread of its own (:mod:`lakemirror.sinks.batch.change_capture`), at the
pace the window sets rather than between chunks:

- capture once the oldest change not yet captured has used ``headroom_fraction`` of the window;
- capture at once when the window would close within ``safety_factor`` times a capture's
  measured time;
- otherwise look again after the poll interval (``capture_poll_seconds``; by default an eighth of
  the window, between 0.5 s and 60 s), or when the oldest pending change becomes due.

A capture costs what its changes cost (they are appended to the change log; the replica is left
alone), so it keeps up with any source whose changes can be read faster than they are made. What
a bootstrap needs of the window is measured, not guessed: the oldest a change has been when its
capture began. A window shorter than ``safety_factor`` times that is at risk, and the bootstrap says
so, once, with the retention it needs (:func:`window_at_risk`, :func:`needed_window_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lakemirror.sinks.batch.bootstrap_plan import BootstrapPolicy

MIN_POLL_SECONDS = 0.5
MAX_POLL_SECONDS = 60.0


def poll_seconds(policy: BootstrapPolicy, window_seconds: float) -> float:
    """How often the capturer looks at the source's log."""
    if policy.capture_poll_seconds is not None:
        return policy.capture_poll_seconds
    return min(MAX_POLL_SECONDS, max(MIN_POLL_SECONDS, window_seconds * policy.headroom_fraction / 2))


@dataclass(frozen=True)
class CaptureStep:
    capture: bool
    wait_seconds: float   # not capturing: when to look again
    reason: str
    urgent: bool = False  # the window was about to close: worth a warning


def next_capture(policy: BootstrapPolicy, *, now: float, window_seconds: float, captured_through: int,
                 latest_version: int, oldest_pending_at: float | None, capture_seconds: float) -> CaptureStep:
    """What the capturer does next.

    ``captured_through``: the last version the change log holds; ``latest_version``: the source's;
    ``oldest_pending_at``: the commit time of ``captured_through + 1`` (None when the log no longer
    says); ``capture_seconds``: how long a capture has taken (0 before the first)."""
    poll = poll_seconds(policy, window_seconds)
    if latest_version <= captured_through:
        return CaptureStep(False, poll, "every committed change is captured")
    if oldest_pending_at is None:
        return CaptureStep(True, 0.0, f"the commit time of source version {captured_through + 1} is not in the "
                                      f"source's log: capturing at once", urgent=True)
    age = max(0.0, now - oldest_pending_at)
    left = window_seconds - age
    if left <= policy.safety_factor * capture_seconds:
        return CaptureStep(True, 0.0, f"the change window closes in {max(0.0, left):.0f}s, within "
                                      f"{policy.safety_factor:g}x a capture's {capture_seconds:.1f}s: capturing at once",
                           urgent=True)
    due = window_seconds * policy.headroom_fraction
    if age >= due:
        return CaptureStep(True, 0.0, f"the oldest change not captured is {age:.0f}s old, "
                                      f"{policy.headroom_fraction:.0%} of the {window_seconds:.0f}s change window")
    return CaptureStep(False, min(poll, due - age), f"the oldest change not captured is {age:.0f}s old")


def needed_window_seconds(policy: BootstrapPolicy, oldest_age_seconds: float) -> float:
    """The change window a bootstrap needs when changes have been up to ``oldest_age_seconds`` old
    by the time their capture began: ``safety_factor`` times that, rounded up to what a person
    would write (10 s steps up to two minutes, whole minutes up to two hours, whole hours above)."""
    need = policy.safety_factor * max(0.0, oldest_age_seconds)
    step = 10.0 if need <= 120 else 60.0 if need <= 7200 else 3600.0
    return max(step, math.ceil(need / step) * step)


def window_at_risk(policy: BootstrapPolicy, window_seconds: float, oldest_age_seconds: float) -> bool:
    """Whether the source's change window is too short for the captures measured so far."""
    return policy.safety_factor * oldest_age_seconds > window_seconds


def copy_budget_used(policy: BootstrapPolicy, *, now: float, since: float) -> bool:
    """With ``chunk_budget_seconds``: whether copying since ``since`` has used it (the change feed
    is then also captured between chunks)."""
    return policy.chunk_budget_seconds is not None and now - since >= policy.chunk_budget_seconds


def duration_text(seconds: float) -> str:
    """``90 seconds``, ``3 minutes``, ``5 hours``: a duration in its largest whole unit."""
    whole = int(math.ceil(seconds))
    for unit, size in (("hour", 3600), ("minute", 60)):
        if whole and whole % size == 0:
            n = whole // size
            return f"{n} {unit}{'' if n == 1 else 's'}"
    return f"{whole} second{'' if whole == 1 else 's'}"


def interval_text(seconds: float) -> str:
    """A Delta interval for a table property (``interval 2 minutes``)."""
    return f"interval {duration_text(seconds)}"
