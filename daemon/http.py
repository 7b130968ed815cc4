"""The daemon's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/status``, the control
commands ``POST /tables/{table}/pause|resume|resync`` (see :mod:`lakemirror.daemon.control`) and the
REST control API under ``/api`` (see :mod:`lakemirror.daemon.api`, documented at ``/api/openapi.json``).
Every route is one of :data:`lakemirror.daemon.routes.ROUTES`.

The HTTP threads never call Spark: they read the supervisor's views, which are plain data, and
queue commands that the supervisor applies on its own thread. Served by the standard library's
threading server on the configured interface.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from lakemirror.daemon import control, openapi, routes
from lakemirror.secrets import redact
from lakemirror.supervisor.supervisor import TableView

if TYPE_CHECKING:
    from lakemirror.daemon.api import ContinuousSyncApi

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20


def readiness(views: list[TableView], lag_slo_seconds: float) -> tuple[bool, list[str]]:
    """Ready when every table is running within its lag SLO (paused tables are not counted)."""
    reasons = []
    for v in views:
        if v.state == "paused":
            continue
        if v.state != "running":
            reasons.append(f"{v.table} is {v.state}" + (f": {v.last_error}" if v.last_error else ""))
        elif v.lag_seconds is not None and v.lag_seconds > lag_slo_seconds:
            reasons.append(f"{v.table} lags {v.lag_seconds:.1f}s > SLO {lag_slo_seconds:.0f}s")
    return not reasons, reasons


class ControlServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 views: Callable[[], list[TableView]], info: dict[str, Any], lag_slo_seconds: float = 300.0,
                 commands: Callable[[str, str], bool] | None = None, auth_token: str | None = None,
                 api: "ContinuousSyncApi | None" = None,
                 subtasks: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.registry = registry
        self.subtasks = subtasks  # the scheduled sub-tasks' views, shown by /status
        self.views = views
        self.commands = commands  # (verb, table) -> queued? (False: no such table)
        self.auth_token = auth_token
        self.info = info
        self.lag_slo = lag_slo_seconds
        self.api = api
        handler = self._handler()
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = self.server.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    # -- the routes that are not under /api -----------------------------------------------------

    def answer(self, m: routes.Match, body: Any) -> tuple[int, Any]:
        """(status, JSON payload) of every route but /metrics."""
        name = m.route.name
        if name == "healthz":
            return 200, {"status": "ok"}
        if name == "readyz":
            ok, reasons = readiness(self.views(), self.lag_slo)
            return (200 if ok else 503), {"ready": ok, "reasons": reasons}
        if name == "status":
            return 200, {**self.info, "tables": [asdict(v) for v in self.views()],
                         "subtasks": self.subtasks() if self.subtasks else []}
        if name == "openapi":
            return 200, openapi.document()
        if name.startswith("table_"):
            verb, table = name[len("table_"):], m.params["table"]
            if self.commands is None:
                return 404, {"error": "control commands are not enabled on this endpoint"}
            if not self.commands(verb, table):
                return 404, {"error": f"no table {table!r} in this pipeline"}
            log.info("control: %s %s (queued)", verb, table)
            return 202, {"accepted": verb, "table": table}
        if self.api is None:
            return 404, {"error": "the control API is not enabled on this endpoint"}
        return self.api.handle(m, body)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http: " + fmt, *args)

            def _send(self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _json(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                self._send(code, json.dumps(payload, indent=2, default=str).encode(), "application/json", headers)

            def _body(self) -> tuple[bool, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    self._json(413, {"error": f"the body is larger than {MAX_BODY_BYTES} bytes"})
                    return False, None
                raw = self.rfile.read(length) if length else b""
                if not raw.strip():
                    return True, None
                try:
                    return True, json.loads(raw)
                except ValueError as exc:
                    self._json(422, {"error": "invalid pipeline", "problems": [
                        {"field": "(body)", "message": f"not valid JSON: {exc}"}]})
                    return False, None

            def _dispatch(self, method: str) -> None:
                m = routes.match(method, self.path)
                if m is None:
                    self._json(404, {"error": f"no such endpoint {self.path.split('?', 1)[0]}",
                                     "endpoints": [f"{r.method} {r.template}" for r in routes.ROUTES]})
                    return
                if isinstance(m, str):
                    allowed = routes.allowed_methods(self.path)
                    self._json(405, {"error": f"{method} is not allowed here; use {', '.join(allowed)}"},
                               {"Allow": ", ".join(allowed)})
                    return
                if m.route.mutating or m.route.api:
                    denied = control.authorize(self.headers.get("Authorization"), outer.auth_token,
                                               str(outer.server.server_address[0]))
                    if denied is not None:
                        self._json(denied[0], {"error": denied[1]})
                        return
                if m.route.name == "metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                    return
                ok, body = self._body() if method in ("POST", "DELETE") else (True, None)
                if not ok:
                    return
                try:
                    code, payload = outer.answer(m, body)
                except Exception as exc:  # an unexpected failure is a 500 with a redacted reason, never a hang
                    log.exception("http: %s %s failed", method, m.route.template)
                    code, payload = 500, {"error": redact(f"{type(exc).__name__}: {exc}")}
                self._json(code, payload)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._dispatch("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._dispatch("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._dispatch("DELETE")

        return Handler
