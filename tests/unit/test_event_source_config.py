"""The ``source:`` block: an event stream configured beside the Delta settings, validated the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lakemirror.daemon.cli import main
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.settings.runtime_spec import event_stream_spec
from lakemirror.errors import ConfigError

BASE: dict[str, Any] = {"source_catalog": "cdc", "destination_catalog": "dst", "schema_name": "shop",
                        "checkpoint_volume": "/tmp/ckpt"}


def settings_with(source: dict[str, Any]) -> Any:
    return load_settings(None, {**BASE, "source": source})


def problems(source: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        settings_with(source)
    return info.value.problems


def test_a_files_source_becomes_the_stream_spec(tmp_path: Path) -> None:
    s = settings_with({"kind": "files", "path": str(tmp_path), "format": "simple", "tables": ["customers"],
                       "key_columns": {"orders": ["order_id", "line"]}, "tombstone_horizon_seconds": 60})
    spec = event_stream_spec(s.source, s)
    assert (spec.kind, spec.format, spec.path, spec.tables) == ("files", "simple", str(tmp_path), ("customers",))
    assert spec.key_columns == {"orders": ("order_id", "line")} and spec.tombstone_horizon_seconds == 60
    assert load_settings(None, BASE).source is None


@pytest.mark.parametrize("source, where, message", [
    ({"kind": "files"}, "command line: source", "kind files needs path"),
    ({"kind": "files", "path": "/no/such/dir"}, "command line: source.path", "is not a directory"),
    ({"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092"}, "command line: source", "needs topics or topic_pattern"),
    ({"kind": "kafka", "topics": ["a"]}, "command line: source", "needs bootstrap_servers"),
    ({"kind": "ftp", "path": "/tmp"}, "command line: source.kind", "Input should be 'files' or 'kafka'"),
    ({"kind": "files", "path": "/tmp", "format": "avro"}, "command line: source.format", "'debezium' or 'simple'"),
    ({"kind": "files", "path": "/tmp", "pth": 1}, "command line: source.pth", "unknown setting"),
    ({"kind": "files", "path": "/tmp", "name": "a b"}, "command line: source.name", "name must be"),
    ({"kind": "files", "path": "/tmp", "key_columns": {"t": []}}, "command line: source", "key_columns.t is empty"),
    ({"kind": "files", "path": "/tmp", "tombstone_horizon_seconds": 0}, "command line: source.tombstone_horizon_seconds",
     "greater than 0"),
])
def test_bad_sources_name_the_field(source: dict[str, Any], where: str, message: str) -> None:
    found = problems(source)
    assert any(w == where and message in m for w, m in found), found


def test_validate_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**BASE, "checkpoint_volume": str(tmp_path / "c"),
                                    "runtime": {"warehouse": str(tmp_path / "w")},
                                    "source": {"kind": "files", "path": str(tmp_path / "missing")}}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "source.path" in err and "is not a directory" in err and "Traceback" not in err


def test_history_scd2_reaches_the_stream_spec_and_defaults_to_current_rows(tmp_path: Path) -> None:
    s = settings_with({"kind": "files", "path": str(tmp_path), "history": "scd2"})
    assert event_stream_spec(s.source, s).history == "scd2"
    plain = settings_with({"kind": "files", "path": str(tmp_path)})
    assert event_stream_spec(plain.source, plain).history == "current"
    assert any(w == "command line: source.history" and "'current' or 'scd2'" in m
               for w, m in problems({"kind": "files", "path": str(tmp_path), "history": "scd3"}))


def test_history_scd2_into_postgres_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, {**BASE, "source": {"kind": "files", "path": str(tmp_path), "history": "scd2"},
                             "destination": {"kind": "postgres", "host": "db", "database": "app", "user": "lm"}})
    assert any("history scd2 needs a Delta destination" in m for _, m in info.value.problems), info.value.problems
