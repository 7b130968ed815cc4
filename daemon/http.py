"""The daemon's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/status`` and the control
commands ``POST /tables/{table}/pause|resume|resync`` (see :mod:`lakemirror.daemon.control`).

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
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from lakemirror.daemon import control

from lakemirror.supervisor.supervisor import TableView

log = logging.getLogger(__name__)


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
                 subtasks: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.registry = registry
        self.subtasks = subtasks  # the scheduled sub-tasks' views, shown by /status
        self.views = views
        self.commands = commands  # (verb, table) -> queued? (False: no such table)
        self.auth_token = auth_token
        self.info = info
        self.lag_slo = lag_slo_seconds
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

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http: " + fmt, *args)

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json(self, code: int, payload: Any) -> None:
                self._send(code, json.dumps(payload, indent=2, default=str).encode(), "application/json")

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._json(200, {"status": "ok"})
                elif path == "/readyz":
                    ok, reasons = readiness(outer.views(), outer.lag_slo)
                    self._json(200 if ok else 503, {"ready": ok, "reasons": reasons})
                elif path == "/status":
                    self._json(200, {**outer.info, "tables": [asdict(v) for v in outer.views()],
                                     "subtasks": outer.subtasks() if outer.subtasks else []})
                else:
                    self._json(404, {"error": f"no such endpoint {path}",
                                     "endpoints": ["/metrics", "/healthz", "/readyz", "/status",
                                                   "POST /tables/{table}/pause|resume|resync"]})

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                request = control.route(self.path)
                if request is None or outer.commands is None:
                    self._json(404, {"error": f"no such command {self.path.split('?', 1)[0]}",
                                     "commands": ["POST /tables/{table}/pause|resume|resync"]})
                    return
                denied = control.authorize(self.headers.get("Authorization"), outer.auth_token,
                                           str(outer.server.server_address[0]))
                if denied is not None:
                    self._json(denied[0], {"error": denied[1]})
                    return
                if not outer.commands(request.verb, request.table):
                    self._json(404, {"error": f"no table {request.table!r} in this pipeline"})
                    return
                log.info("control: %s %s (queued)", request.verb, request.table)
                self._json(202, {"accepted": request.verb, "table": request.table})

        return Handler
