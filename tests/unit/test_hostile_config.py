"""Hostile or careless configuration, through the command line's own entry point: every case exits 2
before anything starts, names the file, variable or field, prints no traceback, and never echoes a
file that is not a configuration (tests/unit/test_bad_config_cli.py has the ordinary mistakes)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from lakemirror.daemon.cli import main
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.settings.config_file import MAX_CONFIG_BYTES
from lakemirror.errors import ConfigError

BASE = "source_catalog: src\ndestination_catalog: dst\nschema_name: sales\ncheckpoint_volume: {ck}\n" \
       "runtime: {{warehouse: {wh}}}\n"


@pytest.fixture(autouse=True)
def bounded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No LAKEMIRROR_* variable of the caller's; a `run` that wrongly gets past its configuration
    fails instead of running the daemon."""
    for name in list(os.environ):
        if name.upper().startswith("LAKEMIRROR_"):
            monkeypatch.delenv(name)

    def expired(signum: int, frame: Any) -> None:
        raise AssertionError("the command did not return within 60 s: it started instead of refusing")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def base(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(BASE.format(ck=tmp_path / "ck", wh=tmp_path / "wh") + extra)
    return path


def refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, config: Path | str) -> str:
    code = main([command, str(config)])
    printed = capsys.readouterr()
    out = printed.out + printed.err
    assert code == 2, out
    assert "Traceback" not in out and "Error:" not in out.split("invalid configuration", 1)[0], out
    assert not (tmp_path / "ck").exists(), "nothing may start"
    return out


# -- the file itself -------------------------------------------------------------------------------

def _directory(tmp_path: Path) -> Path:
    (tmp_path / "conf.d").mkdir()
    return tmp_path / "conf.d"


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "pipe")  # opened without blocking: nobody writes to it
    return tmp_path / "pipe"


def _not_utf8(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(BASE.format(ck=tmp_path / "ck", wh=tmp_path / "wh").encode() + b"# caf\xe9\n")
    return path


def _deep(tmp_path: Path) -> Path:
    return base(tmp_path, "table_overrides: " + "{a: " * 500 + "{}" + "}" * 500 + "\n")


def _deep_list(tmp_path: Path) -> Path:
    return base(tmp_path, "tables: " + "[" * 100_000 + "]" * 100_000 + "\n")


def _huge(tmp_path: Path) -> Path:
    return base(tmp_path, f"schema_name: {'s' * (MAX_CONFIG_BYTES + 10)}\n")


FILES: list[tuple[str, Callable[[Path], Path | str], str]] = [
    ("a directory", _directory, "is a directory, not a file"),
    ("a FIFO", _fifo, "is a FIFO (named pipe), not a file"),
    ("a device", lambda _: "/dev/urandom", "is a character device, not a file"),
    ("missing", lambda p: p / "nothing.yaml", "file not found"),
    ("not UTF-8", _not_utf8, "latin1.yaml:6: is not UTF-8 text"),
    ("500 levels of mappings", _deep, "nest deeper than 32 levels"),
    ("100,000 levels of lists", _deep_list, "nest deeper than 32 levels"),
    ("over 1 MiB", _huge, "is larger than 1 MiB"),
]


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("what, make, message", FILES, ids=[f[0] for f in FILES])
def test_a_path_or_content_that_is_no_configuration_exits_2_saying_what_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, what: str,
        make: Callable[[Path], Path | str], message: str) -> None:
    config = make(tmp_path)
    out = refused(capsys, tmp_path, command, config)
    assert f"{config}" in out and message in out, out


SECRETS = "root: x:0:0:root:/root:/bin/bash\nsvc_password_hunter2: x\ndb: postgresql://admin:hunter2@db/app\n"


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_foreign_file_is_not_echoed(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """A path mistyped into another file (here a symbolic link to one) is refused as not a
    configuration, quoting a dozen characters of its first key and none of its lines."""
    foreign = tmp_path / "secrets.txt"
    foreign.write_text(SECRETS + "".join(f"user{i}: x:{i}:{i}::/home/user{i}:/bin/sh\n" for i in range(200)))
    (tmp_path / "pipeline.yaml").symlink_to(foreign)
    out = refused(capsys, tmp_path, command, tmp_path / "pipeline.yaml")
    assert "not a lakemirror configuration: none of its 203 top-level keys is a setting" in out, out
    assert "hunter2" not in out and "/bin/bash" not in out and "user7" not in out, out
    assert len(out) < 600, out


def test_a_configuration_with_many_unknown_keys_lists_thirty(tmp_path: Path) -> None:
    path = base(tmp_path, "".join(f"setting_{i}: 1\n" for i in range(100)))
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert len(err.value.problems) == 31 and err.value.problems[-1] == ("…", "and 70 more problems")


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_40000_character_name_is_refused_with_its_length_not_its_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Once 35 s of quadratic redaction and a 40 KB message; now the bound, at once."""
    path = base(tmp_path, f"schema_name: {'s' * 40_000}\ntables: [{'t' * 300}]\n"
                          f"table_overrides: {{{'t' * 300}: {{keys: [{'k' * 300}]}}}}\n")
    path.write_text(path.read_text().replace("schema_name: sales\n", "", 1))
    out = refused(capsys, tmp_path, command, path)
    assert "schema_name is 40000 characters long; a name has at most 255" in out, out
    assert "table name is 300 characters long" in out and "a column name is 300 characters long" in out, out
    assert len(out) < 3000, len(out)


# -- environment variables ---------------------------------------------------------------------------

ENVIRONMENT = [
    ({"LAKEMIRROR_HTTP": "not json"}, "environment variable LAKEMIRROR_HTTP: not valid JSON",
     "a block of settings is a JSON object"),
    ({"LAKEMIRROR_TABLE_OVERRIDES__ORDERS__KEYS": "id"},
     "environment variable LAKEMIRROR_TABLE_OVERRIDES__ORDERS__KEYS: not valid JSON", "a list is a JSON array"),
    ({"LAKEMIRROR_TABLES": "orders"}, "environment variable LAKEMIRROR_TABLES", "Input should be a valid list"),
    ({"LAKEMIRROR_RUNTIME__SPARK_CONF": "{bad"}, "environment variable LAKEMIRROR_RUNTIME__SPARK_CONF", "mapping"),
    ({"LAKEMIRROR_HTTP": '{"port": 1, "port": 2}'}, "environment variable LAKEMIRROR_HTTP",
     "the key 'port' appears twice in one JSON object"),
    ({"LAKEMIRROR_RUNTIME__SPARK_CONF__spark.driver.maxResultSize": "1x"},
     "environment variable LAKEMIRROR_RUNTIME__SPARK_CONF__spark.driver.maxResultSize",
     "spark.driver.maxResultSize '1x' is not a size"),
]


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("env, where, message", ENVIRONMENT, ids=[e[1][21:60] for e in ENVIRONMENT])
def test_a_bad_environment_value_exits_2_naming_the_variable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str,
        env: dict[str, str], where: str, message: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = refused(capsys, tmp_path, command, base(tmp_path))
    assert where in out and message in out, out


def test_environment_names_match_in_any_case_and_mapping_keys_keep_theirs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEMIRROR_RUNTIME__SPARK_CONF__spark.driver.maxResultSize", "1g")
    monkeypatch.setenv("lakemirror_runtime__Spark_Conf__spark.sql.adaptive.coalescePartitions.enabled", "true")
    monkeypatch.setenv("LAKEMIRROR_REPLICA_PROPERTIES__delta.enableDeletionVectors", "true")
    monkeypatch.setenv("LAKEMIRROR_TABLE_OVERRIDES__Orders__KEYS", '["Id"]')
    monkeypatch.setenv("Lakemirror_Http__Port", "0")
    s = load_settings(base(tmp_path))
    assert s.runtime.spark_conf == {"spark.driver.maxResultSize": "1g",
                                    "spark.sql.adaptive.coalescePartitions.enabled": "true"}
    assert s.replica_properties == {"delta.enableDeletionVectors": "true"}
    assert list(s.table_overrides) == ["Orders"] and s.table_overrides["Orders"].keys == ["Id"]
    assert s.http.port == 0


def test_a_pipeline_validated_from_data_reads_no_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings.model_validate (a pipeline posted to the API) is what it is given: the daemon's own
    variables configure the daemon's file only."""
    from lakemirror.daemon.settings import Settings

    monkeypatch.setenv("LAKEMIRROR_TABLES", '["secret_table"]')
    monkeypatch.setenv("LAKEMIRROR_HTTP__AUTH_TOKEN", "daemon-token")
    s = Settings.model_validate({"source_catalog": "a", "destination_catalog": "b", "schema_name": "c",
                                 "checkpoint_volume": str(tmp_path)})
    assert s.tables is None and s.http.auth_token is None


# -- values --------------------------------------------------------------------------------------------

VALUES = [
    ("drain timeout 1e10", "drain_timeout_seconds: 1e10\n", "drain_timeout_seconds", "less than or equal to 86400"),
    ("~nosuchuser", "checkpoint_volume: ~nosuchuser-46/x\n", "checkpoint_volume",
     "this machine has no user 'nosuchuser-46'"),
    ("empty checkpoint folder", "checkpoint_volume: ''\n", "checkpoint_volume", "cannot be empty"),
    ("root checkpoint folder", "checkpoint_volume: /\n", "checkpoint_volume", "is the file system's root"),
    ("root warehouse", "runtime: {warehouse: /}\n", "runtime.warehouse", "is the file system's root"),
    ("~nosuchuser warehouse", "runtime: {warehouse: '~nosuchuser-46'}\n", "runtime.warehouse", "has no user"),
    ("a year-long backoff", "restart: {max_delay_seconds: 1e300}\n", "restart.max_delay_seconds", "less than"),
    ("a token with a space", "http: {auth_token: 'two words'}\n", "http.auth_token", "printable ASCII"),
    ("an empty token", "http: {auth_token: '  '}\n", "http.auth_token", "auth_token is empty"),
    ("a 20,000-character property", f"replica_properties: {{delta.x: {'v' * 20_000}}}\n", "replica_properties",
     "a value at most 16384"),
]


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("what, extra, field, message", VALUES, ids=[v[0] for v in VALUES])
def test_a_value_that_would_fail_later_exits_2_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, what: str, extra: str, field: str,
        message: str) -> None:
    path = base(tmp_path)
    text = path.read_text()
    key = extra.split(":", 1)[0]
    if key in ("checkpoint_volume", "runtime"):
        text = "\n".join(line for line in text.splitlines() if not line.startswith(key)) + "\n"
    path.write_text(text + extra)
    out = refused(capsys, tmp_path, command, path)
    assert f"{path}: {field}:" in out and message in out, out
    assert "two words" not in out


def test_a_token_written_as_a_yaml_block_is_read_without_its_line_break(tmp_path: Path) -> None:
    s = load_settings(base(tmp_path, "http:\n  auth_token: |\n    s3cr3t-token\n"))
    assert s.http.auth_token is not None and s.http.auth_token.get_secret_value() == "s3cr3t-token"


@pytest.mark.parametrize("where", ["table", "inside the table", "source schema", "replica schema"])
def test_a_checkpoint_folder_a_vacuum_or_a_table_could_reach_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    table = tmp_path / "wh" / "src" / "sales" / "orders"
    (table / "_delta_log").mkdir(parents=True)
    folder = {"table": table, "inside the table": table / "ck", "source schema": tmp_path / "wh" / "src" / "sales",
              "replica schema": tmp_path / "wh" / "dst" / "sales" / "ck"}[where]
    path = base(tmp_path)
    path.write_text(path.read_text().replace(str(tmp_path / "ck"), str(folder)))
    out = refused(capsys, tmp_path, "validate", path)
    assert f"{path}: checkpoint_volume:" in out, out
    assert ("inside the Delta table at" if "table" in where else "the folder of the tables of") in out, out


def test_a_drain_that_fails_still_removes_the_endpoint_file(tmp_path: Path) -> None:
    """The daemon's endpoint file is removed even when a step of the drain raises (a drain timeout
    too large for a wait once did, and left daemon.json pointing at a dead daemon)."""
    import threading

    from prometheus_client import CollectorRegistry

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.metrics import Metrics

    settings = load_settings(base(tmp_path, "tables: []\nhttp: {port: 0}\n"))
    app = DaemonContext(settings).replace(metrics=Metrics("p", CollectorRegistry()), mode_check=lambda rt: None,
                                          spark=object(), checkpoints=object())

    def broken_drain(timeout: float) -> None:
        raise OverflowError("timeout value is too large")

    app.pipelines.shutdown_all = broken_drain  # type: ignore[method-assign]
    stop = threading.Event()
    stop.set()
    with pytest.raises(OverflowError):
        app.run(stop)
    assert not (app.pipeline_dir / "daemon.json").exists()
