"""Bad configuration files, through the real command line: `lakemirror validate` and `lakemirror run`
each exit 2 before anything starts, name the field (and the file), and print no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

GOOD: dict[str, Any] = {"source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
                        "checkpoint_volume": "CKPT", "runtime": {"warehouse": "WAREHOUSE"}}

CASES = [
    ("wrong type", {"trigger_interval_seconds": "often"}, "trigger_interval_seconds", "valid number"),
    ("wrong nested type", {"http": {"port": "eighty"}}, "http.port", "valid integer"),
    ("unknown key", {"trigger_intervall_seconds": 5}, "trigger_intervall_seconds", "unknown setting"),
    ("unknown nested key", {"restart": {"base_delay": 1}}, "restart.base_delay", "unknown setting"),
    ("missing field", {"schema_name": None}, "schema_name", "required setting is missing"),
    ("bad identifier", {"schema_name": "sales/eu"}, "schema_name", "may not contain"),
    ("bad table name", {"tables": ["a.b"]}, "tables", "may not contain"),
    ("negative interval", {"lag_interval_seconds": -2}, "lag_interval_seconds", "greater than 0"),
    ("zero backoff", {"restart": {"base_delay_seconds": 0}}, "restart.base_delay_seconds", "greater than 0"),
    ("unreachable checkpoint path", {"checkpoint_volume": "FILE/ckpt"}, "checkpoint_volume", "is a file, not a directory"),
    ("unreachable warehouse", {"runtime": {"warehouse": "FILE"}}, "runtime.warehouse", "is a file, not a directory"),
    ("bad policy", {"change_window_policy": "ignore"}, "change_window_policy", "'fail' or 'resync'"),
]


def _write(tmp_path: Path, changes: dict[str, Any]) -> Path:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    data = yaml.safe_load(yaml.safe_dump({**GOOD, **changes}))
    text = yaml.safe_dump({k: v for k, v in data.items() if v is not None})
    text = (text.replace("CKPT", str(tmp_path / "ck")).replace("WAREHOUSE", str(tmp_path / "wh"))
            .replace("FILE", str(a_file)))
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("what, changes, field, message", CASES, ids=[c[0] for c in CASES])
def test_bad_file_exits_2_naming_the_field(tmp_path: Path, command: str, what: str, changes: dict[str, Any],
                                           field: str, message: str) -> None:
    path = _write(tmp_path, changes)
    done = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", command, str(path)],
                          capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert f"{path}: {field}:" in out and message in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "ck").exists() and not (tmp_path / "wh").exists(), "nothing may start"


def test_the_good_file_validates(tmp_path: Path) -> None:
    path = _write(tmp_path, {})
    done = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
