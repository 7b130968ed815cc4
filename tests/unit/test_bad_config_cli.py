"""Bad configuration files, through the command line's own entry point (:func:`lakemirror.daemon.cli.main`,
in this process): `lakemirror validate` and `lakemirror run` each return 2 before anything starts, name
the field (and the file), and print no traceback. The same as separate processes, with the exit code a
shell sees: tests/e2e/test_cli_process.py."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from lakemirror.daemon.cli import main


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    """A `run` that wrongly gets past its configuration would run the daemon: fail it instead of hanging."""
    def expired(signum: int, frame: Any) -> None:
        raise AssertionError("the command did not return within 60 s: it started instead of refusing the file")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def lakemirror(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The command's exit code and everything it printed."""
    code = main(list(argv))
    printed = capsys.readouterr()
    return code, printed.out + printed.err

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
def test_bad_file_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
                                           what: str, changes: dict[str, Any], field: str, message: str) -> None:
    path = _write(tmp_path, changes)
    code, out = lakemirror(capsys, command, str(path))
    assert code == 2, out
    assert f"{path}: {field}:" in out and message in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "ck").exists() and not (tmp_path / "wh").exists(), "nothing may start"


def test_the_good_file_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = lakemirror(capsys, "validate", str(_write(tmp_path, {})))
    assert code == 0, out


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
def test_a_key_written_twice_exits_2_with_both_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      command: str) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(REPEATED.replace("CKPT", str(tmp_path / "ck")).replace("WAREHOUSE", str(tmp_path / "wh")))
    code, out = lakemirror(capsys, command, str(path))
    assert code == 2, out
    assert f"{path}:7:1: key 'schema_name' appears twice in one mapping (lines 3 and 7)" in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "ck").exists() and not (tmp_path / "wh").exists(), "nothing may start"


def test_replicate_refuses_a_key_written_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "replicate.yaml"
    path.write_text("max_workers: 2\ncatalogs: [{name: prod, target_catalog: dr}]\nmax_workers: 3\n")
    code, out = lakemirror(capsys, "replicate", str(path))
    assert code == 2, out
    assert "key 'max_workers' appears twice in one mapping (lines 1 and 3)" in out and "Traceback" not in out


@pytest.mark.parametrize("command", ["validate", "run"])
def test_credentials_in_a_bad_value_are_not_echoed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    command: str) -> None:
    path = _write(tmp_path, {"schema_name": "sales password=hunter2.", "tables": ["s3a://AKIA:secret@bucket/t"]})
    code, out = lakemirror(capsys, command, str(path))
    assert code == 2, out
    assert "schema_name" in out and "tables" in out
    assert "hunter2" not in out and "secret@" not in out, out
