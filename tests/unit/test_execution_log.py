"""A run's execution log files: JSON lines and text, the run id on every line, DEBUG lines (every SQL
statement) in the files while the console keeps its level, stack traces of failures, no credential."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from lakemirror.checkpoints.audit import InMemoryAuditLog
from lakemirror.daemon.execution_log import execution_log
from lakemirror.daemon.settings.replicate import load_replicate_config
from lakemirror.errors import ConfigError
from lakemirror.identifiers import TableName
from lakemirror.sql_exec import run_sql
from lakemirror.supervisor.subtasks.batch_runner import BatchRunner, TableJob, TaskSettings


class Session:
    def sql(self, statement: str) -> None:
        return None


class Ops:
    def run(self, operation: str, job: Any, tag: str) -> dict[str, Any]:
        run_sql(Session(), f"DESCRIBE DETAIL {job.source}")
        if job.source.table == "bad":
            raise RuntimeError("boom: password=hunter2")
        return {}

    def cancel(self, tag: str) -> None:
        pass


def test_every_line_carries_the_run_id_debug_reaches_the_files_only(tmp_path: Path) -> None:
    root = logging.getLogger("test-execution-log")
    root.propagate = False
    console = io.StringIO()
    handler = logging.StreamHandler(console)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    sql_logger = logging.getLogger("lakemirror.sql")
    sql_logger.parent = root  # type: ignore[assignment]
    replicate_logger = logging.getLogger("lakemirror.supervisor.subtasks.batch_runner")
    replicate_logger.parent = root  # type: ignore[assignment]
    try:
        jobs = [TableJob(TableName("p", "s", t), TableName("d", "s", t),
                         TaskSettings(max_attempts=1)) for t in ("good", "bad")]
        with execution_log("run42", tmp_path / "logs", ["json", "text"], "DEBUG", logger=root) as files:
            summary = BatchRunner(Ops(), InMemoryAuditLog(), run_id="run42", execution_user="me",
                                  max_workers=2).run(jobs)
        assert not summary.ok
    finally:
        sql_logger.parent = logging.getLogger()  # type: ignore[assignment]
        replicate_logger.parent = logging.getLogger()  # type: ignore[assignment]
        root.removeHandler(handler)
    records = [json.loads(line) for line in files["json"].read_text().splitlines()]
    assert records and all(r["run_id"] == "run42" for r in records)
    assert {"SQL: DESCRIBE DETAIL p.s.good", "SQL: DESCRIBE DETAIL p.s.bad"} <= {r["message"] for r in records}
    traced = [r for r in records if "exception" in r]
    assert traced and "RuntimeError: boom" in traced[0]["exception"] and "Traceback" in traced[0]["exception"]
    text = files["text"].read_text()
    assert text.count("run=run42") == len(text.strip().splitlines()) > len(records)  # trace lines too
    assert "hunter2" not in text and "hunter2" not in files["json"].read_text()
    assert "SQL:" not in console.getvalue() and "attempt 1 of 1 failed" in console.getvalue()
    assert files["text"].name.startswith("replicate-") and files["text"].name.endswith("-run42.log")


def test_the_setting_is_validated() -> None:
    base: dict[str, Any] = {"catalogs": [{"name": "a", "target_catalog": "b"}]}
    ok = load_replicate_config(None, data={**base, "execution_log": {"folder": "/var/log/lm"}})
    assert ok.execution_log is not None and ok.execution_log.formats == ["json", "text"]
    for bad, field in (({"folder": "s3a://b/logs"}, "execution_log.folder"),
                       ({"folder": "/x", "formats": []}, "execution_log.formats"),
                       ({"folder": "/x", "formats": ["xml"]}, "execution_log.formats"),
                       ({"folder": "/x", "level": "TRACE"}, "execution_log.level")):
        with pytest.raises(ConfigError) as caught:
            load_replicate_config(None, data={**base, "execution_log": bad})
        assert any(field in loc for loc, _ in caught.value.problems), caught.value.problems
