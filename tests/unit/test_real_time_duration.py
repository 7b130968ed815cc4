"""Real-Time Mode's checkpoint interval below Spark's minimum batch duration: the source lowers the minimum."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lakemirror.sinks.postgres.real_time import MIN_BATCH_DURATION_CONF, allow_batch_duration, duration_ms


def test_spark_duration_strings_read_in_milliseconds() -> None:
    assert [duration_ms(t) for t in ("5000ms", "5s", "2000", " 1.5 s", "1min", "2h")] == [
        5000, 5000, 2000, 1500, 60_000, 7_200_000]
    assert duration_ms(None) is None and duration_ms("soon") is None


class Conf:
    def __init__(self, **values: str) -> None:
        self.values = dict(values)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


def allowed(interval: float, **values: str) -> str | None:
    conf = Conf(**values)
    allow_batch_duration(SimpleNamespace(conf=conf), interval)  # type: ignore[arg-type]
    return conf.values.get(MIN_BATCH_DURATION_CONF)


def test_an_interval_under_sparks_minimum_lowers_it_and_a_lower_minimum_is_kept() -> None:
    assert allowed(1.0, **{MIN_BATCH_DURATION_CONF: "5000ms"}) == "1000ms"      # Spark's default
    assert allowed(2.5) == "2500ms"                                            # unset
    assert allowed(1.0, **{MIN_BATCH_DURATION_CONF: "500ms"}) == "500ms"       # the user's lower minimum
    assert allowed(10.0, **{MIN_BATCH_DURATION_CONF: "5s"}) == "5s"            # nothing to lower
