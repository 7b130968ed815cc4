"""The ``lakemirror`` command as a process of its own: the exit codes and stderr a shell sees, what
the process's environment does, and what the process loads. The same checks of each bad value run
in-process in tests/unit/test_bad_config_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import write_deltalake

from lakemirror.checkpoints.delta_store import arrow_rows
from lakemirror.identifiers import TableName
from lakemirror.sources.catalog import LocalCatalog

pytestmark = pytest.mark.e2e

LAKEMIRROR = [sys.executable, "-m", "lakemirror.daemon.cli"]


def pipeline_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"source_catalog: src\ndestination_catalog: dst\nschema_name: sales\n"
                    f"checkpoint_volume: {tmp_path / 'ck'}\nruntime: {{warehouse: {tmp_path / 'wh'}}}\n{extra}")
    return path


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_bad_file_exits_2_naming_the_field_with_no_traceback(tmp_path: Path, command: str) -> None:
    path = pipeline_file(tmp_path, "trigger_interval_seconds: often\n")
    done = subprocess.run([*LAKEMIRROR, command, str(path)], capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert f"{path}: trigger_interval_seconds: Input should be a valid number" in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "ck").exists() and not (tmp_path / "wh").exists(), "nothing may start"


def test_replicate_exits_2_on_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "replicate.yaml"
    path.write_text("max_workers: 2\ncatalogs: [{name: prod, target_catalog: dr}]\nmax_workers: 3\n")
    done = subprocess.run([*LAKEMIRROR, "replicate", str(path)], capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "key 'max_workers' appears twice in one mapping (lines 1 and 3)" in out and "Traceback" not in out


def test_a_misspelled_environment_variable_is_named_on_stderr(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("LAKEMIRROR_")}
    env["LAKEMIRROR_TRIGGER_INTERVALSECONDS"] = "60"
    done = subprocess.run([*LAKEMIRROR, "validate", str(pipeline_file(tmp_path))],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert ("environment variable LAKEMIRROR_TRIGGER_INTERVALSECONDS is not a lakemirror setting and is ignored; "
            "did you mean LAKEMIRROR_TRIGGER_INTERVAL_SECONDS?") in done.stderr


@pytest.mark.parametrize("ran", [True, False], ids=["with a checkpoint table", "a pipeline that never ran"])
def test_status_without_a_daemon_starts_no_jvm(tmp_path: Path, ran: bool) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(f"source_catalog: src\ndestination_catalog: dst\nschema_name: s\ntables: [t]\n"
                      f"checkpoint_volume: {tmp_path / 'ck'}\nruntime: {{mode: local, warehouse: {tmp_path / 'lake'}}}\n")
    catalog = LocalCatalog(tmp_path / "lake")
    if ran:
        write_deltalake(str(catalog.locate(TableName.parse("dst.continuous_sync.checkpoints")).path), arrow_rows([]))
    # In a process of its own: the suite's shared Spark session may be running in this one.
    probe = ("import sys\nfrom lakemirror.daemon.cli import main\n"
             f"code = main(['status', {str(config)!r}, '--json'])\n"
             "from pyspark import SparkContext\n"
             "print('exit', code, 'jvm', SparkContext._active_spark_context is not None)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.strip().splitlines()[-1] == "exit 0 jvm False", done.stdout + done.stderr


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "pipe")
    return tmp_path / "pipe"


def _deep(tmp_path: Path) -> Path:
    path = pipeline_file(tmp_path)
    path.write_text(path.read_text() + "table_overrides: " + "{a: " * 500 + "{}" + "}" * 500 + "\n")
    return path


def _latin1(tmp_path: Path) -> Path:
    path = pipeline_file(tmp_path)
    path.write_bytes(path.read_bytes() + b"# caf\xe9\n")
    return path


HOSTILE = [
    ("a FIFO (a blocking open would hang)", _fifo, {}, "is a FIFO (named pipe), not a file"),
    ("500 levels of YAML", _deep, {}, "nest deeper than 32 levels"),
    ("not UTF-8", _latin1, {}, "is not UTF-8 text"),
    ("an environment value that is not JSON", pipeline_file, {"LAKEMIRROR_HTTP": "not json"},
     "environment variable LAKEMIRROR_HTTP: not valid JSON"),
]


@pytest.mark.parametrize("what, make, env, message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_exits_2_naming_it_with_no_traceback(tmp_path: Path, what: str, make: Any,
                                                           env: dict[str, str], message: str) -> None:
    config = make(tmp_path)
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("LAKEMIRROR_")}
    done = subprocess.run([*LAKEMIRROR, "run", str(config)], capture_output=True, text=True, timeout=120,
                          env={**environ, **env})
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert message in out and "Traceback" not in out, out
    assert not (tmp_path / "ck").exists(), "nothing may start"
