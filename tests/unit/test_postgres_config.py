"""``destination: {kind: postgres}``: validated at start, bad values named; the one sink chooser."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lakemirror.daemon.app import postgres_connector
from lakemirror.daemon.config import load_settings
from lakemirror.daemon.destination_config import DeltaDestination
from lakemirror.errors import ConfigError
from lakemirror.sinks.choose import choose_sink

BASE: dict[str, Any] = {"source_catalog": "s", "destination_catalog": "d", "schema_name": "x",
                        "checkpoint_volume": "/tmp/lm-cfg-test"}
PG = {"kind": "postgres", "host": "db", "database": "app", "user": "lm"}


def settings(**destination: Any) -> Any:
    return load_settings(None, {**BASE, "destination": {**PG, **destination}})


def test_delta_is_the_default_and_needs_no_connector():
    s = load_settings(None, BASE)
    assert isinstance(s.destination, DeltaDestination) and postgres_connector(s) is None
    assert choose_sink("delta").kind == "delta"


def test_a_postgres_destination_becomes_one_target(monkeypatch):
    monkeypatch.setenv("LM_PG_PW", "s3cret")
    s = settings(schema="replicas", password_env="LM_PG_PW", max_connections=2, statement_timeout_seconds=1.5)
    target = s.destination.target()
    assert (target.host, target.port, target.schema, target.password, target.max_connections) == \
        ("db", 5432, "replicas", "s3cret", 2)
    assert "s3cret" not in repr(target)
    assert "statement_timeout=1500" in target.connect_kwargs()["options"]
    choice = choose_sink("postgres", target)
    assert choice.is_postgres and "db:5432/app" in choice.reason
    assert postgres_connector(s).target == target


def test_the_password_comes_from_a_file(tmp_path: Path):
    f = tmp_path / "pw"
    f.write_text("from-file\n")
    assert settings(password_file=str(f)).destination.target().password == "from-file"


@pytest.mark.parametrize("bad, field", [
    ({"port": 70000}, "destination.postgres.port"),
    ({"sslmode": "maybe"}, "destination.postgres.sslmode"),
    ({"max_connections": 0}, "destination.postgres.max_connections"),
    ({"statement_timeout_seconds": 0}, "destination.postgres.statement_timeout_seconds"),
    ({"password": "a", "password_env": "B"}, "destination.postgres"),
    ({"password_env": "LM_SURELY_UNSET_VAR"}, "destination.postgres"),
    ({"password_file": "/nonexistent/pw"}, "destination.postgres"),
    ({"hots": "typo"}, "destination.postgres.hots"),
])
def test_bad_values_name_the_field(bad, field):
    with pytest.raises(ConfigError) as err:
        settings(**bad)
    assert any(loc.endswith(field) for loc, _ in err.value.problems), err.value.problems


def test_an_unknown_kind_is_refused():
    with pytest.raises(ConfigError, match="destination"):
        load_settings(None, {**BASE, "destination": {"kind": "oracle"}})


def test_validate_exits_2_with_one_line_naming_the_field(tmp_path: Path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("source_catalog: s\ndestination_catalog: d\nschema_name: x\ncheckpoint_volume: /tmp/x\n"
                   "destination: {kind: postgres, host: db, database: app, user: lm, port: -1}\n")
    done = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", "validate", str(cfg)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "destination.postgres.port" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_an_event_source_with_a_postgres_destination_is_refused(tmp_path) -> None:
    from lakemirror.daemon.config import load_settings
    from lakemirror.errors import ConfigError
    path = tmp_path / "p.yaml"
    path.write_text(
        "source_catalog: a\ndestination_catalog: b\nschema_name: s\ncheckpoint_volume: " + str(tmp_path) + "\n"
        "source: {kind: files, path: " + str(tmp_path) + "}\n"
        "destination: {kind: postgres, host: h, database: d, user: u}\n")
    try:
        load_settings(path)
    except ConfigError as exc:
        assert "event `source` writes Delta replicas" in str(exc)
    else:
        raise AssertionError("accepted an event source with a Postgres destination")
