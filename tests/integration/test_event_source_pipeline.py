"""A pipeline configured with an event source runs under the real supervisor: one query for the
source, replicas in the destination schema, restarts resume from the checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.guard_plan import POSITION_COLUMN

pytestmark = pytest.mark.integration


def event(op: str, ts: int, pk: int, name: str | None = None) -> str:
    return json.dumps({"table_name": "customers", "operation": op, "before": None,
                       "after": None if name is None else json.dumps({"id": pk, "name": name}),
                       "timestamp": f"2024-01-01T00:00:{ts:02}Z", "transaction_id": f"T{ts}",
                       "primary_key": json.dumps({"id": pk})})


def drop(inbox: Path, name: str, *lines: str) -> None:
    tmp = inbox.parent / (name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, inbox / name)


def test_a_configured_files_source_replicates_through_the_supervisor(make_pipeline: Any, tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    p = make_pipeline(source={"kind": "files", "path": str(inbox), "format": "simple", "name": "crm"})
    replica = p.app.catalog.locate(TableName("dst", "sales", "customers"))

    def rows() -> dict[int, str | None]:
        if not tables.exists(p.spark, replica):
            return {}
        return {r["id"]: r["name"] for r in tables.read(p.spark, replica).drop(POSITION_COLUMN).collect()}

    drop(inbox, "a.json", event("INSERT", 1, 1, "a"), event("INSERT", 2, 2, "b"), event("UPDATE", 9, 1, "a2"))
    p.start()
    p.tick_until(lambda: rows() == {1: "a2", 2: "b"}, timeout=300, what="the first file")
    assert p.views()["events:crm"].state == "running"
    p.restart()  # a new daemon: the checkpoint says a.json is done
    drop(inbox, "b.json", event("DELETE", 10, 2), event("INSERT", 3, 1, "a (older)"), "poison")
    letters = p.app.catalog.locate(TableName("dst", "sales", "_lakemirror_dead_letters_crm"))
    p.tick_until(lambda: rows() == {1: "a2"} and tables.exists(p.spark, letters)
                 and p.views()["events:crm"].batches >= 1, timeout=300, what="the second file")
    assert [r["value"] for r in tables.read(p.spark, letters).collect()] == ["poison"]
    letter = tables.read(p.spark, letters).collect()[0]
    assert letter["table"] is None and letter["status"] == "pending" and "not JSON" in letter["reason"]
    # A restarted daemon counts the letters its table holds; the operator skips them through it.
    p.restart()
    p.tick_until(lambda: (p.views()["events:crm"].detail or {}).get("dead_letters") == 1, timeout=300,
                 what="the dead letters counted after a restart")
    assert p.views()["events:crm"].detail["dead_letters_pending"] == {"": 1}
    report = p.runner("events:crm").resolve_dead_letters("skip", None, timeout=300)
    assert [r.status for r in report.resolutions] == ["skipped"]
    assert [r["status"] for r in tables.read(p.spark, letters).collect()] == ["skipped"]
    p.tick_until(lambda: p.views()["events:crm"].detail["dead_letters_pending"] == {}, what="the pending count")
