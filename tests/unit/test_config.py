"""lakemirror.daemon.settings (load_settings) and the `lakemirror validate` command."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from lakemirror.daemon.cli import main
from lakemirror.daemon.settings import load_settings, parse_set_flags
from lakemirror.errors import ConfigError

BASE: dict[str, Any] = {
    "source_catalog": "src",
    "destination_catalog": "dst",
    "schema_name": "sales",
    "checkpoint_volume": "/tmp/ckpt",
    "tables": ["orders", "customers"],
    "table_overrides": {"orders": {"keys": ["order_id"], "exclude_columns": ["secret"]}},
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("LAKEMIRROR_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, changes: dict[str, Any] | None = None, drop: tuple[str, ...] = ()) -> Path:
    data = {**BASE, **(changes or {})}
    for key in drop:
        del data[key]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def problems(path: Path, overrides: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_settings(path, overrides)
    return info.value.problems


def test_valid_file(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path))
    assert (s.source_catalog, s.destination_catalog, s.schema_name) == ("src", "dst", "sales")
    assert s.tables == ["orders", "customers"]
    assert s.table_overrides["orders"].keys == ["order_id"]
    assert s.table_overrides["orders"].exclude_columns == ["secret"]
    assert s.trigger_interval_seconds == 5.0
    assert (s.runtime.mode, s.runtime.master) == ("local", "local[2]")
    assert s.effective_pipeline_id == "src.sales-to-dst"
    assert s.effective_checkpoint_table == "dst.continuous_sync.checkpoints"


@pytest.mark.parametrize("changes, drop, where, message", [
    ({"trigger_interval_seconds": "soon"}, (), "trigger_interval_seconds", "Input should be a valid number"),
    ({"trigger_interval_seconds": -1}, (), "trigger_interval_seconds", "greater than or equal to 0.001"),
    ({"trigger_interval_secs": 5}, (), "trigger_interval_secs", "unknown setting (check the spelling"),
    ({"runtime": {"mastr": "local[1]"}}, (), "runtime.mastr", "unknown setting"),
    ({}, ("schema_name",), "schema_name", "required setting is missing"),
    ({"schema_name": "sales.eu"}, (), "schema_name", "schema_name 'sales.eu' may not contain '.', '/'"),
    ({"source_catalog": "a/b"}, (), "source_catalog", "source_catalog 'a/b' may not contain '.', '/'"),
    ({"tables": ["orders", "x.y"]}, (), "tables", "table name 'x.y' may not contain"),
    ({"tables": ["orders", "orders"]}, (), "tables", "table names repeat"),
    ({"table_overrides": {"orders": {"include_columns": ["a"], "exclude_columns": ["b"]}}}, (),
     "table_overrides.orders", "give include_columns or exclude_columns, not both"),
    ({"table_overrides": {"invoices": {"keys": ["id"]}}}, (), "(top level)",
     "table_overrides names tables not in `tables`: ['invoices']"),
    ({"runtime": {"mode": "connect"}}, (), "runtime", "runtime.mode connect needs runtime.spark_remote"),
    ({"runtime": {"mode": "cluster"}}, (), "runtime.mode", "Input should be 'local', 'connect' or 'databricks'"),
    ({"http": {"port": 70000}}, (), "http.port", "less than or equal to 65535"),
    ({"pipeline_id": "-bad"}, (), "pipeline_id", "pipeline_id must be 1-64 characters"),
    ({"replica_properties": {"lakemirror.epoch": "9"}}, (), "replica_properties",
     "'lakemirror.epoch' is not a Delta table property; only 'delta.*' properties may be set"),
])
def test_invalid_settings_report_location_and_message(tmp_path: Path, changes: dict[str, Any],
                                                      drop: tuple[str, ...], where: str, message: str) -> None:
    path = write(tmp_path, changes, drop)
    found = problems(path)
    assert len(found) == 1, found
    loc, msg = found[0]
    assert loc == f"{path}: {where}"
    assert message in msg


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    found = problems(write(tmp_path, {"trigger_interval_seconds": 0, "bogus": 1}, drop=("source_catalog",)))
    assert sorted(loc.split(": ", 1)[1] for loc, _ in found) == ["bogus", "source_catalog", "trigger_interval_seconds"]


def test_connect_mode_with_a_remote_is_valid(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, {"runtime": {"mode": "connect", "spark_remote": "sc://spark:15002"}}))
    assert (s.runtime.mode, s.runtime.spark_remote) == ("connect", "sc://spark:15002")


@pytest.mark.parametrize("mode, configured, effective", [
    ("local", None, 1), ("databricks", None, max(1, (os.cpu_count() or 1) // 2)), ("connect", None, 1),
    ("connect", 2, 2), ("connect", 0, 0), ("local", 0, 0)])
def test_apply_workers_default_to_turns(tmp_path: Path, mode: str, configured: int | None,
                                                            effective: int) -> None:
    """Turns everywhere by default; over Connect the batch functions wait at a gate of files."""
    from lakemirror.daemon.settings.runtime_spec import pipeline_spec

    runtime = {"mode": mode, **({"spark_remote": "sc://spark:15002"} if mode == "connect" else {})}
    s = load_settings(write(tmp_path, {"runtime": runtime, **({} if configured is None else {"apply_workers": configured})}))
    assert (s.apply_workers, s.effective_apply_workers, pipeline_spec(s).apply_workers) == (configured, effective, effective)


@pytest.mark.parametrize("master, machine, cores, workers", [
    ("local[2]", 64, 2, 1), ("local[8]", 2, 8, 4), ("local[3]", 64, 3, 1), ("local", 16, 1, 1),
    ("local[*]", 16, 16, 8), ("local[6,3]", 1, 6, 3), ("spark://h:7077", 4, 4, 2)])
def test_apply_workers_default_from_the_drivers_cores(master: str, machine: int, cores: int, workers: int) -> None:
    """One turn for every two of the driver's cores: a warm Spark MERGE keeps about two busy."""
    from lakemirror.daemon.settings.pipeline import default_apply_workers, driver_cores

    assert driver_cores(master, machine) == cores
    assert default_apply_workers("local", cores) == workers
    assert default_apply_workers("connect", cores) == 1


def test_a_local_masters_threads_set_the_default_apply_workers(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, {"runtime": {"master": "local[8]"}}))
    assert s.effective_apply_workers == 4


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEMIRROR_TRIGGER_INTERVAL_SECONDS", "7.5")
    monkeypatch.setenv("LAKEMIRROR_RUNTIME__MASTER", "local[8]")
    s = load_settings(write(tmp_path, {"trigger_interval_seconds": 3, "runtime": {"master": "local[3]",
                                                                                   "warehouse": "/wh"}}))
    assert s.trigger_interval_seconds == 7.5
    assert s.runtime.master == "local[8]"
    assert s.runtime.warehouse == "/wh"  # nested settings merge; the file's other fields stay


def test_explicit_overrides_win_over_environment_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEMIRROR_TRIGGER_INTERVAL_SECONDS", "7.5")
    monkeypatch.setenv("LAKEMIRROR_RUNTIME__MASTER", "local[8]")
    path = write(tmp_path, {"trigger_interval_seconds": 3, "runtime": {"master": "local[3]"}})
    s = load_settings(path, {"trigger_interval_seconds": 9, "runtime": {"master": "local[9]"}})
    assert (s.trigger_interval_seconds, s.runtime.master) == (9.0, "local[9]")


def test_unrelated_lakemirror_env_vars_are_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEMIRROR_JARS_DIR", "/opt/jars")
    assert load_settings(write(tmp_path)).schema_name == "sales"


def test_invalid_environment_value_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEMIRROR_TRIGGER_INTERVAL_SECONDS", "soon")
    (loc, _), = problems(write(tmp_path))
    assert "LAKEMIRROR_TRIGGER_INTERVAL_SECONDS" in loc


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("source_catalog: a\n  bad: [\n", encoding="utf-8")
    assert problems(path) == [(f"{path}:2:6", "not valid YAML: mapping values are not allowed here")]


def test_top_level_must_be_a_mapping_and_file_must_exist(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n", encoding="utf-8")
    assert problems(path) == [(str(path), "the top level must be a mapping of settings")]
    assert problems(tmp_path / "missing.yaml") == [(str(tmp_path / "missing.yaml"), "file not found")]


def test_parse_set_flags() -> None:
    assert parse_set_flags(["runtime.master=local[4]", "trigger_interval_seconds=2", "http.port=0"]) == {
        "runtime": {"master": "local[4]"}, "trigger_interval_seconds": 2, "http": {"port": 0}}
    with pytest.raises(ConfigError):
        parse_set_flags(["novalue"])


# -- the CLI ------------------------------------------------------------------------------------

def test_validate_invalid_file_exits_2_listing_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {"trigger_interval_seconds": -1, "bogus": True})
    assert main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == "invalid configuration (2 problems):"
    assert f"  {path}: bogus: unknown setting (check the spelling; see docs/configuration.md)" in lines
    assert f"  {path}: trigger_interval_seconds: Input should be greater than or equal to 0.001" in lines
    assert "Traceback" not in err


def test_validate_yaml_error_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("a: [\n", encoding="utf-8")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("invalid configuration (1 problem):\n")
    assert "Traceback" not in err


def test_validate_valid_file_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path)
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == (f"{path}: valid. Pipeline src.sales-to-dst: src.sales -> dst.sales (orders, customers).\n")
    assert err == ""


def test_validate_applies_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path)
    assert main(["validate", str(path), "--set", "trigger_interval_seconds=-3"]) == 2
    assert "trigger_interval_seconds: Input should be greater than or equal to 0.001" in capsys.readouterr().err


def test_replica_properties_reach_the_pipeline_spec(tmp_path: Path) -> None:
    from lakemirror.daemon.settings.runtime_spec import pipeline_spec

    maintenance = load_settings(write(tmp_path)).replica_maintenance.properties()  # test_replica_maintenance.py
    settings = load_settings(write(tmp_path, {"replica_properties": {"delta.enableDeletionVectors": "true"}}))
    assert pipeline_spec(settings).replica_properties == {**maintenance, "delta.enableDeletionVectors": "true"}
    assert pipeline_spec(load_settings(write(tmp_path))).replica_properties == maintenance
