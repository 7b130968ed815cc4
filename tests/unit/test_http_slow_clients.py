"""Slow and stalled clients against the real ControlServer over real sockets: they cannot starve the
control API or /metrics, the server closes them after its read timeout (also a client that trickles
a byte at a time), and past the connection cap new connections get an immediate 503."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from typing import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from lakemirror.daemon.http import ControlServer
from lakemirror.supervisor.control.loop import TableView

READ_TIMEOUT = 1.0
GENEROUS = 15.0  # no timing is asserted tighter than this: the machine is shared

VIEW = TableView(table="orders", state="running", lag_seconds=1.0, versions_behind=0, applied_through=3,
                 rows_applied=10, batches=1, failures=0, retries=0, next_retry_at=None, last_error=None,
                 last_batch_at=None)
HALF_REQUESTS = [
    b"",                                                               # connects, sends nothing
    b"GET /metr",                                                      # half a request line
    b"GET /metrics HTTP/1.1\r\nHost: x\r\n",                           # headers never end
    b"POST /tables/orders/pause HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"a\"",  # body never ends
    b"POST /api/continuous-sync HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{",
]


def make_server(max_connections: int = 16, read_timeout: float = READ_TIMEOUT) -> ControlServer:
    registry = CollectorRegistry()
    Gauge("lakemirror_lag_seconds", "lag", ["pipeline", "table"], registry=registry).labels("main", "orders").set(1)
    commands: list[tuple[str, str]] = []
    server = ControlServer("127.0.0.1", 0, registry, lambda: [VIEW], {"pipeline_id": "main"},
                           commands=lambda verb, table: commands.append((verb, table)) is None,
                           read_timeout_seconds=read_timeout, max_connections=max_connections)
    server.start()
    return server


@pytest.fixture
def server() -> Iterator[ControlServer]:
    s = make_server()
    yield s
    s.close()


def stall(port: int, raw: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=GENEROUS)
    if raw:
        sock.sendall(raw)
    return sock


def closed_by_server(sock: socket.socket) -> bytes:
    """Everything the server sent until it closed the connection (raises socket.timeout if it never does)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=GENEROUS) as resp:
        return resp.status, resp.read()


def test_stalled_clients_do_not_starve_metrics_or_control_and_are_closed_after_the_timeout(
        server: ControlServer) -> None:
    stalled = [stall(server.port, raw) for raw in HALF_REQUESTS]
    try:
        code, metrics = get(f"{server.url}/metrics")
        assert code == 200 and b'lakemirror_lag_seconds{pipeline="main",table="orders"} 1.0' in metrics
        assert get(f"{server.url}/status")[0] == 200
        req = urllib.request.Request(f"{server.url}/tables/orders/pause", method="POST")
        with urllib.request.urlopen(req, timeout=GENEROUS) as resp:
            assert resp.status == 202
        for sock, raw in zip(stalled, HALF_REQUESTS):
            answer = closed_by_server(sock)  # socket.timeout here: the server held the connection open
            if raw.endswith(b"\r\n\r\n{\"a\"") or raw.endswith(b"{"):  # the headers were read: told why
                assert answer.startswith(b"HTTP/1.") and b" 408 " in answer.split(b"\r\n", 1)[0], answer
                assert b"did not arrive within 1s" in answer
            else:
                assert answer == b"", answer
    finally:
        for sock in stalled:
            sock.close()


def test_a_client_trickling_one_byte_at_a_time_is_closed_at_the_deadline(server: ControlServer) -> None:
    sock = stall(server.port, b"G")
    started = time.monotonic()
    try:
        with pytest.raises((BrokenPipeError, ConnectionResetError, EOFError)):
            for byte in b"ET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
                sock.settimeout(0.2)
                try:  # a recv that finds the connection closed ends the trickle
                    if sock.recv(1) == b"":
                        raise EOFError("closed by the server")
                except socket.timeout:
                    pass
                sock.sendall(bytes([byte]))
                assert time.monotonic() - started < GENEROUS, "the server kept a trickling client"
    finally:
        sock.close()


def test_stalled_connections_give_way_to_probes_and_commands_however_many_there_are() -> None:
    """32 stalled sockets once made /healthz answer 503: now each new connection past the cap takes
    the slot of the one that has waited longest, which is closed."""
    server = make_server(max_connections=3, read_timeout=4 * GENEROUS)  # no stalled one times out here
    stalled: list[socket.socket] = []
    try:
        for round_ in range(4):  # the attacker keeps opening more
            stalled += [stall(server.port, raw) for raw in HALF_REQUESTS * 2]
            for _ in range(10):
                assert get(f"{server.url}/healthz") == (200, json.dumps({"status": "ok"}, indent=2).encode())
            assert get(f"{server.url}/metrics")[0] == 200
            req = urllib.request.Request(f"{server.url}/tables/orders/pause", method="POST")
            with urllib.request.urlopen(req, timeout=GENEROUS) as resp:
                assert resp.status == 202
        opened, _, reserved = server.server.capacity.counts()
        assert opened <= 3 and reserved == 0, "never more than the cap, and no probe needed the reserve"
        # the stalled connections were closed to make room, long before their read timeout
        for sock in stalled[:-3]:
            assert closed_by_server(sock) == b""
    finally:
        for sock in stalled:
            sock.close()
        server.close()


def test_a_burst_of_connections_waits_in_the_listen_queue_instead_of_being_dropped() -> None:
    """The kernel queues connections the serving thread has not accepted yet; with the standard
    library's queue of 5, the sixth connection of a burst had its SYN dropped and its client waited
    a second (or, as here with nothing accepting, for ever) before it was let in."""
    server = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [VIEW], {"pipeline_id": "main"},
                           read_timeout_seconds=READ_TIMEOUT)  # listening, not started: nothing accepts
    burst: list[socket.socket] = []
    try:
        for _ in range(64):
            burst.append(socket.create_connection(("127.0.0.1", server.port), timeout=3.0))
        server.start()  # now every queued connection is taken, in order, and answered
        assert get(f"{server.url}/healthz")[0] == 200
    finally:
        for sock in burst:
            sock.close()
        server.close()


def test_when_every_connection_is_busy_probes_use_the_reserve_and_the_rest_get_503() -> None:
    """Requests the server is working on are never cut; a probe still gets an answer from one of the
    reserved connections, and anything else an immediate 503."""
    import threading

    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow_command(verb: str, table: str) -> bool:
        entered.release()
        release.wait(GENEROUS)
        return True

    server = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [VIEW], {"pipeline_id": "main"},
                           commands=slow_command, read_timeout_seconds=READ_TIMEOUT, max_connections=2)
    server.start()
    answers: list[int] = []

    def post() -> None:
        req = urllib.request.Request(f"{server.url}/tables/orders/pause", method="POST")
        with urllib.request.urlopen(req, timeout=GENEROUS) as resp:
            answers.append(resp.status)

    workers = [threading.Thread(target=post) for _ in range(2)]
    try:
        for w in workers:
            w.start()
        for _ in workers:
            assert entered.acquire(timeout=GENEROUS), "the commands never reached the server"
        assert server.server.capacity.counts() == (2, 2, 0)
        for _ in range(10):
            assert get(f"{server.url}/healthz")[0] == 200
            assert get(f"{server.url}/readyz")[0] == 200
        extra = stall(server.port, b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = closed_by_server(extra)
        extra.close()
        assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.0 503 Service Unavailable", answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"].startswith("the server is busy (2 connections")
        release.set()
        for w in workers:
            w.join(GENEROUS)
        assert answers == [202, 202], "the busy requests were answered, not cut"
    finally:
        release.set()
        server.close()
