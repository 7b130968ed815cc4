"""``GET /api/recovery-point`` and the command's argument parsing: refusals name the field, a missing
cut answers 409 with the reasons per table."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.daemon import routes
from lakemirror.daemon.api import ContinuousSyncApi
from lakemirror.daemon.pipelines import PipelineRegistry
from lakemirror.daemon.recovery import parse_instant, parse_tables, render
from lakemirror.daemon.worker import CommandWorker
from lakemirror.errors import ConfigError
from lakemirror.supervisor.recovery.recovery_point import NoRecoveryPoint


def api(fn: Any) -> ContinuousSyncApi:
    return ContinuousSyncApi(mode="local", registry=PipelineRegistry(), worker=CommandWorker(),
                             start_pipeline=lambda s: None,  # type: ignore[arg-type,return-value]
                             cdf_check=lambda c, s: [], recovery_point=fn)


def get(a: ContinuousSyncApi, target: str) -> tuple[int, Any]:
    m = routes.match("GET", target)
    assert isinstance(m, routes.Match)
    return a.handle(m, None)


def test_the_endpoint_passes_its_query_and_answers_the_cut() -> None:
    seen: list[Any] = []

    def fn(at: float | None, anchor: str | None, only: list[str] | None) -> dict[str, Any]:
        seen.append((at, anchor, only))
        return {"as_of": "x", "tables": []}

    code, body = get(api(fn), "/api/recovery-point?at=2026-01-01T00:00:01Z&anchor=lines&tables=orders,lines")
    assert code == 200 and body == {"as_of": "x", "tables": []}
    assert seen == [(1767225601.0, "lines", ["orders", "lines"])]
    assert get(api(fn), "/api/recovery-point")[0] == 200 and seen[-1] == (None, None, None)


def test_bad_queries_are_refused_naming_the_field() -> None:
    code, body = get(api(lambda *a: {}), "/api/recovery-point?at=yesterday&anchor=s.t&tables=,")
    assert code == 422
    assert sorted(p["field"] for p in body["problems"]) == ["anchor", "at", "tables"]


def test_no_cut_is_a_409_with_the_reasons() -> None:
    def fn(*args: Any) -> dict[str, Any]:
        raise NoRecoveryPoint("none", {"lines": "inside a batch"})

    assert get(api(fn), "/api/recovery-point") == (409, {"error": "none", "reasons": {"lines": "inside a batch"}})
    assert get(api(None), "/api/recovery-point")[0] == 404


def test_instants_and_table_lists() -> None:
    assert parse_instant("1700000000.5") == 1700000000.5
    assert parse_instant("2026-01-01T01:00:00+01:00") == parse_instant("2026-01-01T00:00:00") == 1767225600.0
    with pytest.raises(ConfigError, match="--at"):
        parse_instant("soon")
    assert parse_tables(" a, b ") == ["a", "b"] and parse_tables(None) is None
    with pytest.raises(ConfigError, match="--tables"):
        parse_tables(" , ")


def test_render_names_each_table_version_and_the_notes() -> None:
    text = render({"as_of": "T", "valid_until": None, "notes": {"lines": ["the source could not be read"]},
                   "tables": [{"table": "orders", "replica": "dr.s.orders", "replica_version": 4,
                               "source_version": 9, "source_committed_at": "T0"}]})
    assert "dr.s.orders VERSION AS OF 4" in text and "note: lines: the source could not be read" in text
