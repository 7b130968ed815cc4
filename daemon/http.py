"""The daemon's HTTP endpoint: the status page at ``/``, ``/metrics``, ``/healthz``, ``/readyz``,
``/status``, the control commands ``POST /tables/{table}/pause|resume|resync`` (see
:mod:`lakemirror.daemon.control`) and the REST control API under ``/api`` (see
:mod:`lakemirror.daemon.api`, documented at ``/api/openapi.json``). Every route is one of
:data:`lakemirror.daemon.routes.ROUTES`.

The HTTP threads never call Spark: they read the supervisor's views, which are plain data, and
queue commands that the supervisor applies on its own thread. Served by the standard library's
threading server on the configured interface.

Control routes and ``/api`` routes need the bearer token (:func:`lakemirror.daemon.control.authorize`)
and must be addressed to the daemon by a client of no other site
(:func:`lakemirror.daemon.control.foreign_request`: Host, Origin, Sec-Fetch-Site); a body must be
JSON sent as ``application/json``. Reads (the page, ``/status``, ``/metrics``, health) stay open.

What a client sends can never make the server raise: a body is framed and parsed by
:mod:`lakemirror.daemon.http_body` (a bad one is a 400/408/413/415/501 with a JSON ``error``),
errors of the standard library's parser are answered in JSON too, and a connection that breaks is
one log line, never a traceback. Slow clients cannot hold the endpoint: a request (line, headers and
body) must arrive within ``read_timeout_seconds`` of the server starting to wait for it, or the
connection is closed; at most ``max_connections`` connections are served at once, and past that a
new connection takes the slot of the one that has waited longest for its client
(:mod:`lakemirror.daemon.http_capacity`), so stalled sockets never starve ``/metrics``, the probes
or the API; when every connection is busy being answered, :data:`PROBE_CONNECTIONS` more answer
the probes and ``/metrics`` only, and the rest get an immediate 503.
"""

from __future__ import annotations

import io
import json
import logging
import math
import socket
import sys
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from lakemirror.daemon import control, openapi, page, routes
from lakemirror.daemon.http_capacity import PROBE_ROUTES, Capacity
from lakemirror.daemon.http_body import (MAX_BODY_BYTES, BadRequest, framing, json_media_type, parse_json,
                                         read_chunked)
from lakemirror.secrets import redact
from lakemirror.daemon.settings import limits
from lakemirror.supervisor.control.loop import CommandRefused, TableView

if TYPE_CHECKING:
    from lakemirror.daemon.api import ContinuousSyncApi

log = logging.getLogger(__name__)

#: How often the serving loop checks for shutdown between connections (seconds).
SHUTDOWN_POLL_SECONDS = 0.05
#: Connections beyond max_connections that serve /healthz, /readyz and /metrics only, when every
#: other connection is busy being answered.
PROBE_CONNECTIONS = 4

__all__ = ["MAX_BODY_BYTES", "ControlServer", "readiness"]


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side that gives up at the request's deadline (not per read: a client
    sending one byte a second cannot keep a request open past it)."""

    def __init__(self, sock: socket.socket, deadline: Callable[[], float]) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline() - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive within the read timeout")
        self._sock.settimeout(None if math.isinf(remaining) else remaining)
        return self._sock.recv_into(buffer)


def _shut(sock: socket.socket) -> None:
    """End a connection that gives its slot to a new one: its thread's read returns at once."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Server(ThreadingHTTPServer):
    """The standard threading server with :class:`~lakemirror.daemon.http_capacity.Capacity` deciding
    which connections are served (the longest-waiting gives way when full; probes have a reserve;
    past that an immediate 503), and one log line, never a traceback, when a connection breaks."""

    daemon_threads = True
    #: Connections the kernel queues until the serving thread accepts them. The standard library's 5
    #: is short of a burst (a client opening a handful at once, scrapes and probes besides): past it the
    #: kernel drops the connection's SYN and the client tries again a second later.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int,
                 probe_connections: int = PROBE_CONNECTIONS) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.capacity: Capacity[socket.socket] = Capacity(max_connections, probe_connections, _shut)
        self.max_connections = max_connections
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if self.capacity.admit(request) is None:
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.capacity.release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.capacity.release(request)

    def _refuse(self, request: socket.socket) -> None:
        body = json.dumps({"error": f"the server is busy ({self.max_connections} connections being answered); "
                                    f"retry shortly"}).encode()
        head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        try:
            request.settimeout(0.5)
            request.sendall(head + body)
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        peer = client_address[0] if isinstance(client_address, tuple) and client_address else "?"
        if isinstance(exc, OSError):  # the client went away mid-request: its business, not ours
            log.info("http: connection from %s ended: %s", peer, exc)
        else:
            log.warning("http: request from %s failed: %s", peer, redact(f"{type(exc).__name__}: {exc}"))
        log.debug("http: the failure's traceback", exc_info=exc)


def readiness(views: list[TableView], lag_slo_seconds: float) -> tuple[bool, list[str]]:
    """Ready when every table is running within its lag SLO (paused tables are not counted), and
    there is at least one table: a pipeline whose tables are not known yet (its start still reading
    them) or that has none replicates nothing."""
    if not views:
        return False, ["the pipeline has no tables yet: they are still being listed, or the schema has none"]
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
    """The endpoint. ``read_timeout_seconds``: how long a request (line, headers, body) may take to
    arrive; ``max_connections``: connections served at once; ``lag_sample_seconds``: how often the
    status page's lag history samples the views (it keeps ``lag_samples`` per table)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 views: Callable[[], list[TableView]], info: dict[str, Any], lag_slo_seconds: float = 300.0,
                 commands: Callable[[str, str], bool] | None = None, auth_token: str | None = None,
                 api: "ContinuousSyncApi | None" = None,
                 subtasks: Callable[[], list[dict[str, Any]]] | None = None,
                 dead_letters: Callable[[routes.Match, Any], tuple[int, Any]] | None = None,
                 read_timeout_seconds: float = 10.0, max_connections: int = 32,
                 lag_sample_seconds: float = 5.0, lag_samples: int = 120,
                 allowed_hosts: Sequence[str] = ()) -> None:
        if read_timeout_seconds <= 0:
            raise ValueError("read_timeout_seconds must be positive")
        self.read_timeout = read_timeout_seconds
        self.history = page.LagHistory(lag_samples)
        self.lag_sample_seconds = lag_sample_seconds
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.registry = registry
        self.subtasks = subtasks  # the scheduled sub-tasks' views, shown by /status
        self.views = views
        self.commands = commands  # (verb, table) -> queued? (False: no such table)
        self.auth_token = auth_token
        self.allowed_hosts = tuple(h.lower() for h in allowed_hosts)  # Host names besides the daemon's address
        self.info = info
        self.lag_slo = lag_slo_seconds
        self.api = api
        self.dead_letters = dead_letters  # the event sources' dead-letter routes
        handler = self._handler()
        self.server = _Server((host, port), handler, max_connections)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = self.server.server_address[0]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{self.port}"

    def start(self) -> None:
        # serve_forever notices shutdown() between waits for a connection: a short wait makes
        # close() (the daemon's drain, every test's teardown) take at most SHUTDOWN_POLL_SECONDS,
        # not serve_forever's default half second.
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
                                        name="http", daemon=True)
        self._thread.start()
        self._sampler = threading.Thread(target=self._sample, name="http-lag-sampler", daemon=True)
        self._sampler.start()

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        for thread in (self._thread, self._sampler):
            if thread is not None:
                thread.join(5)

    def _sample(self) -> None:
        """Fill the status page's lag history from the views (plain data) until closed."""
        while True:
            try:
                self.history.record(self.views(), time.time())
            except Exception as exc:  # a view that cannot be read now is a gap in the sparkline
                log.debug("http: lag sample failed: %s", exc)
            if self._stop.wait(self.lag_sample_seconds):
                return

    # -- the status page ------------------------------------------------------------------------

    def headroom(self, table: str) -> float | None:
        """The retention headroom /metrics exports for a table of the configured pipeline."""
        return self.registry.get_sample_value("lakemirror_retention_headroom_seconds",
                                              {"pipeline": str(self.info.get("pipeline_id", "")), "table": table})

    def page(self) -> bytes:
        host = str(self.server.server_address[0])
        title = f"lakemirror {self.info.get('pipeline_id', '')}".strip()
        return page.render(self.views(), self.history, self.headroom, title=title,
                           needs_token=bool(self.auth_token),
                           control_allowed=self.commands is not None and (
                               bool(self.auth_token) or control.is_loopback(host))).encode()

    # -- the routes that are not under /api -----------------------------------------------------

    def answer(self, m: routes.Match, body: Any, headers: Any = None) -> tuple[int, Any]:
        """(status, JSON payload) of every route but /metrics and the page; ``headers`` are the request's."""
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
            if len(table) > limits.MAX_NAME_CHARS:
                return 404, {"error": f"no such table: the name is {len(table)} characters long, and a table name has "
                                      f"at most {limits.MAX_NAME_CHARS}"}
            try:
                known = self.commands(verb, table)
            except CommandRefused as exc:  # refused rather than lost: the drain began, or it cannot be journalled
                return 503, {"error": str(exc)}
            if not known:
                return 404, {"error": f"no table {table!r} in this pipeline"}
            log.info("control: %s %s (queued)", verb, table)
            return 202, {"accepted": verb, "table": table}
        if name.startswith("dead_letters"):
            if self.dead_letters is None:
                return 404, {"error": "this pipeline has no event source"}
            return self.dead_letters(m, body)
        if self.api is None:
            return 404, {"error": "the control API is not enabled on this endpoint"}
        return self.api.handle(m, body, headers)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            deadline = math.inf

            def setup(self) -> None:
                super().setup()
                buffered = self.rfile
                self.rfile = io.BufferedReader(_DeadlineReader(self.connection, lambda: self.deadline))
                buffered.close()  # the socket file the standard setup made; ours replaces it

            def handle_one_request(self) -> None:
                self.deadline = time.monotonic() + outer.read_timeout
                outer.server.capacity.waiting(self.connection)  # for the client: may give way to a new one
                super().handle_one_request()

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http: " + fmt, *args)

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                """The standard parser's refusals (bad request line, header too long, ...) in JSON."""
                self.close_connection = True
                if self.request_version == "HTTP/0.9":  # so that the status line is written at all
                    self.request_version = "HTTP/1.0"
                text = message or self.responses.get(code, ("error", ""))[0]
                try:
                    self._json(code, {"error": text}, {"Connection": "close"})
                except OSError:
                    pass

            def _send(self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
                self.connection.settimeout(outer.read_timeout)  # a client that stops reading is dropped too
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
                try:
                    frame = framing(self.headers.get_all("Content-Length") or [],
                                    self.headers.get("Transfer-Encoding"), MAX_BODY_BYTES)
                    if frame is None:
                        raw = b""
                    elif frame == "chunked":
                        raw = read_chunked(self.rfile, MAX_BODY_BYTES)
                    else:
                        assert isinstance(frame, int)
                        raw = self.rfile.read(frame)
                        if len(raw) != frame:
                            raise BadRequest(400, f"the body ended after {len(raw)} of the {frame} bytes "
                                                  f"Content-Length announced")
                    if raw.strip():
                        json_media_type(self.headers.get("Content-Type"))
                    return True, parse_json(raw)
                except BadRequest as exc:
                    self.close_connection = True
                    self._json(exc.status, {"error": exc.message}, {"Connection": "close"})
                except TimeoutError:
                    self.close_connection = True
                    self._json(408, {"error": f"the body did not arrive within {outer.read_timeout:g}s"},
                               {"Connection": "close"})
                return False, None

            def _dispatch(self, method: str) -> None:
                m = routes.match(method, self.path)
                if m is None:
                    self._json(404, {"error": f"no such endpoint {self.path.split('?', 1)[0][:200]}",
                                     "endpoints": [f"{r.method} {r.template}" for r in routes.ROUTES]})
                    return
                if isinstance(m, str):
                    allowed = routes.allowed_methods(self.path)
                    self._json(405, {"error": f"{method} is not allowed here; use {', '.join(allowed)}"},
                               {"Allow": ", ".join(allowed)})
                    return
                capacity = outer.server.capacity
                if m.route.name not in PROBE_ROUTES and capacity.reserved(self.connection):
                    self.close_connection = True
                    self._json(503, {"error": f"the server is busy ({outer.server.max_connections} connections being "
                                              f"answered); retry shortly"}, {"Retry-After": "1", "Connection": "close"})
                    return
                if m.route.mutating or m.route.api:
                    bound = str(outer.server.server_address[0])
                    foreign = control.foreign_request(self.headers, bound, outer.allowed_hosts)
                    if foreign is not None:
                        self._json(403, {"error": foreign})
                        return
                    denied = control.authorize(self.headers.get("Authorization"), outer.auth_token, bound)
                    if denied is not None:
                        self._json(denied[0], {"error": denied[1]})
                        return
                if m.route.name == "metrics":
                    capacity.busy(self.connection)
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                    return
                if m.route.name == "page":
                    capacity.busy(self.connection)
                    self._send(200, outer.page(), "text/html; charset=utf-8",
                               {"Cache-Control": "no-store", "Content-Security-Policy":
                                "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
                                "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"})
                    return
                ok, body = self._body() if method in ("POST", "DELETE") else (True, None)
                if not ok:
                    return
                capacity.busy(self.connection)
                try:
                    code, payload = outer.answer(m, body, self.headers)
                except Exception as exc:  # an unexpected failure is a 500 with a redacted reason, never a hang
                    log.exception("http: %s %s failed", method, m.route.template)  # a bug of ours: keep the trace
                    code, payload = 500, {"error": redact(f"{type(exc).__name__}: {exc}")}
                self._json(code, payload)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._dispatch("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._dispatch("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._dispatch("DELETE")

            def do_PUT(self) -> None:  # noqa: N802: answered 405 or 404 like any method a route lacks
                self._dispatch("PUT")

            def do_PATCH(self) -> None:  # noqa: N802
                self._dispatch("PATCH")

        return Handler
