"""The per-table status panel served at ``GET /``: one self-contained HTML page. Pure but for the clock.

The page shows, per table of the configured pipeline: state, lag beside the source versions not yet
applied and the version the replica holds, an inline-SVG sparkline of recent lag samples on a scale
(0 to the peak, over the time the samples span), rows applied, the last error (redacted,
HTML-escaped), the retention headroom, and the buttons that fit the table's state
(:func:`actions`: pause a running table, resume a paused or failed one, resync any of them, after a
confirmation). The buttons ``POST /tables/{table}/pause|resume|resync`` (the control routes, with
``Authorization: Bearer <token>`` when the daemon has a token, ``http.auth_token`` or the one it
wrote to ``daemon.token``; the page asks for the token once and keeps it in the tab's
``sessionStorage``). A triggered or snapshot PostgreSQL replica (kept by scheduled cycles, not a
stream) has no buttons. Everything is inline: no script, style sheet, font or image is fetched from
anywhere, so the page works on a closed network.

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
from lakemirror.supervisor.control.loop import TableView

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


#: Room left of a sparkline for its scale (the peak and 0).
SCALE_WIDTH = 40


def sparkline(samples: list[Sample], width: int = 120, height: int = 28) -> str:
    """An inline SVG polyline of the measured lags (oldest left), on a scale from 0 (the baseline)
    to the peak, both labelled left of it, with the time the samples span; or a dash."""
    measured = [(t, lag) for t, lag in samples if lag is not None]
    if len(measured) < 2:
        return '<span class="muted">-</span>'
    values = [lag for _, lag in measured]
    top = max(values) or 1.0
    span = measured[-1][0] - measured[0][0]
    step = width / (len(values) - 1)
    low, high = height - 2, 2
    points = " ".join(f"{SCALE_WIDTH + i * step:.1f},{low - (v / top) * (low - high):.1f}"
                      for i, v in enumerate(values))
    label = f"lag of the last {len(values)} samples ({_seconds(span)}), peak {top:.1f}s"
    full = SCALE_WIDTH + width
    return (f'<svg class="spark" width="{full}" height="{height}" viewBox="0 0 {full} {height}" role="img" '
            f'aria-label="{label}"><title>{label}</title>'
            f'<text class="tick" x="{SCALE_WIDTH - 4}" y="9" text-anchor="end">{_seconds(top)}</text>'
            f'<text class="tick" x="{SCALE_WIDTH - 4}" y="{height - 1}" text-anchor="end">0</text>'
            f'<line x1="{SCALE_WIDTH}" y1="{low}" x2="{full}" y2="{low}" stroke="#d0d7de" stroke-width="1"/>'
            f'<line x1="{SCALE_WIDTH}" y1="{high}" x2="{full}" y2="{high}" stroke="#eaeef2" stroke-width="1"/>'
            f'<polyline fill="none" stroke="#1f6feb" stroke-width="1.5" points="{points}"/></svg>'
            f'<div class="muted span">last {_seconds(span)}</div>')


#: The buttons a table's state offers: (verb, label).
PAUSE, RESUME, RESYNC = ("pause", "Pause"), ("resume", "Resume"), ("resync", "Resync")
_ACTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "running": (PAUSE, RESYNC), "starting": (PAUSE, RESYNC), "bootstrapping": (PAUSE, RESYNC),
    "degraded": (PAUSE, RESYNC), "paused": (RESUME, RESYNC), "failed": (RESUME, RESYNC),
}


def actions(view: TableView) -> tuple[tuple[str, str], ...]:
    """The commands that make sense for a table now: pause what runs or retries, resume what is
    paused or failed, resync any of those; none for a stopped table, nor for one kept by scheduled
    cycles (a triggered or snapshot PostgreSQL replica, which the control routes do not know)."""
    if isinstance(view.detail, dict) and view.detail.get("sub_task"):
        return ()
    return _ACTIONS.get(view.state, ())


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 86400:
        return f"{value / 86400:.1f}d"
    if value >= 3600:
        return f"{value / 3600:.1f}h"
    if value >= 120:
        return f"{value / 60:.1f}m"
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
svg.spark text.tick{font:10px system-ui,sans-serif;fill:#656d76} .span{font-size:11px}
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
  if (verb === "resync" && !confirm("Resync " + table + "? Its replica is rebuilt from a new snapshot of the " +
                                    "source (a new bootstrap epoch); it lags until the copy is done.")) return;
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
        buttons = "".join(f'<button data-verb="{verb}" data-table="{table}"{disabled}>{label}</button>'
                          for verb, label in actions(v))
        if not buttons and isinstance(v.detail, dict) and v.detail.get("mode"):
            buttons = f'<span class="muted">{esc(str(v.detail["mode"]))}: on schedule</span>'
        rows.append(
            f'<tr data-table="{table}"><td class="table">{table}</td>'
            f'<td><span class="state state-{esc(v.state)}">{esc(v.state)}</span></td>'
            f'<td class="num lag">{_seconds(v.lag_seconds)}</td><td class="num behind">{_count(v.versions_behind)}</td>'
            f'<td class="num applied">{_count(v.applied_through)}</td><td>{sparkline(history.samples(v.table))}</td>'
            f'<td class="num rows">{v.rows_applied:,}</td><td class="num headroom">{_seconds(headroom(v.table))}</td>'
            f'<td class="error">{error}</td><td class="control">{buttons}</td></tr>')
    if not rows:
        rows.append('<tr><td colspan="10" class="muted">no tables yet</td></tr>')
    if not control_allowed:
        auth = ('<p class="muted">Pause, resume and resync are off: this endpoint is not on a loopback interface '
                'and has no token (http.auth is none: set http.auth token, or http.auth_token).</p>')
    elif needs_token:
        auth = ('<p><label>Token (http.auth_token, or the daemon.token file in the pipeline\'s checkpoint folder; '
                'kept in this tab only): <input id="token" type="password" autocomplete="off" size="32"></label></p>')
    else:
        auth = '<p class="muted">Loopback endpoint without a token: pause, resume and resync need none.</p>'
    script = _SCRIPT.replace("REFRESH_MS", json.dumps(int(refresh_seconds * 1000)))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head>"
        f'<body data-needs-token="{"true" if needs_token else "false"}">'
        f"<h1>{esc(title)}</h1><p class=\"muted\">Per-table status at {stamp}; refreshes every "
        f"{refresh_seconds:.0f}s. JSON: <a href=\"/status\">/status</a>, metrics: <a href=\"/metrics\">/metrics</a>.</p>"
        f"{auth}<table><thead><tr><th>Table</th><th>State</th><th>Lag</th>"
        f"<th title=\"source versions not yet applied\">Versions behind</th>"
        f"<th title=\"the source version the replica holds\">Applied version</th><th>Recent lag</th>"
        f"<th>Rows applied</th><th>Retention headroom</th><th>Last error</th><th>Control</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table><div id=\"message\" role=\"status\"></div>"
        f"<script>{script}</script></body></html>\n")
