"""The audit log's columns (exactly the seed's) and secret masking."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from pydantic import SecretStr

from lakemirror.checkpoints.audit import AUDIT_DDL, MASK, AuditRecord, InMemoryAuditLog, config_json, mask_secrets

SEED_COLUMNS = ["run_id", "logging_time", "operation_type", "catalog_name", "schema_name", "object_name",
                "object_type", "status", "start_time", "end_time", "duration_seconds", "error_message",
                "details", "attempt_number", "max_attempts", "config_details", "execution_user"]


def test_columns_are_exactly_the_seeds():
    assert AuditRecord.column_names() == SEED_COLUMNS
    assert [part.split()[0] for part in AUDIT_DDL.split(", ")] == SEED_COLUMNS


def test_secrets_are_masked_wherever_they_are():
    cfg = {"http": {"auth_token": "abc", "port": 1}, "keys": ["id"], "db": [{"password": "p", "user": "u"}],
           "client_secret": "s", "token": None, "wrapped": SecretStr("hidden"), "primary_key": "id"}
    masked = mask_secrets(cfg)
    assert masked["http"] == {"auth_token": MASK, "port": 1}
    assert masked["db"] == [{"password": MASK, "user": "u"}]
    assert masked["client_secret"] == MASK and masked["wrapped"] == MASK
    assert masked["keys"] == ["id"] and masked["primary_key"] == "id" and masked["token"] is None
    text = config_json(cfg)
    assert "abc" not in text and "hidden" not in text and json.loads(text)["http"]["port"] == 1


def test_in_memory_twin_keeps_rows_in_order():
    log = InMemoryAuditLog()
    now = datetime.now(timezone.utc)
    for n, status in ((1, "failed"), (2, "success")):
        log.append(AuditRecord("r", now, "clone", "c", "s", "t", "table", status, now, now, 0.0,
                               None, None, n, 3, "{}", "me"))
    assert [(r.attempt_number, r.status) for r in log.records] == [(1, "failed"), (2, "success")]
