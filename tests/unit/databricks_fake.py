"""A tiny local fake of the Databricks REST API (Jobs, Files) that records the exact requests the SDK sends.

Shared by the tests of :mod:`lakemirror.daemon.databricks_jobs` and of the control API's databricks mode.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:  # the SDK is imported when a client is made: collecting the tests needs none of it
    from databricks.sdk import WorkspaceClient


class FakeJobsApi:
    """A tiny Jobs API on 127.0.0.1: records every request, answers from ``routes``."""

    def __init__(self, routes: dict[tuple[str, str], Any],
                 dynamic: "Callable[[str, str, dict[str, list[str]], Any], tuple[int, Any] | None] | None" = None) -> None:
        self.routes = routes
        #: Consulted first: (method, path, query, body) -> (status, payload), or None for ``routes``.
        self.dynamic = dynamic
        # The SDK's host-metadata probe is answered like a workspace does, and not recorded.
        self.routes[("GET", "/.well-known/databricks-config")] = {
            "oidc_endpoint": "http://127.0.0.1/oidc", "workspace_id": "1234"}
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.headers: list[dict[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:  # the Files API uploads raw bytes
                    body = raw
                if url.path.startswith("/api/"):
                    fake.requests.append((self.command, url.path, parse_qs(url.query), body))
                    fake.headers.append(dict(self.headers))
                found = (fake.dynamic(self.command, url.path, parse_qs(url.query), body)
                         if fake.dynamic is not None and url.path.startswith("/api/") else None)
                answer = fake.routes.get((self.command, url.path))
                if found is not None:
                    status, payload = found
                elif answer is None:
                    payload, status = {"error_code": "ENDPOINT_NOT_FOUND", "message": url.path}, 404
                else:
                    payload, status = answer, 200
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeJobsApi":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def client(self) -> "WorkspaceClient":
        from databricks.sdk import WorkspaceClient
        from databricks.sdk.core import Config

        return WorkspaceClient(config=Config(host=self.host, token="x", auth_type="pat"))

    def calls(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _, _ in self.requests]
