"""Configuration that used to be accepted and then failed (or silently misbehaved) at run time:
repeated YAML keys, values Spark or Delta parse later, misspelled environment variables, and
credentials echoed by validation messages."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from lakemirror.daemon import spark_values, yaml_loader
from lakemirror.daemon.api import settings_from_body
from lakemirror.daemon.cli import main
from lakemirror.daemon.settings import load_settings, warn_unknown_environment
from lakemirror.daemon.settings.replicate import load_replicate_config
from lakemirror.errors import ConfigError

PIPELINE = """\
source_catalog: src
destination_catalog: dst
schema_name: sales
checkpoint_volume: {ckpt}
runtime:
  warehouse: {wh}
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("LAKEMIRROR_"):
            monkeypatch.delenv(name)


def pipeline(tmp_path: Path, extra: str | dict[str, Any] = "") -> Path:
    """The base file plus ``extra``: text appended as is, or settings merged in (``runtime`` too)."""
    path = tmp_path / "pipeline.yaml"
    base = PIPELINE.format(ckpt=tmp_path / "ck", wh=tmp_path / "wh")
    if isinstance(extra, dict):
        data = yaml.safe_load(base)
        data["runtime"].update(extra.get("runtime", {}))
        data.update({k: v for k, v in extra.items() if k != "runtime"})
        path.write_text(yaml.safe_dump(data))
    else:
        path.write_text(base + textwrap.dedent(extra))
    return path


def problems_of(path: Path) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    return info.value.problems


# -- a key written twice ---------------------------------------------------------------------

@pytest.mark.parametrize("extra, key, lines", [
    ("schema_name: other\n", "schema_name", (3, 7)),
    ("runtime:\n  master: local[1]\n", "runtime", (5, 7)),
    ("http:\n  port: 1\n  port: 2\n", "port", (8, 9)),
    ("runtime_: x\n".replace("runtime_: x\n", "table_overrides:\n  orders:\n    keys: [a]\n    keys: [b]\n"),
     "keys", (9, 10)),
    ("schedules:\n  - name: a\n    every_seconds: 5\n    operations: [reconcile]\n    every_seconds: 6\n",
     "every_seconds", (9, 11)),
], ids=["top level", "a whole block", "nested", "under a mapping of tables", "inside a list entry"])
def test_a_key_written_twice_is_refused_with_both_lines(tmp_path: Path, extra: str, key: str,
                                                        lines: tuple[int, int]) -> None:
    path = pipeline(tmp_path, extra)
    [(where, msg)] = problems_of(path)
    assert where.startswith(f"{path}:{lines[1]}:")
    assert f"key {key!r} appears twice" in msg and f"lines {lines[0]} and {lines[1]}" in msg


def test_anchors_and_merge_keys_are_not_repeats() -> None:
    text = "base: &b {a: 1, b: 2}\nmine:\n  <<: *b\n  b: 3\n"
    assert yaml_loader.load(text)["mine"] == {"a": 1, "b": 3}


def test_a_set_flag_with_a_repeated_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(pipeline(tmp_path)), "--set", "http={port: 1, port: 2}"]) == 2
    assert "key 'port' appears twice" in capsys.readouterr().err


def test_the_replicate_file_refuses_a_key_written_twice(tmp_path: Path) -> None:
    path = tmp_path / "replicate.yaml"
    path.write_text("catalogs:\n  - name: prod\n    target_catalog: dr\n    schemas:\n"
                    "      - name: sales\n        name: finance\n")
    with pytest.raises(ConfigError) as info:
        load_replicate_config(path)
    [(where, msg)] = info.value.problems
    assert where.startswith(f"{path}:6:") and "key 'name' appears twice" in msg and "lines 5 and 6" in msg


# -- values Spark, the JVM or Delta parse later ---------------------------------------------------

BAD_VALUES = [
    ({"max_bytes_per_trigger": "abc"}, "max_bytes_per_trigger", "is not a size"),
    ({"max_bytes_per_trigger": -5}, "max_bytes_per_trigger", "is not a size"),
    ({"max_bytes_per_trigger": 0}, "max_bytes_per_trigger", "larger than 0"),
    ({"max_bytes_per_trigger": "1.5g"}, "max_bytes_per_trigger", "is not a size"),
    ({"max_bytes_per_trigger": "99999999p"}, "max_bytes_per_trigger", "too large"),
    ({"max_files_per_trigger": 0}, "max_files_per_trigger", "greater than 0"),
    ({"max_files_per_trigger": 2**31}, "max_files_per_trigger", "less than or equal to 2147483647"),
    ({"trigger_interval_seconds": 0.00001}, "trigger_interval_seconds", "greater than or equal to 0.001"),
    ({"lag_interval_seconds": float("inf")}, "lag_interval_seconds", "finite number"),
    ({"drain_timeout_seconds": float("nan")}, "drain_timeout_seconds", "finite number"),
    ({"runtime": {"driver_memory": "2048"}}, "runtime.driver_memory", "is not a heap size"),
    ({"runtime": {"driver_memory": "2gb"}}, "runtime.driver_memory", "is not a heap size"),
    ({"runtime": {"driver_memory": "100m"}}, "runtime.driver_memory", "too small"),
    ({"runtime": {"master": "lokal[2]"}}, "runtime.master", "is not a Spark master URL"),
    ({"runtime": {"master": "local[0]"}}, "runtime.master", "runs no threads"),
    ({"runtime": {"mode": "connect", "spark_remote": "sc://spark:15o02"}}, "runtime", "the port is not a number"),
    ({"runtime": {"shuffle_partitions": 2**31}}, "runtime.shuffle_partitions", "less than or equal"),
    ({"runtime": {"spark_conf": {"spark.sql.shuffle.partitions": "many"}}}, "runtime.spark_conf",
     "must be a whole number from 1"),
    ({"runtime": {"spark_conf": {"spark.sql.streaming.stopTimeout": "two minutes"}}}, "runtime.spark_conf",
     "is not a duration"),
    ({"runtime": {"spark_conf": {"spark.executor.memory": "4 GB"}}}, "runtime.spark_conf", "is not a heap size"),
    ({"runtime": {"spark_conf": {"spark.scheduler.mode": "fastest"}}}, "runtime.spark_conf", "FAIR, FIFO"),
    ({"runtime": {"spark_conf": {"spark.hadoop.delta.enableFastS3AListFrom": "true"}}}, "runtime.spark_conf",
     "hadoop-aws 3.5"),
    ({"replica_properties": {"delta.enableDeletionVectors": "maybe"}}, "replica_properties", "true or false"),
    ({"replica_properties": {"delta.logRetentionDuration": "interval 3 months"}}, "replica_properties",
     "is not an interval"),
    ({"replica_properties": {"delta.checkpointInterval": "0"}}, "replica_properties", "whole number from 1"),
    ({"replica_properties": {"delta.targetFileSize": "big"}}, "replica_properties", "is not a size"),
    ({"replica_properties": {"delta.columnMapping.mode": "names"}}, "replica_properties", "none, name, id"),
    ({"replica_properties": {"delta.enableDeletionVector": "true"}}, "replica_properties",
     "did you mean 'delta.enableDeletionVectors'"),
    ({"replica_properties": {"delta.feature.deletionVectors": "on"}}, "replica_properties",
     "supported, enabled"),
    ({"schedules": [{"name": "a", "operations": ["reconcile"], "every_seconds": float("inf")}]},
     "schedules[0].every_seconds", "finite number"),
    ({"schedules": [{"name": "a", "operations": ["reconcile"], "daily_at": 150}]},
     "schedules[0].daily_at", 'quoted, e.g. daily_at: "02:30"'),
    ({"destination": {"kind": "postgres", "host": "h", "database": "d", "user": "u", "mode": "triggered",
                      "daily_at": 150}},
     "destination.postgres.daily_at", 'quoted, e.g. daily_at: "02:30"'),
    ({"schedules": [{"name": "a", "operations": ["reconcile"], "every_seconds": 5,
                     "reconcile": {"buckets": 16}, "timeout_seconds": float("inf")}]},
     "schedules[0].timeout_seconds", "finite number"),
]


@pytest.mark.parametrize("changes, where, message", BAD_VALUES, ids=[f"{c[1]}={list(c[0].values())[0]}"[:60]
                                                                      for c in BAD_VALUES])
def test_values_spark_or_delta_would_refuse_are_refused_at_load(tmp_path: Path, changes: dict[str, Any],
                                                               where: str, message: str) -> None:
    path = pipeline(tmp_path, changes)
    found = problems_of(path)
    assert [loc for loc, _ in found] == [f"{path}: {where}"], found
    assert message in found[0][1], found


def test_good_values_are_normalised_to_what_spark_and_delta_read(tmp_path: Path) -> None:
    path = pipeline(tmp_path, {
        "max_bytes_per_trigger": "512M", "max_files_per_trigger": 100, "trigger_interval_seconds": 0.001,
        "runtime": {"driver_memory": "1G", "master": "local[*]",
                    "spark_conf": {"spark.sql.shuffle.partitions": 8, "spark.ui.enabled": False,
                                   "spark.hadoop.fs.s3a.endpoint": "http://minio:9000"}},
        "replica_properties": {"delta.enableDeletionVectors": True, "delta.logRetentionDuration": "interval 7 days",
                               "delta.feature.rowTracking": "supported", "delta.someFutureProperty": "x"}})
    s = load_settings(path)
    assert s.max_bytes_per_trigger == "512m"
    assert s.runtime.driver_memory == "1g"
    assert s.runtime.spark_conf == {"spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false",
                                    "spark.hadoop.fs.s3a.endpoint": "http://minio:9000"}
    assert s.replica_properties["delta.enableDeletionVectors"] == "true"
    assert load_settings(pipeline(tmp_path, "max_bytes_per_trigger: 1048576\n")).max_bytes_per_trigger == "1048576"


def test_the_replicate_runtime_is_checked_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "replicate.yaml"
    path.write_text("catalogs: [{name: prod, target_catalog: dr}]\nruntime: {driver_memory: lots}\n")
    with pytest.raises(ConfigError) as info:
        load_replicate_config(path)
    assert info.value.problems[0][0] == f"{path}: runtime.driver_memory"


def test_byte_sizes_match_spark_units() -> None:
    assert spark_values.byte_size("1k", "x") == ("1k", 1024)
    assert spark_values.byte_size("2GB", "x") == ("2gb", 2 * 2**30)
    assert spark_values.byte_size(7, "x") == ("7", 7)
    with pytest.raises(ValueError):
        spark_values.byte_size(True, "x")


# -- environment variables with our prefix that set nothing -------------------------------------------

def test_a_misspelled_variable_is_warned_about_with_the_closest_name(tmp_path: Path) -> None:
    env = {"LAKEMIRROR_TRIGGER_INTERVALSECONDS": "60", "LAKEMIRROR_RUNTIME__MASTR": "local[1]",
           "LAKEMIRROR_HTTP__AUTHTOKEN": "t", "LAKEMIRROR_SOMETHING": "1",
           # valid: a field, a nested field, a key of a mapping field, and variables read elsewhere
           "LAKEMIRROR_TRIGGER_INTERVAL_SECONDS": "5", "LAKEMIRROR_RUNTIME__MASTER": "local[1]",
           "lakemirror_http__port": "0", "LAKEMIRROR_TABLE_OVERRIDES__orders__KEYS": "[\"id\"]",
           "LAKEMIRROR_RUNTIME__SPARK_CONF__spark.ui.enabled": "false",
           "LAKEMIRROR_JARS_DIR": "/opt/jars", "LAKEMIRROR_TEST_KILL_AT": "", "HOME": "/root"}
    warnings = warn_unknown_environment(env)
    assert warnings == [
        "environment variable LAKEMIRROR_HTTP__AUTHTOKEN is not a lakemirror setting and is ignored; "
        "did you mean LAKEMIRROR_HTTP__AUTH_TOKEN?",
        "environment variable LAKEMIRROR_RUNTIME__MASTR is not a lakemirror setting and is ignored; "
        "did you mean LAKEMIRROR_RUNTIME__MASTER?",
        "environment variable LAKEMIRROR_SOMETHING is not a lakemirror setting and is ignored; "
        "see docs/configuration.md",
        "environment variable LAKEMIRROR_TRIGGER_INTERVALSECONDS is not a lakemirror setting and is ignored; "
        "did you mean LAKEMIRROR_TRIGGER_INTERVAL_SECONDS?"]


def test_loading_the_settings_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("LAKEMIRROR_TRIGGER_INTERVALSECONDS", "60")
    assert load_settings(pipeline(tmp_path)).trigger_interval_seconds == 5.0
    assert "LAKEMIRROR_TRIGGER_INTERVALSECONDS is not a lakemirror setting" in caplog.text


# -- credentials never echoed by a validation message ----------------------------------------------------

LEAKY = [
    ("schema_name", "sales password=hunter2."),
    ("tables", ["s3a://AKIA:secret@bucket/t"]),
    ("runtime", {"master": "lokal password=hunter2"}),
    ("max_bytes_per_trigger", "s3a://AKIA:secret@bucket"),
    ("table_overrides", {"orders": {"keys": ["a"], "password=hunter2": 1}}),
]


@pytest.mark.parametrize("key, value", LEAKY, ids=[k for k, _ in LEAKY])
def test_validation_messages_are_redacted(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str,
                                          value: Any) -> None:
    path = pipeline(tmp_path, {key: value})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "invalid configuration" in err
    assert "hunter2" not in err and "secret@" not in err, err


def test_replicate_validation_messages_are_redacted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "replicate.yaml"
    path.write_text("catalogs: [{name: 'prod password=hunter2/', target_catalog: 's3a://AKIA:secret@bucket'}]\n")
    assert main(["replicate", str(path), "--validate-only"]) == 2
    err = capsys.readouterr().err
    assert "catalog name" in err and "hunter2" not in err and "secret@" not in err, err


def test_api_validation_messages_are_redacted() -> None:
    body = {"source_catalog": "src", "destination_catalog": "dst", "schema_name": "s password=hunter2.",
            "checkpoint_volume": "/tmp/x", "table_overrides": {"t": {"s3a://AKIA:secret@bucket": 1}}}
    problems = settings_from_body(body, "local")
    assert isinstance(problems, list) and len(problems) == 2
    assert "hunter2" not in repr(problems) and "secret@" not in repr(problems), problems


def test_every_kind_of_a_union_field_names_valid_variables() -> None:
    from typing import Literal, Union

    from pydantic import BaseModel

    from lakemirror.daemon.env_check import unknown_variables

    class Delta(BaseModel):
        kind: Literal["delta"] = "delta"

    class Postgres(BaseModel):
        kind: Literal["postgres"] = "postgres"
        host: str = ""

    class Top(BaseModel):
        destination: Union[Delta, Postgres] = Delta()

    env = {"X_DESTINATION__HOST": "db", "X_DESTINATION__HOTS": "db"}
    assert unknown_variables(env, Top, "X_") == [("X_DESTINATION__HOTS", "X_DESTINATION__HOST")]


# -- replicas that would be their own sources ------------------------------------------------------

@pytest.mark.parametrize("extra", [
    {"destination_catalog": "src"},
    {"destination_catalog": "SRC", "destination_schema": "Sales"},   # Unity Catalog names ignore case
    {"destination_catalog": "src", "destination_schema": "sales"},
], ids=["same catalog, schema by default", "same names in another case", "same schema named"])
def test_validate_refuses_replicas_that_would_overwrite_their_sources(tmp_path: Path, extra: dict[str, Any],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = pipeline(tmp_path, extra)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "the replicas would be the source tables themselves" in err
    assert "set destination_catalog or destination_schema to another one" in err
    assert "drop" not in err


@pytest.mark.parametrize("extra", [
    {"destination_catalog": "src", "destination_schema": "sales_replica"},
    {"destination_catalog": "src", "destination": {"kind": "postgres", "host": "db", "database": "d", "user": "u"}},
], ids=["same catalog, another schema", "a PostgreSQL destination"])
def test_validate_accepts_the_same_catalog_with_another_destination(tmp_path: Path, extra: dict[str, Any]) -> None:
    assert main(["validate", str(pipeline(tmp_path, extra))]) == 0
