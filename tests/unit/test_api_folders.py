"""What a pipeline posted to the control API may write and delete: its folder lies inside the daemon's
own checkpoint_volume, lakemirror creates and marks it, and only a folder so marked for that pipeline
is removed by DELETE ?cleanup_checkpoints=true. Real server and client, in-memory runners."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest

from lakemirror.daemon.pipelines import OWNER_MARKER
from tests.unit.test_api import Daemon, body, call

CREATE = "/api/continuous-sync"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    d.close()


def victim(tmp_path: Path) -> Path:
    """A folder of someone else's, with data in it."""
    folder = tmp_path / "home" / "victimdir"
    (folder / "docs").mkdir(parents=True)
    (folder / "docs" / "thesis.tex").write_text("years of work")
    return folder


def test_a_folder_outside_the_daemons_checkpoint_volume_is_refused_and_never_deleted(
        daemon: Daemon, tmp_path: Path) -> None:
    """The attack of issue 46: post a pipeline named after a folder, then DELETE it with cleanup."""
    target = victim(tmp_path)
    for volume, pid in ((str(target.parent), "victimdir"), ("/etc", "passwd-p"), (str(tmp_path), "ck"),
                        (str(tmp_path / "ck" / ".." / "home"), "victimdir")):
        code, answer = call("POST", f"{daemon.url}{CREATE}", body(tmp_path, checkpoint_volume=volume, pipeline_id=pid))
        assert code == 422, (volume, answer)
        [problem] = answer["problems"]
        assert problem["field"] == "checkpoint_volume" and "is not inside" in problem["message"], answer
        assert f"{tmp_path / 'ck'}, the daemon's checkpoint_volume" in problem["message"]
    code, _ = call("DELETE", f"{daemon.url}{CREATE}/victimdir?cleanup_checkpoints=true")
    assert code == 404
    assert (target / "docs" / "thesis.tex").read_text() == "years of work"
    assert [p.pipeline_id for p in daemon.registry.all()] == ["main"]


def test_a_folder_lakemirror_did_not_create_is_never_deleted(daemon: Daemon, tmp_path: Path) -> None:
    """A folder inside the checkpoint volume that was there before the pipeline (or whose marker
    names another pipeline, or is a link) runs the pipeline but is not removed by cleanup."""
    existing = tmp_path / "ck" / "p2"
    (existing / "data").mkdir(parents=True)
    (existing / "data" / "keep").write_text("not lakemirror's")
    assert call("POST", f"{daemon.url}{CREATE}", body(tmp_path))[0] == 201
    assert not (existing / OWNER_MARKER).exists(), "an existing folder is never marked"
    code, answer = call("DELETE", f"{daemon.url}{CREATE}/p2?cleanup_checkpoints=true")
    assert code == 409 and "was not created by lakemirror for pipeline 'p2'" in answer["error"], answer
    assert "pipeline not stopped" in answer["error"] and call("GET", f"{daemon.url}{CREATE}/p2")[0] == 200
    assert (existing / "data" / "keep").is_file()

    (existing / OWNER_MARKER).write_text(json.dumps({"pipeline_id": "other", "created_by": "lakemirror"}))
    assert call("DELETE", f"{daemon.url}{CREATE}/p2?cleanup_checkpoints=true")[0] == 409
    (existing / OWNER_MARKER).unlink()
    elsewhere = tmp_path / "forged"
    elsewhere.write_text(json.dumps({"pipeline_id": "p2", "created_by": "lakemirror"}))
    os.symlink(elsewhere, existing / OWNER_MARKER)
    assert call("DELETE", f"{daemon.url}{CREATE}/p2?cleanup_checkpoints=true")[0] == 409
    assert (existing / "data" / "keep").is_file()


def test_the_folder_lakemirror_created_is_deleted_with_everything_the_pipeline_wrote(
        daemon: Daemon, tmp_path: Path) -> None:
    assert call("POST", f"{daemon.url}{CREATE}", body(tmp_path, checkpoint_volume=str(tmp_path / "ck" / "a" / "b"))
                )[0] == 201
    folder = tmp_path / "ck" / "a" / "b" / "p2"
    marker = json.loads((folder / OWNER_MARKER).read_text())
    assert marker["pipeline_id"] == "p2" and marker["created_by"] == "lakemirror"
    (folder / "src.sales.orders" / "e1" / "offsets").mkdir(parents=True)
    code, answer = call("DELETE", f"{daemon.url}{CREATE}/p2?cleanup_checkpoints=true")
    assert (code, answer["checkpoints_deleted"]) == (200, True)
    assert not folder.exists()
    assert (tmp_path / "ck" / "a" / "b").is_dir(), "only the pipeline's own folder goes"


def test_a_pipeline_that_does_not_start_leaves_no_folder(daemon: Daemon, tmp_path: Path) -> None:
    def refuse(settings: object) -> object:
        raise RuntimeError("the checkpoint table cannot be opened")

    daemon.api.start_pipeline = refuse  # type: ignore[assignment]
    code, _ = call("POST", f"{daemon.url}{CREATE}", body(tmp_path))
    assert code == 500
    assert not (tmp_path / "ck" / "p2").exists()


def test_a_checkpoint_folder_inside_a_delta_table_is_refused(daemon: Daemon, tmp_path: Path) -> None:
    table = tmp_path / "ck" / "lake" / "orders"
    (table / "_delta_log").mkdir(parents=True)
    code, answer = call("POST", f"{daemon.url}{CREATE}", body(tmp_path, checkpoint_volume=str(table)))
    assert code == 422 and "inside the Delta table at" in answer["problems"][0]["message"], answer
    assert not (table / "p2").exists()


def test_a_posted_pipeline_runs_with_the_daemons_runtime_and_not_its_environment(
        daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEMIRROR_TABLES", '["injected"]')
    assert call("POST", f"{daemon.url}{CREATE}", body(tmp_path))[0] == 201
    handle = daemon.registry.get("p2")
    assert handle is not None
    assert handle.settings.runtime == daemon.settings.runtime and handle.settings.tables == ["orders", "customers"]


def test_problems_of_a_huge_body_are_cut_short(daemon: Daemon, tmp_path: Path) -> None:
    fields = {f"unknown_{'k' * 400}_{i}": 1 for i in range(200)}
    code, answer = call("POST", f"{daemon.url}{CREATE}", {**body(tmp_path), **fields})
    assert code == 422 and len(answer["problems"]) == 31, len(answer["problems"])
    assert answer["problems"][-1] == {"field": "…", "message": "and 170 more problems"}
    assert all(len(p["field"]) < 260 for p in answer["problems"])
