"""The per-table status panel served at ``GET /``: one self-contained HTML page. Pure but for the clock.

The page shows, per table of the configured pipeline: state, lag with an inline-SVG sparkline of
recent lag samples, rows applied, the last error (redacted, HTML-escaped), the retention headroom,
and pause / resume buttons. The buttons ``POST /tables/{table}/pause|resume`` (the control routes,
with ``Authorization: Bearer <token>`` when the daemon has a token, ``http.auth_token`` or the one it
wrote to ``daemon.token``; the page asks for the token once and keeps it in the tab's
``sessionStorage``). Everything is inline: no script,
style sheet, font or image is fetched from anywhere, so the page works on a closed network.

Lag samples come from :class:`LagHistory`, a bounded ring per table that the HTTP server fills on
its own timer from the supervisor's views (plain data), so the page costs the supervisor nothing.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections import deque
from typing import Callable, Iterable

from lakemirror.secrets import redact
from lakemirror.supervisor.supervisor import TableView

Sample = tuple[float, float | None]


class LagHistory:
    """The last ``capacity`` lag samples of each table (None where lag was not measured). Thread-safe."""

    def __init__(self, capacity: int = 120) -> None:
        if capacity < 2:
            raise ValueError("a lag history needs room for at least 2 samples")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._rings: dict[str, deque[Sample]] = {}

    def record(self, views: Iterable[TableView], now: float) -> None:
        """One sample per table; tables no longer in ``views`` are forgotten (memory stays bounded)."""
        seen = set()
        with self._lock:
            for v in views:
                seen.add(v.table)
                self._rings.setdefault(v.table, deque(maxlen=self.capacity)).append((now, v.lag_seconds))
            for gone in set(self._rings) - seen:
                del self._rings[gone]

    def samples(self, table: str) -> list[Sample]:
        with self._lock:
            return list(self._rings.get(table, ()))


def sparkline(samples: list[Sample], width: int = 120, height: int = 24) -> str:
    """An inline SVG polyline of the measured lags (oldest left, scaled to the largest), or a dash."""
    values = [lag for _, lag in samples if lag is not None]
    if len(values) < 2:
        return '<span class="muted">-</span>'
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values))
    return (f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="lag of the last {len(values)} samples, peak {top:.1f}s">'
            f'<polyline fill="none" stroke="#1f6feb" stroke-width="1.5" points="{points}"/></svg>')


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 86400:
        return f"{value / 86400:.1f}d"
    if value >= 3600:
        return f"{value / 3600:.1f}h"
    return f"{value:.1f}s"


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 4px} .muted{color:#656d76}
table{border-collapse:collapse;margin-top:16px;width:100%}
th,td{border-bottom:1px solid #d0d7de;padding:6px 10px;text-align:left;vertical-align:middle}
th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.state{font-weight:600;padding:2px 8px;border-radius:10px;background:#eaeef2}
.state-running{background:#dafbe1;color:#116329} .state-paused{background:#fff8c5;color:#7d4e00}
.state-degraded,.state-failed{background:#ffebe9;color:#a40e26}
.error{color:#a40e26;max-width:380px;overflow-wrap:anywhere;font-family:ui-monospace,monospace;font-size:12px}
button{margin-right:4px} td.control{white-space:nowrap} #message{margin-top:12px;min-height:1.4em}
"""

_SCRIPT = """
const KEY = "lakemirror.token";
const needsToken = document.body.dataset.needsToken === "true";
const tokenBox = document.getElementById("token");
if (tokenBox) {
  tokenBox.value = sessionStorage.getItem(KEY) || "";
  tokenBox.addEventListener("change", () => sessionStorage.setItem(KEY, tokenBox.value.trim()));
}
function say(text) { document.getElementById("message").textContent = text; }
async function command(verb, table) {
  const headers = {};
  const token = sessionStorage.getItem(KEY) || "";
  if (needsToken) {
    if (!token) { say("enter the daemon's token (http.auth_token) first"); return; }
    headers["Authorization"] = "Bearer " + token;
  }
  const url = "/tables/" + encodeURIComponent(table) + "/" + verb;
  try {
    const answer = await fetch(url, {method: "POST", headers: headers});
    const body = await answer.json().catch(() => ({}));
    say(answer.ok ? verb + " " + table + ": queued" : verb + " " + table + ": " + answer.status + " " + (body.error || ""));
    if (answer.ok) setTimeout(() => location.reload(), 1500);
  } catch (e) { say(verb + " " + table + ": " + e); }
}
for (const b of document.querySelectorAll("button[data-verb]")) {
  b.addEventListener("click", () => command(b.dataset.verb, b.dataset.table));
}
setInterval(() => { if (document.activeElement !== tokenBox) location.reload(); }, REFRESH_MS);
"""


def render(views: list[TableView], history: LagHistory, headroom: Callable[[str], float | None], *,
           title: str, needs_token: bool, control_allowed: bool, refresh_seconds: float = 10.0,
           now: float | None = None) -> str:
    """The whole page. ``headroom(table)`` is the retention headroom in seconds (None: not measured);
    ``needs_token``: the daemon has a token, so the page asks for it; ``control_allowed``: False when
    control is refused anyway (no token on a non-loopback interface), and the buttons are disabled."""
    esc = html.escape
    now = time.time() if now is None else now
    rows = []
    for v in views:
        error = esc(redact(v.last_error)) if v.last_error else '<span class="muted">-</span>'
        table = esc(v.table)
        disabled = "" if control_allowed else " disabled"
        rows.append(
            f'<tr data-table="{table}"><td class="table">{table}</td>'
            f'<td><span class="state state-{esc(v.state)}">{esc(v.state)}</span></td>'
            f'<td class="num lag">{_seconds(v.lag_seconds)}</td><td>{sparkline(history.samples(v.table))}</td>'
            f'<td class="num rows">{v.rows_applied:,}</td><td class="num headroom">{_seconds(headroom(v.table))}</td>'
            f'<td class="error">{error}</td>'
            f'<td class="control"><button data-verb="pause" data-table="{table}"{disabled}>Pause</button>'
            f'<button data-verb="resume" data-table="{table}"{disabled}>Resume</button></td></tr>')
    if not rows:
        rows.append('<tr><td colspan="8" class="muted">no tables yet</td></tr>')
    if not control_allowed:
        auth = ('<p class="muted">Pause and resume are off: this endpoint is not on a loopback interface and '
                'has no token (http.auth is none: set http.auth token, or http.auth_token).</p>')
    elif needs_token:
        auth = ('<p><label>Token (http.auth_token, or the daemon.token file in the pipeline\'s checkpoint folder; '
                'kept in this tab only): <input id="token" type="password" autocomplete="off" size="32"></label></p>')
    else:
        auth = '<p class="muted">Loopback endpoint without a token: pause and resume need none.</p>'
    script = _SCRIPT.replace("REFRESH_MS", json.dumps(int(refresh_seconds * 1000)))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head>"
        f'<body data-needs-token="{"true" if needs_token else "false"}">'
        f"<h1>{esc(title)}</h1><p class=\"muted\">Per-table status at {stamp}; refreshes every "
        f"{refresh_seconds:.0f}s. JSON: <a href=\"/status\">/status</a>, metrics: <a href=\"/metrics\">/metrics</a>.</p>"
        f"{auth}<table><thead><tr><th>Table</th><th>State</th><th>Lag</th><th>Recent lag</th><th>Rows applied</th>"
        f"<th>Retention headroom</th><th>Last error</th><th>Control</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table><div id=\"message\" role=\"status\"></div>"
        f"<script>{script}</script></body></html>\n")
