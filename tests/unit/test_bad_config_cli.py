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
    ("size Delta cannot read", {"max_bytes_per_trigger": "abc"}, "max_bytes_per_trigger", "is not a size"),
    ("negative size", {"max_bytes_per_trigger": -5}, "max_bytes_per_trigger", "is not a size"),
    ("zero size", {"max_bytes_per_trigger": 0}, "max_bytes_per_trigger", "larger than 0"),
    ("heap the JVM cannot read", {"runtime": {"driver_memory": "2048"}}, "runtime.driver_memory", "heap size"),
    ("bad table property", {"replica_properties": {"delta.enableDeletionVectors": "yes"}}, "replica_properties",
     "true or false"),
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


REPEATED = """\
source_catalog: src
destination_catalog: dst
schema_name: sales
checkpoint_volume: CKPT
runtime:
  warehouse: WAREHOUSE
schema_name: finance
runtime:
  master: local[1]
"""


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_key_written_twice_exits_2_with_both_lines(tmp_path: Path, command: str) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(REPEATED.replace("CKPT", str(tmp_path / "ck")).replace("WAREHOUSE", str(tmp_path / "wh")))
    done = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", command, str(path)],
                          capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert f"{path}:7:1: key 'schema_name' appears twice in one mapping (lines 3 and 7)" in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "ck").exists() and not (tmp_path / "wh").exists(), "nothing may start"


def test_replicate_refuses_a_key_written_twice(tmp_path: Path) -> None:
    path = tmp_path / "replicate.yaml"
    path.write_text("max_workers: 2\ncatalogs: [{name: prod, target_catalog: dr}]\nmax_workers: 3\n")
    done = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", "replicate", str(path)],
                          capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "key 'max_workers' appears twice in one mapping (lines 1 and 3)" in out and "Traceback" not in out


@pytest.mark.parametrize("command", ["validate", "run"])
def test_credentials_in_a_bad_value_are_not_echoed(tmp_path: Path, command: str) -> None:
    path = _write(tmp_path, {"schema_name": "sales password=hunter2.", "tables": ["s3a://AKIA:secret@bucket/t"]})
    done = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", command, str(path)],
                          capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "schema_name" in out and "tables" in out
    assert "hunter2" not in out and "secret@" not in out, out


def test_a_misspelled_environment_variable_is_named_on_stderr(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("LAKEMIRROR_")}
    env["LAKEMIRROR_TRIGGER_INTERVALSECONDS"] = "60"
    done = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", "validate", str(_write(tmp_path, {}))],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert ("environment variable LAKEMIRROR_TRIGGER_INTERVALSECONDS is not a lakemirror setting and is ignored; "
            "did you mean LAKEMIRROR_TRIGGER_INTERVAL_SECONDS?") in done.stderr
