"""``destination: {kind: postgres}``: validated at start, bad values named; looked up by its kind."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.settings.destination import DeltaDestination
from lakemirror.errors import ConfigError

BASE: dict[str, Any] = {"source_catalog": "s", "destination_catalog": "d", "schema_name": "x",
                        "checkpoint_volume": "/tmp/lm-cfg-test"}
PG = {"kind": "postgres", "host": "db", "database": "app", "user": "lm"}


def settings(**destination: Any) -> Any:
    return load_settings(None, {**BASE, "destination": {**PG, **destination}})


def test_delta_is_the_default_and_has_no_cycles():
    s = load_settings(None, BASE)
    assert isinstance(s.destination, DeltaDestination)
    destination = DaemonContext(s).destination
    assert destination.kind == "delta" and destination.cycles is None and "Delta replicas" in destination.reason


def test_a_postgres_destination_becomes_one_target(monkeypatch):
    monkeypatch.setenv("LM_PG_PW", "s3cret")
    s = settings(schema="replicas", password_env="LM_PG_PW", max_connections=2, statement_timeout_seconds=1.5)
    target = s.destination.target()
    assert (target.host, target.port, target.schema, target.password, target.max_connections) == \
        ("db", 5432, "replicas", "s3cret", 2)
    assert "s3cret" not in repr(target)
    assert "statement_timeout=1500" in target.connect_kwargs()["options"]
    destination = DaemonContext(s).destination
    assert destination.kind == "postgres" and "db:5432/app" in destination.reason
    assert destination.cycles is None  # every table continuous: no cycles to run
    assert destination.replica_for("t", None).connector.target == target  # type: ignore[attr-defined]


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


def test_validate_exits_2_with_one_line_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from lakemirror.daemon.cli import main

    cfg = tmp_path / "p.yaml"
    cfg.write_text("source_catalog: s\ndestination_catalog: d\nschema_name: x\ncheckpoint_volume: /tmp/x\n"
                   "destination: {kind: postgres, host: db, database: app, user: lm, port: -1}\n")
    code = main(["validate", str(cfg)])
    printed = capsys.readouterr()
    assert code == 2, printed
    assert "destination.postgres.port" in printed.err + printed.out
    assert "Traceback" not in printed.err


def _event_yaml(tmp_path, source: str, destination: str):
    path = tmp_path / "p.yaml"
    path.write_text(
        "source_catalog: a\ndestination_catalog: b\nschema_name: s\ncheckpoint_volume: " + str(tmp_path) + "\n"
        "source: " + source + "\ndestination: " + destination + "\n")
    return path


def test_an_event_source_with_a_postgres_destination_is_accepted_in_both_modes(tmp_path) -> None:
    from lakemirror.daemon.settings import load_settings
    pg = "{kind: postgres, host: h, database: d, user: u}"
    s = load_settings(_event_yaml(tmp_path, "{kind: files, path: " + str(tmp_path) + "}", pg))
    assert s.source is not None and s.source.real_time is None and s.destination.kind == "postgres"
    s = load_settings(_event_yaml(tmp_path, "{kind: kafka, bootstrap_servers: 'k:9092', topics: [t], "
                                            "real_time: {max_dwell_ms: 50}}", pg))
    assert s.source is not None and s.source.real_time is not None and s.source.real_time.max_dwell_ms == 50
    assert s.source.real_time.checkpoint_interval_seconds == 1.0


def test_real_time_mode_is_refused_where_spark_cannot_run_it(tmp_path) -> None:
    from lakemirror.daemon.settings import load_settings
    from lakemirror.errors import ConfigError
    kafka = "{kind: kafka, bootstrap_servers: 'k:9092', topics: [t], real_time: {}}"
    for source, destination, why in (
            (kafka, "{kind: delta}", "source.real_time needs destination kind postgres"),
            ("{kind: files, path: " + str(tmp_path) + ", real_time: {}}",
             "{kind: postgres, host: h, database: d, user: u}", "real_time needs kind kafka")):
        try:
            load_settings(_event_yaml(tmp_path, source, destination))
        except ConfigError as exc:
            assert why in str(exc), str(exc)
        else:
            raise AssertionError(f"accepted real_time with {source} into {destination}")


def test_an_event_source_into_postgres_runs_the_postgres_runner_in_the_mode_configured(tmp_path) -> None:
    from prometheus_client import CollectorRegistry

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.metrics import Metrics
    from lakemirror.daemon.settings import load_settings
    from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas
    from lakemirror.sinks.postgres.real_time import RealTimeSpec
    from lakemirror.supervisor.events.stream_runner import EventStreamRunner

    pg = "{kind: postgres, host: h, database: d, user: u, schema: replicas}"
    for source, real_time in (
            ("{kind: kafka, bootstrap_servers: 'k:9092', topics: [t], real_time: {max_dwell_ms: 30, max_rows: 7}}",
             RealTimeSpec(1.0, 30, 7)),
            ("{kind: kafka, bootstrap_servers: 'k:9092', topics: [t]}", None)):
        settings = load_settings(_event_yaml(tmp_path, source, pg))
        ctx = DaemonContext(settings).replace(spark=object(),  # no Spark needed
                                              metrics=Metrics("main", CollectorRegistry()))
        runner = ctx.event_source_supervisor._factory("events:events")
        assert isinstance(runner, EventStreamRunner) and isinstance(runner.sink, PostgresEventReplicas)
        sink = runner.sink
        assert sink.real_time == real_time and sink.target.schema == "replicas" and sink.target.host == "h"
        assert (sink.executor_writes is not None) == (real_time is not None)


def test_a_real_time_daemon_shrinks_the_python_worker_buffer_unless_the_user_set_it(tmp_path) -> None:
    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.settings.real_time import BUFFER_CONF, REAL_TIME_BUFFER_BYTES

    pg = "{kind: postgres, host: h, database: d, user: u, schema: replicas}"
    kafka = "{kind: kafka, bootstrap_servers: 'k:9092', topics: [t]"
    rt = DaemonContext(load_settings(_event_yaml(tmp_path, kafka + ", real_time: {}}", pg))).runtime
    assert rt.spark_conf[BUFFER_CONF] == str(REAL_TIME_BUFFER_BYTES)
    micro = DaemonContext(load_settings(_event_yaml(tmp_path, kafka + "}", pg))).runtime
    assert BUFFER_CONF not in micro.spark_conf
    path = _event_yaml(tmp_path, kafka + ", real_time: {}}", pg)
    path.write_text(path.read_text() + "runtime: {spark_conf: {spark.buffer.size: '4096'}}\n")
    assert DaemonContext(load_settings(path)).runtime.spark_conf[BUFFER_CONF] == "4096"
