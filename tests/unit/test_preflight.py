"""Start-up: what a mode needs is checked before anything starts, a port in use is one line, and a
daemon that fails to start leaves no daemon.json (or folder) behind."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.daemon import preflight
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.metrics import Metrics
from lakemirror.supervisor.control.loop import Supervisor
from lakemirror.daemon.preflight import (CONNECT_REQUIREMENTS, StartupError, bind_failure, check_connect,
                                         missing_requirements, remote_address)

INSTALLED = {"pandas": "2.3.3", "pyarrow": "26.0.1", "grpcio": "1.76.0", "grpcio-status": "1.76.0",
             "googleapis-common-protos": "1.72.0", "zstandard": "0.25.0"}


def importer(missing: set[str]) -> Any:
    def import_module(name: str) -> object:
        if name in missing:
            raise ImportError(f"No module named {name!r}")
        return object()
    return import_module


def versions(**changes: str | None) -> Any:
    table = {**INSTALLED, **changes}
    return lambda dist: table.get(dist)


def test_connect_requirements_all_present() -> None:
    assert missing_requirements(CONNECT_REQUIREMENTS, importer(set()), versions()) == []


def test_missing_and_out_of_range_packages_are_named_with_their_range() -> None:
    found = missing_requirements(CONNECT_REQUIREMENTS, importer({"pandas", "grpc_status"}),
                                 versions(pandas=None, **{"grpcio-status": None, "pyarrow": "17.0.0"}))
    assert found == ["pandas>=2.2.0,<3.0.0 (not installed)", "pyarrow>=18.0.0 (found 17.0.0)",
                     "grpcio-status>=1.48.1 (not installed)"]
    assert missing_requirements(CONNECT_REQUIREMENTS, importer(set()), versions(pandas="3.0.1")) == \
        ["pandas>=2.2.0,<3.0.0 (found 3.0.1)"]


def test_connect_without_pandas_is_one_line_saying_what_to_install() -> None:
    with pytest.raises(StartupError) as info:
        check_connect("sc://127.0.0.1:15002", importer({"pandas"}), versions(pandas=None),
                      connect=lambda address, timeout: None)
    msg = str(info.value)
    assert "\n" not in msg
    assert "runtime.mode connect needs Spark Connect's client packages: pandas>=2.2.0,<3.0.0 (not installed)" in msg
    assert "pip install 'pandas>=2.2.0,<3.0.0'" in msg


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens there


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s


def test_a_connect_server_that_is_down_is_one_line(closed_port: int) -> None:
    with pytest.raises(StartupError) as info:
        check_connect(f"sc://127.0.0.1:{closed_port}", importer(set()), versions())
    assert str(info.value) == (f"the Spark Connect server at 127.0.0.1:{closed_port} (runtime.spark_remote) is not "
                               f"reachable (Connection refused): start it, or point runtime.spark_remote at a "
                               f"running one")


def test_a_listening_connect_server_passes(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    check_connect(f"sc://127.0.0.1:{port}/;token=abc", importer(set()), versions())


def test_remote_addresses() -> None:
    assert remote_address("sc://spark.internal:15003/;token=x;use_ssl=true") == ("spark.internal", 15003)
    assert remote_address("sc://spark.internal") == ("spark.internal", 15002)
    with pytest.raises(StartupError, match="the port is not a number"):
        remote_address("sc://h:port")


def test_a_port_in_use_is_one_line_naming_the_setting(listening: socket.socket) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    port = listening.getsockname()[1]
    with pytest.raises(OSError) as info:
        ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
    assert str(bind_failure("127.0.0.1", port, info.value)) == (
        f"port {port} on 127.0.0.1 is in use: set http.port (or --http-port) to a free port, or stop the other process")


# -- the order of DaemonContext.run -------------------------------------------------------------------

def _stopped() -> Any:
    """A stop event already set: a run that wrongly gets past start-up returns instead of running on."""
    stop = threading.Event()
    stop.set()
    return stop


def app_for(tmp_path: Path, port: int, checks: list[str], fail: StartupError | None = None) -> DaemonContext:
    settings = load_settings(None, {
        "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales", "tables": ["t"],
        "checkpoint_volume": str(tmp_path / "ck"), "runtime": {"warehouse": str(tmp_path / "wh")},
        "http": {"port": port}})

    def check(runtime: Any) -> None:
        checks.append(runtime.mode)
        if fail is not None:
            raise fail
    # a real supervisor with no tables to run: nothing here needs Spark
    supervisor = Supervisor(runner_factory=lambda table: None, list_tables=lambda: [])  # type: ignore[arg-type, return-value]
    return DaemonContext(settings).replace(mode_check=check, checkpoints=InMemoryCheckpointStore(),
                                         metrics=Metrics("t", CollectorRegistry()), supervisor=supervisor)


def test_a_port_in_use_stops_the_start_before_anything_is_written(tmp_path: Path, listening: socket.socket) -> None:
    checks: list[str] = []
    app = app_for(tmp_path, listening.getsockname()[1], checks)
    with pytest.raises(StartupError, match="is in use: set http.port"):
        app.run(_stopped())
    assert checks == ["local"], "the mode's prerequisites are checked first"
    assert not (tmp_path / "ck").exists() and not (tmp_path / "wh").exists()


def test_failed_prerequisites_stop_the_start_before_the_port_is_bound(tmp_path: Path, closed_port: int) -> None:
    checks: list[str] = []
    app = app_for(tmp_path, closed_port, checks, fail=StartupError("no Java"))
    with pytest.raises(StartupError, match="no Java"):
        app.run(_stopped())
    with socket.socket() as s:
        s.bind(("127.0.0.1", closed_port))  # still free: nothing was bound
    assert not (tmp_path / "ck").exists()


def test_a_failure_after_the_port_removes_daemon_json_and_the_folders_it_made(tmp_path: Path, closed_port: int) -> None:
    app = app_for(tmp_path, 0, [])

    def spark_fails() -> None:
        assert (app.pipeline_dir / "daemon.json").is_file(), "written once the port is bound"
        raise StartupError("Spark did not start in local mode: boom")
    app.start_spark = spark_fails  # type: ignore[method-assign]
    with pytest.raises(StartupError, match="boom"):
        app.run(_stopped())
    assert not (tmp_path / "ck").exists(), "neither daemon.json nor the folders made for it are left"


def test_check_mode_dispatches_on_the_mode(closed_port: int) -> None:
    from lakemirror.daemon.settings import RuntimeSettings

    with pytest.raises(StartupError, match="Spark Connect"):
        preflight.check_mode(RuntimeSettings(mode="connect", spark_remote=f"sc://127.0.0.1:{closed_port}"))
    preflight.check_mode(RuntimeSettings(mode="databricks"))


def test_status_without_a_daemon_checks_the_mode_before_starting_spark(tmp_path: Path, closed_port: int,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from lakemirror.daemon.cli import main

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "pipeline_id": "p", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
        "checkpoint_volume": str(tmp_path / "ck"),
        "runtime": {"mode": "connect", "spark_remote": f"sc://127.0.0.1:{closed_port}",
                    "warehouse": "s3a://bucket/lakehouse"}}))
    (tmp_path / "ck" / "p").mkdir(parents=True)  # it ran: its checkpoint rows are in the bucket, read by Spark
    assert main(["status", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("lakemirror: cannot start: ") and "Spark Connect" in err and "\n" not in err, err
