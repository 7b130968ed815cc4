"""What a hostile or broken client can send to the daemon's HTTP endpoint: every way a request line,
header or body can be wrong is answered with a JSON error (400, 405, 408, 413, 431, 501), never
a dropped connection or a traceback. Raw sockets against the real ControlServer and control API."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any, Iterator

import pytest

from lakemirror.daemon.http_body import BadRequest, framing, nesting_depth, parse_json
from tests.unit.test_api import Daemon

CREATE = "/api/continuous-sync"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    d.close()


def exchange(port: int, raw: bytes, *, half_close: bool = False, timeout: float = 10.0) -> tuple[int, Any]:
    """Send ``raw`` on a new connection, read until the server closes it: (status, decoded JSON body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything (413)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1."), data[:200]
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(payload)


def post(path: str, headers: list[str], payload: bytes = b"") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def sized(payload: bytes, path: str = CREATE) -> bytes:
    return post(path, [f"Content-Length: {len(payload)}"], payload)


def chunked(data: bytes, size: int = 7) -> bytes:
    out = b""
    for i in range(0, len(data), size):
        piece = data[i:i + size]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


DEEP = b"[" * 200_000
SHALLOW_BUT_TOO_DEEP = b'{"tables": ' + b"[" * 100 + b"]" * 100 + b"}"
PIPELINE = json.dumps({"source_catalog": "src", "destination_catalog": "dst2", "schema_name": "sales",
                       "pipeline_id": "p2", "tables": ["orders"]}).encode()

CASES = [
    ("200 KB of [", sized(DEEP), 400, "nests deeper"),
    ("100 levels", sized(SHALLOW_BUT_TOO_DEEP), 400, "nests deeper than 64"),
    ("negative length", post(CREATE, ["Content-Length: -5"], b"{}"), 400, "Content-Length must be a whole number"),
    ("length abc", post(CREATE, ["Content-Length: abc"], b"{}"), 400, "Content-Length must be a whole number"),
    ("length list", post(CREATE, ["Content-Length: 2, 2"], b"{}"), 400, "Content-Length must be a whole number"),
    ("two lengths", post(CREATE, ["Content-Length: 2", "Content-Length: 3"], b"{} "), 400, "more than once"),
    ("huge length", post(CREATE, ["Content-Length: 99999999999999999999"]), 413, "larger than 1048576 bytes"),
    ("over the cap", post(CREATE, [f"Content-Length: {(1 << 20) + 1}"]), 413, "larger than"),
    ("5000-digit length", post(CREATE, ["Content-Length: " + "9" * 5000]), 413, "larger than 1048576 bytes"),
    ("a key twice", sized(b'{"schema_name": "sales", "schema_name": "finance"}'), 400,
     "the key 'schema_name' appears twice in one JSON object"),
    ("a nested key twice", sized(b'{"http": {"port": 1, "port": 2}}'), 400, "'port' appears twice"),
    ("not utf-8", sized(b'{"source_catalog": "\xff\xfe"}'), 400, "not UTF-8"),
    ("not json", sized(b"{not json"), 400, "not valid JSON"),
    ("NaN", sized(b'{"trigger_interval_seconds": NaN}'), 400, "NaN is not a JSON number"),
    ("5000 digits", sized(b'{"trigger_interval_seconds": ' + b"1" * 5000 + b"}"), 400, "not valid JSON"),
    ("no length", post(CREATE, []), 422, "JSON object"),
    ("array body", sized(b"[1]"), 422, "JSON object"),
    ("no length on a command", post("/tables/orders/pause", []), 202, "accepted"),
    ("gzip coding", post(CREATE, ["Transfer-Encoding: gzip"], b"x"), 501, "Transfer-Encoding 'gzip' is not supported"),
    ("length and chunked", post(CREATE, ["Transfer-Encoding: chunked", "Content-Length: 5"], chunked(b"{}")),
     400, "not both"),
    ("bad chunk size", post(CREATE, ["Transfer-Encoding: chunked"], b"zz\r\n{}\r\n0\r\n\r\n"), 400, "bad chunk size"),
    ("chunk longer than its size", post(CREATE, ["Transfer-Encoding: chunked"], b"1\r\n{}\r\n0\r\n\r\n"),
     400, "longer than its size"),
    ("request line", b"GARBAGE\r\n\r\n", 400, "Bad request"),
    ("version", b"GET /healthz HTTP/9\r\n\r\n", 400, "Bad request version"),
    ("header too long", b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431, "Line too long"),
    ("many headers", b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n",
     431, "Too many headers"),
    ("PUT", sized(b"{}").replace(b"POST", b"PUT", 1), 405, "PUT is not allowed"),
    ("HEAD", b"HEAD /healthz HTTP/1.0\r\n\r\n", 501, None),
]


@pytest.mark.parametrize("name, raw, status, message", CASES, ids=[c[0] for c in CASES])
def test_a_bad_request_is_a_json_error_and_never_a_traceback(
        daemon: Daemon, name: str, raw: bytes, status: int, message: str | None,
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    if name == "HEAD":  # a HEAD answer carries no body: check the status line only
        with socket.create_connection(("127.0.0.1", daemon.server.port), timeout=10) as sock:
            sock.sendall(raw)
            assert sock.makefile("rb").readline().split()[1] == b"501"
    else:
        code, answer = exchange(daemon.server.port, raw)
        assert code == status, (name, answer)
        text = json.dumps(answer)
        assert message is not None and message in text, (name, answer)
    assert exchange(daemon.server.port, b"GET /healthz HTTP/1.0\r\n\r\n") == (200, {"status": "ok"})
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.exc_info and r.levelno > logging.DEBUG]
    assert [p.pipeline_id for p in daemon.registry.all()] == ["main"]  # nothing was started


def test_a_body_that_ends_before_its_length_is_400(daemon: Daemon) -> None:
    code, answer = exchange(daemon.server.port, post(CREATE, ["Content-Length: 100"], b'{"a": 1}'), half_close=True)
    assert code == 400 and "ended after 8 of the 100 bytes" in answer["error"]


def test_a_chunked_body_is_read_like_any_other(daemon: Daemon) -> None:
    code, answer = exchange(daemon.server.port, post(CREATE, ["Transfer-Encoding: chunked"], chunked(PIPELINE)))
    assert (code, answer) == (201, {"job_id": "p2", "run_url": ""})


def test_a_client_that_disconnects_mid_request_is_one_log_line(
        daemon: Daemon, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    for raw in (b"GET /heal", post(CREATE, ["Content-Length: 50"], b"{"), b"POST /tables/orders/pause HTTP/1.1\r\n"):
        with socket.create_connection(("127.0.0.1", daemon.server.port), timeout=10) as sock:
            sock.sendall(raw)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    assert exchange(daemon.server.port, b"GET /healthz HTTP/1.0\r\n\r\n")[0] == 200
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.exc_info and r.levelno > logging.DEBUG]
    assert [p.pipeline_id for p in daemon.registry.all()] == ["main"]


# -- the pure parts -------------------------------------------------------------------------------

def test_framing() -> None:
    assert framing([], None) is None
    assert framing(["12"], None) == 12
    assert framing(["12", " 12"], None) == 12  # a repeated header with one value is one length
    assert framing([], "Chunked") == "chunked"
    assert framing(["0" * 5000 + "12"], None) == 12  # leading zeros: still twelve bytes
    for lengths, coding, status in [(["-1"], None, 400), (["+1"], None, 400), (["1e3"], None, 400),
                                    (["١٢"], None, 400), (["2000000"], None, 413), ([], "chunked, gzip", 501),
                                    (["1"], "chunked", 400), (["1" * 5000], None, 413),
                                    (["1" + "0" * 4400], None, 413)]:
        with pytest.raises(BadRequest) as err:
            framing(lengths, coding)
        assert err.value.status == status, (lengths, coding)


def test_parse_json_refuses_a_key_given_twice_at_any_depth() -> None:
    assert parse_json(b'{"a": {"b": 1}, "b": {"b": 2}}') == {"a": {"b": 1}, "b": {"b": 2}}  # same name, two objects
    for raw in (b'{"a": 1, "a": 1}', b'[{"x": {"k": 1, "k": 2}}]'):
        with pytest.raises(BadRequest, match="appears twice in one JSON object") as err:
            parse_json(raw)
        assert err.value.status == 400


def test_parse_json_bounds_depth_without_recursing() -> None:
    assert parse_json(b"  ") is None
    assert parse_json(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    assert nesting_depth({"a": [1, {"b": [[]]}]}) == 5
    assert nesting_depth(json.loads("[" * 900 + "]" * 900)) == 900
    assert nesting_depth(parse_json(b"[" * 64 + b"]" * 64)) == 64
    with pytest.raises(BadRequest, match="deeper than 64"):
        parse_json(b"[" * 65 + b"]" * 65)
    with pytest.raises(BadRequest, match="deeper than 64"):
        parse_json(b"[" * 1_000_000)
