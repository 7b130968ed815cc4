"""`lakemirror status` without a daemon: the shape of ``/status`` from the pipeline's records, and
no JVM for a pipeline that never ran or an event source."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lakemirror.daemon.cli import main
from lakemirror.daemon.http import ControlServer
from lakemirror.daemon.offline_status import offline_status
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.settings.runtime_spec import pipeline_spec
from lakemirror.daemon.status import status_info
from lakemirror.supervisor.control.loop import TableView
from lakemirror.supervisor.events.status_record import EventSourceRecord, save_record


def write_config(tmp_path: Path, **extra: Any) -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "pipeline_id": "p", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "s",
        "tables": ["orders", "customers"], "checkpoint_volume": str(tmp_path / "ck"),
        "runtime": {"mode": "local", "warehouse": str(tmp_path / "lake")}, **extra}))
    return path


def daemon_status(settings: Any) -> dict[str, Any]:
    """What a running daemon's /status answers (the server's own code), with one table."""
    view = TableView("orders", "running", 0.0, 0, 3, 10, 1, 0, 0, None, None, 1.0)
    server = ControlServer("127.0.0.1", 0, CollectorRegistry(), lambda: [view], status_info(pipeline_spec(settings)))
    try:
        from lakemirror.daemon import routes

        match = routes.match("GET", "/status")
        assert match is not None and not isinstance(match, str)
        return server.answer(match, None)[1]  # type: ignore[no-any-return]
    finally:
        server.server.server_close()


def test_a_pipeline_that_never_ran_lists_its_tables_in_the_daemons_shape(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path)
    assert main(["status", str(path), "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    up = daemon_status(load_settings(path))
    assert set(offline) == set(up) and offline["pipeline_id"] == "p" and offline["subtasks"] == []
    assert [t["table"] for t in offline["tables"]] == ["orders", "customers"]
    assert all(set(t) == set(up["tables"][0]) for t in offline["tables"])
    assert {t["state"] for t in offline["tables"]} == {"not started"}
    assert not (tmp_path / "ck").exists(), "status writes nothing"
    assert main(["status", str(path)]) == 0
    text = capsys.readouterr().out
    assert "orders" in text and "not started" in text


def test_an_event_source_without_its_daemon_shows_its_replicas(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, tables=None, source={"kind": "files", "name": "shop", "path": str(tmp_path / "in")})
    folder = tmp_path / "ck" / "p" / "events" / "shop"
    save_record(folder, EventSourceRecord(batch_id=4, last_batch_at=100.0, dead_letters=2, replicas={
        "customers": {"inserted": 7, "updated": 2, "deleted": 1, "batches": 4, "position_basis": "postgres lsn"}}))
    assert main(["status", str(path)]) == 0
    text = capsys.readouterr().out
    assert "events:shop" in text and "stopped" in text
    assert "event source shop (files): dead letters 2" in text and "customers" in text and "postgres lsn" in text
    status = offline_status(load_settings(path))
    assert status is not None and status["tables"][0]["applied_through"] == 4


def test_a_never_started_event_source_is_listed_as_such(tmp_path: Path) -> None:
    path = write_config(tmp_path, tables=None, source={"kind": "files", "name": "shop", "path": str(tmp_path / "in")})
    status = offline_status(load_settings(path))
    assert status is not None and [(t["table"], t["state"]) for t in status["tables"]] == [("events:shop", "not started")]
    assert asdict(TableView("x", "y", None, None, None, 0, 0, 0, 0, None, None, None)).keys() == status["tables"][0].keys()
