"""Who may drive the daemon: a control or API request must name the daemon in its Host header, come
from no other site (Origin, Sec-Fetch-Site), send JSON as application/json, and carry the token,
which the daemon generates and keeps owner-readable when none is configured. Real server, real
clients (raw sockets for the headers a browser would send), and the `lakemirror` commands."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.daemon import control, http_token
from lakemirror.daemon.cli import main
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.settings import load_settings
from lakemirror.supervisor.control.loop import Supervisor
from tests.unit.test_api import Daemon
from tests.unit.test_supervisor import FakeRunner

PIPELINE = json.dumps({"pipeline_id": "p2", "source_catalog": "src", "destination_catalog": "dst2",
                       "schema_name": "sales", "tables": ["orders"]})


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    d.close()


def send(port: int, method: str, path: str, headers: dict[str, str], body: str = "") -> tuple[int, Any]:
    """One request with exactly these headers (no Host unless given), as a browser or a script sends it."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()),
             f"Content-Length: {len(body.encode())}", "Connection: close"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n" + body).encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(payload) if b"application/json" in head else payload


def test_the_web_page_attack_of_issue_46_is_refused(daemon: Daemon) -> None:
    """A page on evil.example, its name rebound to 127.0.0.1, posts JSON as text/plain."""
    port = daemon.server.port
    hostile = {"Host": f"evil.example:{port}", "Origin": "http://evil.example", "Content-Type": "text/plain"}
    assert send(port, "POST", "/tables/orders/resume", hostile)[0] == 403
    assert send(port, "POST", "/api/continuous-sync", hostile, PIPELINE)[0] == 403
    assert [p.pipeline_id for p in daemon.registry.all()] == ["main"]
    assert daemon.runners[("main", "orders")].paused is False


@pytest.mark.parametrize("headers, status, message", [
    ({"Host": "evil.example:PORT"}, 403, "Host 'evil.example:PORT' does not name this daemon"),
    ({"Host": "127.0.0.1.nip.io:PORT"}, 403, "does not name this daemon"),
    ({"Host": "127.0.0.1:PORT", "Origin": "http://evil.example"}, 403, "cross-origin request"),
    ({"Host": "127.0.0.1:PORT", "Origin": "null"}, 403, "cross-origin request"),
    ({"Host": "127.0.0.1:PORT", "Origin": "http://localhost:8888"}, 403, "cross-origin request"),
    ({"Host": "127.0.0.1:PORT", "Sec-Fetch-Site": "cross-site"}, 403, "cross-site request refused"),
    ({"Host": "127.0.0.1:PORT", "Content-Type": "text/plain"}, 415, "send JSON with Content-Type: application/json"),
    ({"Host": "127.0.0.1:PORT", "Content-Type": "application/x-www-form-urlencoded"}, 415, "application/json"),
    ({"Host": "127.0.0.1:PORT"}, 415, "'no type'"),
])
def test_each_sign_of_another_site_or_a_form_is_refused(daemon: Daemon, headers: dict[str, str], status: int,
                                                        message: str) -> None:
    port = daemon.server.port
    headers = {k: v.replace("PORT", str(port)) for k, v in headers.items()}
    code, answer = send(port, "POST", "/api/continuous-sync", headers, PIPELINE)
    assert (code, message.replace("PORT", str(port)) in answer["error"]) == (status, True), answer
    assert [p.pipeline_id for p in daemon.registry.all()] == ["main"]


@pytest.mark.parametrize("headers", [
    {"Host": "127.0.0.1:PORT", "Content-Type": "application/json"},                     # curl, the CLI
    {"Host": "localhost:PORT", "Content-Type": "application/json; charset=utf-8"},      # localhost on loopback
    {"Host": "127.0.0.1:PORT", "Origin": "http://127.0.0.1:PORT", "Sec-Fetch-Site": "same-origin",
     "Content-Type": "application/json"},                                               # the daemon's own page
    {"Content-Type": "application/json"},                                               # HTTP/1.0 without Host
])
def test_requests_addressed_to_the_daemon_pass(daemon: Daemon, headers: dict[str, str]) -> None:
    port = daemon.server.port
    headers = {k: v.replace("PORT", str(port)) for k, v in headers.items()}
    assert send(port, "POST", "/api/continuous-sync", headers, PIPELINE)[0] == 201
    assert send(port, "POST", "/tables/orders/pause", {k: v for k, v in headers.items() if k != "Content-Type"}
                )[0] == 202


def test_reads_stay_open_to_any_host(daemon: Daemon) -> None:
    """Probes and Prometheus address the daemon by whatever name they have: reads are not refused."""
    for path in ("/healthz", "/readyz", "/status", "/metrics", "/", "/api/openapi.json"):
        assert send(daemon.server.port, "GET", path, {"Host": "lakemirror.prod.svc"})[0] == 200, path


def test_allowed_hosts_admit_a_name_in_front_of_the_daemon() -> None:
    server = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [], {}, commands=lambda verb, table: True,
                           allowed_hosts=["lakemirror.prod.svc"])
    server.start()
    try:
        assert send(server.port, "POST", "/tables/t/pause", {"Host": "lakemirror.prod.svc:9464"})[0] == 202
        assert send(server.port, "POST", "/tables/t/pause", {"Host": "other.prod.svc"})[0] == 403
    finally:
        server.close()


@pytest.mark.parametrize("host, bound, allowed", [
    ("127.0.0.1", "127.0.0.1", True), ("localhost", "127.0.0.1", True), ("127.0.0.2", "127.0.0.1", True),
    ("10.0.0.5", "127.0.0.1", False), ("evil.example", "127.0.0.1", False), ("::1", "::1", True),
    ("10.0.0.5", "10.0.0.5", True), ("10.0.0.6", "10.0.0.5", False), ("localhost", "10.0.0.5", False),
    ("10.0.0.5", "0.0.0.0", True), ("localhost", "0.0.0.0", True), ("pod.svc", "0.0.0.0", False),
    ("fe80::1", "::", True),
])
def test_which_hosts_name_the_daemon(host: str, bound: str, allowed: bool) -> None:
    assert control.host_allowed(host, bound) is allowed


# -- the token a daemon generates ------------------------------------------------------------------------

def _app(tmp_path: Path, http: dict[str, Any] | None = None) -> tuple[DaemonContext, Path]:
    config = tmp_path / "pipeline.yaml"
    config.write_text(json.dumps({"source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
                                  "pipeline_id": "p", "tables": ["orders"], "checkpoint_volume": str(tmp_path / "ck"),
                                  "runtime": {"warehouse": str(tmp_path / "wh")}, "http": {"port": 0, **(http or {})}}))
    supervisor = Supervisor(runner_factory=FakeRunner, list_tables=lambda: ["orders"])  # type: ignore[arg-type]
    app = DaemonContext(load_settings(config)).replace(
        mode_check=lambda rt: None, checkpoints=InMemoryCheckpointStore(), metrics=Metrics("p", CollectorRegistry()),
        supervisor=supervisor)
    return app, config


@pytest.fixture
def running(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[DaemonContext, Path]]:
    caplog.set_level(logging.DEBUG)
    app, config = _app(tmp_path)
    server = app.bind()
    server.start()
    app.write_endpoint_file()
    app.supervisor.start()
    yield app, config
    server.close()


def test_without_a_configured_token_one_is_generated_and_kept_owner_readable(
        running: tuple[DaemonContext, Path], caplog: pytest.LogCaptureFixture) -> None:
    app, _ = running
    token = app.http_token
    assert token is not None and len(token) >= 40
    token_file = app.pipeline_dir / http_token.TOKEN_FILE
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and token_file.read_text() == token + "\n"
    endpoint = json.loads((app.pipeline_dir / "daemon.json").read_text())
    assert endpoint["token_file"] == str(token_file) and token not in json.dumps(endpoint)
    logged = "\n".join(r.getMessage() for r in caplog.get_records("setup") + caplog.get_records("call"))
    assert token not in logged and str(token_file) in logged
    port = app.server.port
    assert send(port, "POST", "/tables/orders/pause", {"Host": f"127.0.0.1:{port}"})[0] == 401
    assert send(port, "POST", "/tables/orders/pause", {"Host": f"127.0.0.1:{port}",
                                                        "Authorization": f"Bearer {token}"})[0] == 202
    assert send(port, "GET", "/status", {})[0] == 200  # reads need no token


def test_the_cli_reads_the_generated_token_and_never_prints_it(
        running: tuple[DaemonContext, Path], capsys: pytest.CaptureFixture[str]) -> None:
    app, config = running
    assert main(["pause", str(config), "orders"]) == 0
    assert main(["resync", str(config), "orders"]) == 0
    assert main(["resume", str(config), "missing"]) == 1
    printed = capsys.readouterr()
    assert "no table 'missing'" in printed.err
    assert app.http_token is not None and app.http_token not in printed.out + printed.err


def test_a_token_file_the_cli_cannot_read_is_one_line(running: tuple[DaemonContext, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    app, config = running
    token_file = app.pipeline_dir / http_token.TOKEN_FILE
    token_file.unlink()
    token_file.mkdir()  # anything that cannot be read as the token
    assert main(["pause", str(config), "orders"]) == 1
    err = capsys.readouterr().err
    assert "no token for the daemon's control API" in err and "Traceback" not in err


def test_the_token_files_go_with_the_daemon(tmp_path: Path) -> None:
    import threading

    app, _ = _app(tmp_path)
    app.start_spark = lambda: None  # type: ignore[method-assign]
    stop = threading.Event()
    stop.set()
    app.run(stop)
    assert not (app.pipeline_dir / http_token.TOKEN_FILE).exists() and not (app.pipeline_dir / "daemon.json").exists()


@pytest.mark.parametrize("http, expected", [
    ({"auth": "none"}, None), ({"auth_token": "configured-token-1"}, "configured-token-1"),
    ({"auth_token": "configured-token-1\n"}, "configured-token-1"),
])
def test_a_configured_token_or_none_writes_no_token_file(tmp_path: Path, http: dict[str, Any],
                                                         expected: str | None) -> None:
    app, config = _app(tmp_path, http)
    assert app.http_token == expected
    server = app.bind()
    server.start()
    try:
        app.write_endpoint_file()
        assert not (app.pipeline_dir / http_token.TOKEN_FILE).exists()
        assert json.loads((app.pipeline_dir / "daemon.json").read_text())["token_file"] is None
        app.supervisor.start()
        assert main(["pause", str(config), "orders"]) == 0  # the CLI sends the same, trimmed token
    finally:
        server.close()


def test_a_token_file_is_written_owner_only_even_over_a_stale_one(tmp_path: Path) -> None:
    old = tmp_path / http_token.TOKEN_FILE
    old.write_text("stale")
    os.chmod(old, 0o644)
    http_token.write(tmp_path, "fresh-token")
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and http_token.read(tmp_path) == "fresh-token"
