"""Control commands: routing and authorization (pure), then the real HTTP server with a real client,
and the `lakemirror pause|resume|resync` commands against it."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any, Iterator
from urllib.error import HTTPError

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lakemirror.daemon import control
from lakemirror.daemon.cli import main
from lakemirror.daemon.http import ControlServer

TOKEN = "t0ken-for-tests-7d1c"


@pytest.mark.parametrize("path, expected", [
    ("/tables/orders/pause", control.ControlRequest("pause", "orders")),
    ("/tables/orders/resync?x=1", control.ControlRequest("resync", "orders")),
    ("/tables/order%27s%20%C3%BC/resume", control.ControlRequest("resume", "order's ü")),
    ("/tables//pause", None), ("/tables/orders/drop", None), ("/tables/orders", None),
    ("/tables/a/b/pause", None), ("/status", None),
])
def test_route(path: str, expected: control.ControlRequest | None) -> None:
    assert control.route(path) == expected


def test_authorize_with_a_token_needs_the_exact_bearer() -> None:
    assert control.authorize(f"Bearer {TOKEN}", TOKEN, "0.0.0.0") is None
    assert control.authorize(f"bearer {TOKEN}", TOKEN, "127.0.0.1") is None
    for header in (None, "", f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN):
        denied = control.authorize(header, TOKEN, "127.0.0.1")
        assert denied is not None and denied[0] == 401 and TOKEN not in denied[1]


def test_without_a_token_control_is_loopback_only() -> None:
    assert control.authorize(None, None, "127.0.0.1") is None
    assert control.authorize(None, None, "::1") is None
    denied = control.authorize(None, None, "0.0.0.0")
    assert denied is not None and denied[0] == 403 and "http.auth_token" in denied[1]


class Commands:
    def __init__(self) -> None:
        self.queued: list[tuple[str, str]] = []

    def __call__(self, verb: str, table: str) -> bool:
        if table == "missing":
            return False
        self.queued.append((verb, table))
        return True


@pytest.fixture
def server(request: Any) -> Iterator[tuple[ControlServer, Commands]]:
    commands = Commands()
    srv = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [], {"pipeline_id": "p"},
                        commands=commands, auth_token=getattr(request, "param", None))
    srv.start()
    yield srv, commands
    srv.close()


def post(url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=b"", method="POST")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.load(resp)
    except HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("server", [TOKEN], indirect=True)
def test_http_commands_are_queued_only_with_the_token(server: tuple[ControlServer, Commands]) -> None:
    srv, commands = server
    assert post(f"{srv.url}/tables/orders/pause")[0] == 401
    assert post(f"{srv.url}/tables/orders/pause", "wrong")[0] == 401
    assert commands.queued == []
    assert post(f"{srv.url}/tables/orders/pause", TOKEN) == (202, {"accepted": "pause", "table": "orders"})
    assert post(f"{srv.url}/tables/missing/resync", TOKEN)[0] == 404
    assert post(f"{srv.url}/tables/orders/explode", TOKEN)[0] == 404
    assert commands.queued == [("pause", "orders")]


def _config(tmp_path: Path, url: str, token: str | None) -> Path:
    data: dict[str, Any] = {"source_catalog": "s", "destination_catalog": "d", "schema_name": "x",
                            "pipeline_id": "p", "checkpoint_volume": str(tmp_path / "ck"),
                            "runtime": {"warehouse": str(tmp_path / "wh")}}
    if token:
        data["http"] = {"auth_token": token}
    (tmp_path / "ck" / "p").mkdir(parents=True)
    (tmp_path / "ck" / "p" / "daemon.json").write_text(json.dumps({"url": url}))
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("server", [TOKEN], indirect=True)
def test_cli_commands_find_the_daemon_and_send_the_token(server: tuple[ControlServer, Commands], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    srv, commands = server
    config = _config(tmp_path, srv.url, TOKEN)
    assert main(["resync", str(config), "orders"]) == 0
    assert main(["resume", str(config), "orders"]) == 0
    assert commands.queued == [("resync", "orders"), ("resume", "orders")]
    assert main(["pause", str(config), "missing"]) == 1
    err = capsys.readouterr().err
    assert "no table 'missing'" in err and TOKEN not in err


def test_cli_without_a_running_daemon_says_how_to_start_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "http://127.0.0.1:9", None)
    (tmp_path / "ck" / "p" / "daemon.json").unlink()
    assert main(["pause", str(config), "orders"]) == 1
    assert "lakemirror run" in capsys.readouterr().err


def test_a_command_sent_during_the_drain_is_refused_with_503_not_lost() -> None:
    from tests.unit.test_supervisor import started

    w = started(["orders"])
    srv = ControlServer("127.0.0.1", 0, CollectorRegistry(), w.sup.views, {"pipeline_id": "p"},
                        commands=w.sup.command)
    srv.start()
    try:
        assert post(f"{srv.url}/tables/orders/pause")[0] == 202
        w.sup.shutdown(5.0)  # the pause still queued is recorded ...
        assert w.runners["orders"].paused is True
        code, answer = post(f"{srv.url}/tables/orders/resume")  # ... and a command after it is refused
        assert code == 503 and "shutting down" in answer["error"], answer
        assert w.runners["orders"].paused is True
    finally:
        srv.close()
