"""The per-table status page at ``GET /``: rendered by the real ControlServer over fake table views and
the real Metrics. The pause/resume buttons are checked through the routes their script posts to; the
page as a browser draws it is tests/e2e/test_status_page_browser.py."""

from __future__ import annotations

import re
import time
import urllib.request
from dataclasses import replace
from typing import Iterator
from urllib.error import HTTPError

import pytest
from prometheus_client import CollectorRegistry

from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.page import SCALE_WIDTH, LagHistory, actions, render, sparkline
from lakemirror.supervisor.control.lag import LagReading
from lakemirror.supervisor.control.loop import TableView

TOKEN = "page-t0ken-for-tests-9b2e"
HOSTILE = '<script>alert("x")</script> & failed at jdbc:postgresql://app:hunter2@db/x'

BASE = TableView(table="orders", state="running", lag_seconds=1.5, versions_behind=1, applied_through=7,
                 rows_applied=12345, batches=4, failures=0, retries=0, next_retry_at=None, last_error=None,
                 last_batch_at=None)


class Tables:
    """Fake views whose lag moves on every read, as a live pipeline's does."""

    def __init__(self) -> None:
        self.reads = 0
        self.commands: list[tuple[str, str]] = []

    def views(self) -> list[TableView]:
        self.reads += 1
        wave = (self.reads % 7) * 0.8
        return [replace(BASE, lag_seconds=1.0 + wave),
                replace(BASE, table="customers", state="paused", lag_seconds=4.0 - wave / 2, rows_applied=42),
                replace(BASE, table="events <b>", state="failed", lag_seconds=None, rows_applied=0,
                        last_error=HOSTILE)]

    def command(self, verb: str, table: str) -> bool:
        if table not in {v.table for v in self.views()}:
            return False
        self.commands.append((verb, table))
        return True


def serve(token: str | None) -> tuple[ControlServer, Tables]:
    tables = Tables()
    metrics = Metrics("main", CollectorRegistry())
    metrics.lag_measured("orders", LagReading(1.5, 1, 8, 7, retention_headroom_seconds=6.5 * 86400))
    metrics.lag_measured("customers", LagReading(3.0, 2, 8, 6, retention_headroom_seconds=5400.0))
    server = ControlServer("127.0.0.1", 0, metrics.registry, tables.views, {"pipeline_id": "main"},
                           commands=tables.command, auth_token=token, lag_sample_seconds=0.01)
    server.start()
    deadline = time.monotonic() + 15
    while len(server.history.samples("orders")) < 10:  # the sampler thread fills the sparklines
        assert time.monotonic() < deadline, "the lag sampler recorded nothing"
        time.sleep(0.02)
    return server, tables


@pytest.fixture
def served() -> Iterator[tuple[ControlServer, Tables]]:
    server, tables = serve(TOKEN)
    yield server, tables
    server.close()


def fetch(url: str, method: str = "GET", token: str | None = None) -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


# -- what the server sends -------------------------------------------------------------------------

def test_the_page_has_every_table_with_escaped_redacted_errors_and_no_external_asset(
        served: tuple[ControlServer, Tables]) -> None:
    server, _ = served
    code, page, headers = fetch(server.url + "/")
    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    for table in ("orders", "customers", "events &lt;b&gt;"):
        assert f'<td class="table">{table}</td>' in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; failed" in page
    assert "hunter2" not in page and '<script>alert("x")' not in page
    assert page.count("<polyline") == 2  # orders and customers have lag samples; the failed table none
    assert '<td class="num headroom">6.5d</td>' in page and '<td class="num headroom">1.5h</td>' in page
    assert '<td class="num rows">12,345</td>' in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "an external asset"
    assert "<link" not in page and "@import" not in page and 'id="token"' in page


def test_the_buttons_post_to_the_control_routes_with_the_bearer_token(served: tuple[ControlServer, Tables]) -> None:
    server, tables = served
    page = fetch(server.url + "/")[1]
    script = page[page.index("<script>"):]
    assert 'const url = "/tables/" + encodeURIComponent(table) + "/" + verb;' in script
    assert 'fetch(url, {method: "POST", headers: headers})' in script
    assert 'headers["Authorization"] = "Bearer " + token;' in script
    assert "sessionStorage.getItem(KEY)" in script and "sessionStorage.setItem(KEY" in script
    buttons = re.findall(r'<button data-verb="(\w+)" data-table="([^"]*)">', page)
    assert ("pause", "orders") in buttons and ("resume", "customers") in buttons
    # what a click sends, for each button: the table name as the script encodes it
    for verb, table in buttons:
        name = table.replace("&lt;", "<").replace("&gt;", ">")
        url = f"{server.url}/tables/{urllib.request.quote(name, safe='')}/{verb}"
        assert fetch(url, "POST")[0] == 401
        assert fetch(url, "POST", TOKEN)[0] == 202
    assert sorted(set(tables.commands)) == sorted({(v, t.replace("&lt;", "<").replace("&gt;", ">"))
                                                   for v, t in buttons})


def test_without_a_token_on_loopback_the_page_asks_for_none() -> None:
    server, tables = serve(None)
    try:
        page = fetch(server.url + "/")[1]
        assert 'data-needs-token="false"' in page and 'id="token"' not in page and " disabled" not in page
        assert fetch(f"{server.url}/tables/orders/pause", "POST")[0] == 202
    finally:
        server.close()


# -- the pure parts ----------------------------------------------------------------------------------

def test_the_lag_history_is_bounded_and_forgets_dropped_tables() -> None:
    history = LagHistory(capacity=3)
    for i in range(10):
        history.record([replace(BASE, lag_seconds=float(i)), replace(BASE, table="b", lag_seconds=None)], now=i)
    assert history.samples("orders") == [(7, 7.0), (8, 8.0), (9, 9.0)]
    history.record([replace(BASE, table="b")], now=10)
    assert history.samples("orders") == [] and len(history.samples("b")) == 3


def test_sparkline_scales_to_the_peak_and_needs_two_measured_samples() -> None:
    assert "polyline" not in sparkline([(0, 1.0), (1, None)])
    svg = sparkline([(0, 0.0), (60, 2.0), (120, 4.0)], width=100, height=24)
    assert f'points="{SCALE_WIDTH}.0,22.0 {SCALE_WIDTH + 50}.0,12.0 {SCALE_WIDTH + 100}.0,2.0"' in svg
    assert "peak 4.0s" in svg and "(2.0m)" in svg


def test_the_sparkline_has_a_scale_from_zero_to_the_peak_over_its_time_span() -> None:
    svg = sparkline([(1000, 3.0), (1030, 90.0), (1300, 12.0)])
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', svg)
    assert ticks == ["90.0s", "0"], "the peak at the top, 0 at the baseline"
    assert 'class="muted span">last 5.0m</div>' in svg


def test_the_buttons_fit_the_tables_state() -> None:
    def verbs(state: str, **kw: object) -> list[str]:
        return [verb for verb, _ in actions(replace(BASE, state=state, **kw))]  # type: ignore[arg-type]

    for running in ("running", "starting", "bootstrapping", "degraded"):
        assert verbs(running) == ["pause", "resync"]
    assert verbs("paused") == ["resume", "resync"] and verbs("failed") == ["resume", "resync"]
    assert verbs("stopped") == []
    assert verbs("running", detail={"mode": "triggered", "sub_task": "postgres-triggered"}) == [], \
        "a cycled replica is not the control routes' to pause"
    cycled = replace(BASE, table="archive", detail={"mode": "snapshot", "sub_task": "postgres-snapshot"})
    page = render([BASE, cycled], LagHistory(), lambda t: None, title="x", needs_token=False, control_allowed=True)
    row = page[page.index('<tr data-table="archive">'):]
    assert "<button" not in row[:row.index("</tr>")] and "snapshot: on schedule" in row


def test_versions_behind_and_the_applied_version_are_beside_the_lag() -> None:
    view = replace(BASE, versions_behind=1234, applied_through=56789)
    page = render([view, replace(BASE, table="new", versions_behind=None, applied_through=None)], LagHistory(),
                  lambda t: None, title="x", needs_token=False, control_allowed=True)
    assert ('<td class="num lag">1.5s</td><td class="num behind">1,234</td><td class="num applied">56,789</td>'
            in page)
    assert '<td class="num behind">-</td><td class="num applied">-</td>' in page
    assert "<th>Lag</th>" in page and ">Versions behind</th>" in page and ">Applied version</th>" in page


def test_a_resync_asks_first() -> None:
    page = render([BASE], LagHistory(), lambda t: None, title="x", needs_token=False, control_allowed=True)
    script = page[page.index("<script>"):]
    assert 'if (verb === "resync" && !confirm("Resync " + table' in script
    assert re.findall(r'<button data-verb="(\w+)"', page) == ["pause", "resync"]


def test_render_disables_the_buttons_where_control_is_refused_anyway() -> None:
    page = render([BASE], LagHistory(), lambda t: None, title="x", needs_token=False, control_allowed=False)
    assert page.count(" disabled>") == 2 and "set http.auth token, or http.auth_token" in page  # Pause and Resync
