"""The dead-letter routes of the daemon's HTTP endpoint and the `lakemirror dead-letters` command,
against a fake event source (the runner's side is tests/unit/test_dead_letter_isolation.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from lakemirror.daemon import routes
from lakemirror.daemon.cli import main
from lakemirror.daemon.dead_letter_api import DeadLetterApi
from lakemirror.sinks.events.dead_letters import REPLAYED, Resolution
from lakemirror.supervisor.events.dead_letters import LetterReport

LETTER = {"id": "3f2a9c0d1e2b4a5c", "table": "orders", "origin": "shop.public.orders", "partition": 0, "offset": 41,
          "key": '{"id": 3}', "position": "stream lsn=24023560 txId=771 order=2", "reason": "the replica refused it",
          "status": "pending", "batch_id": 7, "recorded_at": None, "resolved_at": None, "resolution": None}


class FakeSource:
    keeps_dead_letters_in_delta = True
    letters_elsewhere = ""

    def __init__(self, slow: bool = False) -> None:
        self.slow = slow
        self.calls: list[tuple[Any, ...]] = []

    def dead_letters(self, status: str | None = None, table: str | None = None, limit: int = 500,
                     timeout: float = 30.0) -> list[dict[str, Any]]:
        self.calls.append(("list", status, table, limit))
        if self.slow:
            raise TimeoutError()
        return [LETTER]

    def resolve_dead_letters(self, verb: str, ids: Sequence[str] | None, table: str | None = None,
                             timeout: float = 30.0) -> LetterReport:
        self.calls.append((verb, ids, table))
        if self.slow:
            raise TimeoutError()
        return LetterReport(verb, tuple(Resolution(i, REPLAYED, "replayed into orders: 1 inserted") for i in ids or ()),
                            ("nope",))


def call(api: DeadLetterApi, method: str, target: str, body: Any = None) -> tuple[int, Any]:
    m = routes.match(method, target)
    assert isinstance(m, routes.Match), target
    return api.handle(m, body)


def test_list_skip_and_replay_reach_the_named_source() -> None:
    source = FakeSource()
    api = DeadLetterApi(lambda name: source if name == "shop" else None)
    assert call(api, "GET", "/api/events/shop/dead-letters?status=pending&table=orders") == \
        (200, {"source": "shop", "letters": [LETTER]})
    code, payload = call(api, "POST", "/api/events/shop/dead-letters/replay", {"ids": ["3f2a9c0d1e2b4a5c", "nope"]})
    assert code == 200 and payload["letters"][0]["status"] == REPLAYED and payload["unknown"] == ["nope"]
    assert call(api, "POST", "/api/events/shop/dead-letters/skip", {"all_pending": True, "table": "orders"})[0] == 200
    assert source.calls[1:] == [("replay", ["3f2a9c0d1e2b4a5c", "nope"], None), ("skip", None, "orders")]


@pytest.mark.parametrize("target, body, code", [
    ("/api/events/other/dead-letters", None, 404),
    ("/api/events/shop/dead-letters?status=lost", None, 422),
    ("/api/events/shop/dead-letters?limit=0", None, 422),
])
def test_a_bad_list_request_is_refused_with_what_is_wrong(target: str, body: Any, code: int) -> None:
    api = DeadLetterApi(lambda name: FakeSource() if name == "shop" else None)
    assert call(api, "GET", target, body)[0] == code


@pytest.mark.parametrize("body", [None, [], {}, {"ids": []}, {"ids": "x"}, {"ids": ["a"], "all_pending": True},
                                  {"all_pending": "yes"}])
def test_a_skip_or_replay_needs_ids_or_all_pending(body: Any) -> None:
    code, payload = call(DeadLetterApi(lambda name: FakeSource()), "POST", "/api/events/shop/dead-letters/skip", body)
    assert code == 422 and payload["problems"]


def test_slow_work_answers_202_or_504_and_goes_on() -> None:
    api = DeadLetterApi(lambda name: FakeSource(slow=True), timeout_seconds=0.01)
    assert call(api, "GET", "/api/events/shop/dead-letters")[0] == 504
    assert call(api, "POST", "/api/events/shop/dead-letters/replay", {"ids": ["a"]})[0] == 202


def test_a_postgres_source_points_at_its_own_table() -> None:
    from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas

    source = FakeSource()
    source.keeps_dead_letters_in_delta, source.letters_elsewhere = False, PostgresEventReplicas.letters_elsewhere
    code, payload = call(DeadLetterApi(lambda name: source), "GET", "/api/events/shop/dead-letters")
    assert code == 409 and payload["error"] == ("event source 'shop' writes PostgreSQL replicas: its dead letters are "
                                                "rows of lakemirror_event_dead_letters in the destination schema")


def test_the_routes_need_authorization() -> None:
    for method, target in (("GET", "/api/events/s/dead-letters"), ("POST", "/api/events/s/dead-letters/skip")):
        m = routes.match(method, target)
        assert isinstance(m, routes.Match) and m.route.api


# -- the command line ----------------------------------------------------------------------------------


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Path, str, list[tuple[str, str, Any]]]]:
    """A stand-in daemon endpoint recording what it was asked, and a pipeline with an event source."""
    seen: list[tuple[str, str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            seen.append(("GET", self.path, None))
            self._answer({"source": "shop", "letters": [LETTER]})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(("POST", self.path, body))
            self._answer({"verb": "replay", "unknown": [], "letters": [
                {"id": i, "status": "replayed", "resolution": "replayed into orders: 1 inserted"} for i in body["ids"]]})

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "in").mkdir()
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"source_catalog: app\ndestination_catalog: lake\nschema_name: public\n"
                      f"checkpoint_volume: {tmp_path / 'cp'}\nsource: {{kind: files, path: {tmp_path / 'in'}, "
                      f"name: shop}}\n")
    try:
        yield config, f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_command_lists_and_replays_through_the_running_daemon(
        daemon: tuple[Path, str, list[Any]], capsys: pytest.CaptureFixture[str]) -> None:
    config, url, seen = daemon
    assert main(["dead-letters", str(config), "--url", url, "--table", "orders"]) == 0
    out = capsys.readouterr().out
    assert "3f2a9c0d1e2b4a5c" in out and "stream lsn=24023560" in out and '{"id": 3}' in out
    assert main(["dead-letters", str(config), "replay", "3f2a9c0d1e2b4a5c", "--url", url]) == 0
    assert "3f2a9c0d1e2b4a5c  replayed  replayed into orders: 1 inserted" in capsys.readouterr().out
    assert seen == [("GET", "/api/events/shop/dead-letters?status=pending&table=orders", None),
                    ("POST", "/api/events/shop/dead-letters/replay", {"ids": ["3f2a9c0d1e2b4a5c"]})]


def test_the_command_needs_ids_or_all_pending(daemon: tuple[Path, str, list[Any]],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    config, url, seen = daemon
    assert main(["dead-letters", str(config), "skip", "--url", url]) == 2
    assert "give the letters' ids, or --all-pending" in capsys.readouterr().err and seen == []


def test_without_a_daemon_the_command_says_how_to_start_one(daemon: tuple[Path, str, list[Any]],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config, _, _ = daemon
    assert main(["dead-letters", str(config)]) == 1
    assert "no running daemon" in capsys.readouterr().err


# -- the change-feed tables' letters: the same routes and command ------------------------------------------

FEED_LETTER = {"id": "5b1e0c7a9f3d2e64", "table": "orders", "source": "app.public.orders", "key": '{"id": 2}',
               "commit_version": 3, "change_type": "update_postimage", "row": '{"amount": -2.5, "id": 2}',
               "reason": "the replica refused it: CHECK constraint positive (amount > 0) violated", "status": "pending",
               "batch_id": 4, "txn_app_id": "lakemirror/p/orders/e0", "recorded_at": None, "resolved_at": None,
               "resolution": None}


def test_the_change_feed_routes_reach_the_pipelines_letters() -> None:
    desk = FakeSource()
    api = DeadLetterApi(lambda name: None, feed=lambda: desk)
    code, payload = call(api, "GET", "/api/change-feed/dead-letters?status=pending&table=orders&limit=20")
    assert code == 200 and payload == {"letters": [LETTER]}
    code, payload = call(api, "POST", "/api/change-feed/dead-letters/replay", {"ids": ["5b1e0c7a9f3d2e64"]})
    assert code == 200 and payload["letters"][0]["status"] == REPLAYED
    assert call(api, "POST", "/api/change-feed/dead-letters/skip", {"all_pending": True, "table": "orders"})[0] == 200
    assert desk.calls == [("list", "pending", "orders", 20), ("replay", ["5b1e0c7a9f3d2e64"], None),
                          ("skip", None, "orders")]
    assert call(api, "POST", "/api/change-feed/dead-letters/skip", {"ids": []})[0] == 422
    assert call(api, "GET", "/api/change-feed/dead-letters?status=lost")[0] == 422
    assert call(api, "GET", "/api/change-feed/dead-letters?table=" + "t" * 256)[0] == 422        # the routes' bounds
    assert call(api, "POST", "/api/change-feed/dead-letters/replay", {"ids": ["x" * 256]})[0] == 422
    slow = DeadLetterApi(lambda name: None, timeout_seconds=0.01, feed=lambda: FakeSource(slow=True))
    assert call(slow, "GET", "/api/change-feed/dead-letters")[0] == 504
    assert call(slow, "POST", "/api/change-feed/dead-letters/replay", {"ids": ["a"]})[0] == 202
    for m, t in (("GET", "/api/change-feed/dead-letters"), ("POST", "/api/change-feed/dead-letters/replay")):
        route = routes.match(m, t)
        assert isinstance(route, routes.Match) and route.route.api and route.route.mutating == (m == "POST")


def test_a_pipeline_without_change_feed_letters_says_where_its_letters_are() -> None:
    from lakemirror.daemon.dead_letter_api import NoFeedLetters

    events = DeadLetterApi(lambda name: None, feed=lambda: NoFeedLetters(404, "an event source feeds it"))
    assert call(events, "GET", "/api/change-feed/dead-letters") == (404, {"error": "an event source feeds it"})
    postgres = DeadLetterApi(lambda name: None, feed=lambda: NoFeedLetters(409, "rows of lakemirror_dead_letters"))
    assert call(postgres, "POST", "/api/change-feed/dead-letters/skip", {"ids": ["a"]})[0] == 409
    assert call(DeadLetterApi(lambda name: None), "GET", "/api/change-feed/dead-letters")[0] == 404


def test_the_command_serves_a_change_feed_pipeline_through_the_same_routes(
        daemon: tuple[Path, str, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, url, seen = daemon
    config = tmp_path / "feed.yaml"
    config.write_text(f"source_catalog: app\ndestination_catalog: lake\nschema_name: public\n"
                      f"checkpoint_volume: {tmp_path / 'cp'}\n")
    assert main(["dead-letters", str(config), "--url", url, "--table", "orders"]) == 0
    assert main(["dead-letters", str(config), "replay", "5b1e0c7a9f3d2e64", "--url", url]) == 0
    assert seen == [("GET", "/api/change-feed/dead-letters?status=pending&table=orders", None),
                    ("POST", "/api/change-feed/dead-letters/replay", {"ids": ["5b1e0c7a9f3d2e64"]})]
    capsys.readouterr()
    postgres = tmp_path / "pg.yaml"
    postgres.write_text(config.read_text() + "destination: {kind: postgres, host: h, database: d, user: u}\n")
    assert main(["dead-letters", str(postgres), "--url", url]) == 2
    assert "lakemirror_dead_letters in PostgreSQL schema public" in capsys.readouterr().err and len(seen) == 2


def test_a_change_feed_letter_shows_its_version_and_a_refused_replays_reason() -> None:
    from lakemirror.daemon.dead_letters_cli import render_letters

    again = {**FEED_LETTER, "resolution": "replay refused by the replica"}
    out = render_letters([FEED_LETTER, again]).splitlines()
    assert out[0].split() == ["ID", "TABLE", "KEY", "POSITION", "STATUS", "REASON"]
    assert "version 3 update_postimage" in out[1] and "CHECK constraint positive" in out[1]
    assert out[2].endswith("[replay refused by the replica]")


def test_the_command_sends_the_token_the_running_daemon_generated(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """With ``http.auth: token`` and no ``http.auth_token``, the daemon's routes need the token it wrote
    to ``daemon.token``: the command reads it there, as ``pause`` and ``resume`` do."""
    from lakemirror.checkpoints import layout
    from lakemirror.daemon import http_token
    from lakemirror.daemon.settings import load_settings

    heard: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            heard.append(self.headers.get("Authorization"))
            body = json.dumps({"letters": [FEED_LETTER]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = tmp_path / "feed.yaml"
    config.write_text(f"source_catalog: app\ndestination_catalog: lake\nschema_name: public\n"
                      f"checkpoint_volume: {tmp_path / 'cp'}\n")
    settings = load_settings(config)
    http_token.write(layout.pipeline_dir(tmp_path / "cp", settings.effective_pipeline_id), "s3cret-token")
    try:
        assert main(["dead-letters", str(config), "--url", f"http://127.0.0.1:{server.server_address[1]}"]) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert heard == ["Bearer s3cret-token"] and "version 3 update_postimage" in capsys.readouterr().out
