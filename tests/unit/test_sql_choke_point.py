"""Every SQL statement lakemirror runs goes through :func:`lakemirror.sql_exec.run_sql`, which logs it
at DEBUG: no product module calls a Spark session's ``sql`` itself. Parsed with ``ast``, so a call
split over lines is seen too; ``sql.sql(...)`` on a :class:`~lakemirror.sinks.sql.SqlExecutor` is
allowed (its Spark implementation calls ``run_sql``)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

from lakemirror.sql_exec import run_sql
from tests.unit.source_nodes import nodes_of

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("lakemirror", "daemon", "supervisor", "sources", "sinks", "checkpoints")
#: Receivers of ``.sql(...)`` that are SQL executors (their own ``sql`` runs through run_sql).
EXECUTORS = {"sql", "self.sql", "runner"}


def direct_calls() -> list[str]:
    found = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "sql_exec.py":
                continue
            for node in nodes_of(path.read_text(encoding="utf-8"), ast.Call):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sql":
                    receiver = ast.unparse(node.func.value)
                    if receiver not in EXECUTORS:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {receiver}.sql(...)")
    return found


def test_no_module_runs_sql_on_a_session_itself() -> None:
    assert direct_calls() == []


def test_run_sql_logs_every_statement_at_debug_with_credentials_redacted(caplog) -> None:  # type: ignore[no-untyped-def]
    class Session:
        def __init__(self) -> None:
            self.ran: list[str] = []

        def sql(self, statement: str) -> str:
            self.ran.append(statement)
            return "df"

    session = Session()
    with caplog.at_level(logging.DEBUG, logger="lakemirror.sql"):
        assert run_sql(session, "CREATE TABLE t LOCATION 's3a://k:secretvalue@b/t'") == "df"
    assert session.ran == ["CREATE TABLE t LOCATION 's3a://k:secretvalue@b/t'"]
    [record] = [r for r in caplog.records if r.name == "lakemirror.sql"]
    assert record.levelno == logging.DEBUG and "CREATE TABLE t" in record.getMessage()
    assert "secretvalue" not in record.getMessage()
