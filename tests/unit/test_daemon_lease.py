"""The daemon takes its pipeline's lease before anything starts: a second daemon of the pipeline
(or another pipeline given the same pipeline_id on the same checkpoint folder) is refused with one
line naming the holder, and never touches the holder's ``daemon.json``; a daemon that loses its
lease stops. Real daemons (HTTP server, supervisor, lease on a real folder), no Spark."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from lakemirror.checkpoints.lease import Holder, LeaseHeld, LeaseLost, record_for
from lakemirror.checkpoints.lease_store import FileLeaseStore
from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.daemon.cli import EXIT_CONFIG, main
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.settings import load_settings
from lakemirror.supervisor.control.loop import Supervisor


def config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"pipeline_id": "orders", "source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
            "tables": ["t"], "checkpoint_volume": str(tmp_path / "ck"), "runtime": {"warehouse": str(tmp_path / "wh")},
            "http": {"port": 0}, **extra}


def daemon(raw: dict[str, Any], config_file: str | None = None) -> DaemonContext:
    supervisor = Supervisor(runner_factory=lambda table: None, list_tables=lambda: [])  # type: ignore[arg-type, return-value]
    return DaemonContext(load_settings(None, raw), config_file).replace(
        mode_check=lambda runtime: None, checkpoints=InMemoryCheckpointStore(),
        metrics=Metrics("t", CollectorRegistry()), supervisor=supervisor)


class Running:
    """A daemon running on a thread until stopped."""

    def __init__(self, app: DaemonContext) -> None:
        self.app, self.stop, self.error = app, threading.Event(), None  # type: Any
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not (app.pipeline_dir / "daemon.json").is_file():
            assert time.monotonic() < deadline and self.error is None, f"the daemon did not start: {self.error}"
            time.sleep(0.01)

    def _run(self) -> None:
        try:
            self.app.run(self.stop)
        except BaseException as exc:  # noqa: BLE001 (the test reads it)
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(20)


@pytest.fixture
def first(tmp_path: Path) -> Iterator[Running]:
    running = Running(daemon(config(tmp_path), "/etc/lakemirror/orders.yaml"))
    yield running
    running.close()


def test_a_second_daemon_is_refused_and_leaves_the_first_ones_files_alone(tmp_path: Path, first: Running) -> None:
    endpoint = first.app.pipeline_dir / "daemon.json"
    before = endpoint.read_text()
    second = daemon(config(tmp_path))
    with pytest.raises(LeaseHeld) as refused:
        second.run(threading.Event())
    text = str(refused.value)
    assert "pipeline orders is already run by host" in text and first.app.server.url in text
    assert "/etc/lakemirror/orders.yaml" in text and "\n" not in text
    assert endpoint.read_text() == before, "daemon.json is the first daemon's, untouched"
    assert first.app.lease.held and first.thread.is_alive()


def test_another_pipeline_with_the_same_id_on_the_same_folder_is_refused(tmp_path: Path, first: Running) -> None:
    other = daemon(config(tmp_path, source_catalog="crm", schema_name="people", tables=["p"]))
    with pytest.raises(LeaseHeld, match="pipeline orders is already run by"):
        other.run(threading.Event())
    assert json.loads((first.app.pipeline_dir / "daemon.json").read_text())["url"] == first.app.server.url


def test_the_cli_exits_2_with_one_line_naming_the_holder(tmp_path: Path, first: Running,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "again.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path)))
    assert main(["run", str(path)]) == EXIT_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lakemirror: cannot start: pipeline orders is already run by host")
    assert first.app.server.url in err[0]


def test_a_lease_store_out_of_reach_ends_the_start_in_one_line_leaving_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An S3 endpoint nobody listens on: the daemon cannot tell whether another one runs the pipeline,
    so it does not start, says where the lease is and how it is reached, and leaves no folder behind."""
    path = tmp_path / "s3.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, runtime={"warehouse": "s3a://lake/house", "spark_conf": {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:1", "spark.hadoop.fs.s3a.access.key": "AK",
        "spark.hadoop.fs.s3a.secret.key": "SK"}})))
    assert main(["run", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "lakemirror: cannot start: pipeline orders: its lease at s3://lake/house/.lakemirror/leases/orders could "
        "not be read or written (EndpointConnectionError"), err
    assert "spark.hadoop.fs.s3a.* settings" in err[0] and "lease.object_store" in err[0] and "SK" not in err[0]
    assert not (tmp_path / "ck").exists()


def test_a_stopped_daemon_releases_its_lease_and_the_next_starts_at_once(tmp_path: Path, first: Running) -> None:
    first.close()
    assert first.error is None
    assert not (first.app.pipeline_dir / "daemon.json").exists()
    second = Running(daemon(config(tmp_path)))
    try:
        assert second.app.lease.held
    finally:
        second.close()


def test_a_daemon_that_loses_its_lease_stops_and_keeps_its_hands_off_the_new_holders_file(
        tmp_path: Path, first: Running) -> None:
    store = FileLeaseStore(first.app.pipeline_dir / "lease")
    newest = store.newest()
    assert newest is not None
    usurper = Holder(host="elsewhere", pid=1, token="usurper", since=time.time(), url="http://elsewhere:9464")
    store.create(record_for(usurper, newest.generation + 1, time.time(), first.app.settings.lease.policy()))
    endpoint = first.app.pipeline_dir / "daemon.json"
    endpoint.write_text(json.dumps({"url": "http://elsewhere:9464", "lease": "usurper"}))
    assert not first.app.lease.renew()
    first.thread.join(20)
    assert isinstance(first.error, LeaseLost) and "host elsewhere" in str(first.error)
    assert json.loads(endpoint.read_text())["lease"] == "usurper", "the new holder's daemon.json is kept"
    current = store.newest()
    assert current is not None and current.record is not None and current.record.holder.token == "usurper"
    assert not current.record.released


def test_a_pipeline_posted_to_the_api_takes_its_lease_and_releases_it_when_stopped(tmp_path: Path) -> None:
    """Another daemon (another host) runs pipeline 'shop': posting it here is refused naming that
    daemon; once it released the lease, the post runs, and stopping the pipeline releases it."""
    from lakemirror.checkpoints.pipeline_lease import PipelineLease

    (tmp_path / "in").mkdir()
    parent = daemon(config(tmp_path)).replace(spark=object())
    posted = load_settings(None, config(tmp_path, pipeline_id="shop", tables=None, source={
        "kind": "files", "name": "shop", "path": str(tmp_path / "in")}))
    folder = tmp_path / "ck" / "shop" / "lease"
    other = PipelineLease("shop", [FileLeaseStore(folder)], Holder("elsewhere", 7, "o", time.time()),
                          posted.lease.policy(), lambda h: True)
    other.acquire()
    with pytest.raises(LeaseHeld, match="pipeline shop is already run by host elsewhere"):
        parent.start_pipeline(posted)
    assert parent.pipelines.get("shop") is None
    other.release()
    handle = parent.start_pipeline(posted)
    newest = FileLeaseStore(folder).newest()
    assert newest is not None and newest.record is not None and not newest.record.released
    assert 'pipeline="shop"' in generate_latest(parent.metrics.registry).decode()
    handle.stop(5)
    newest = FileLeaseStore(folder).newest()
    assert newest is not None and newest.record is not None and newest.record.released
    assert 'pipeline="shop"' not in generate_latest(parent.metrics.registry).decode(), \
        "a stopped pipeline's series leave /metrics with it"
    parent.worker.close(wait=False)


def test_a_refused_first_start_cleans_up_only_its_own_released_lease(tmp_path: Path) -> None:
    """Two daemons starting at once on a folder that did not exist: the refused one removes what it
    made, never the winner's lease."""
    from lakemirror.checkpoints.lease_store import lease_name
    from lakemirror.daemon.context import _remove_lease_if_released

    folder = tmp_path / "ck" / "orders" / "lease"
    store = FileLeaseStore(folder)
    policy = load_settings(None, config(tmp_path)).lease.policy()
    store.create(record_for(Holder("h", 1, "winner", 0.0), 1, time.time(), policy))
    _remove_lease_if_released(folder, tmp_path / "ck", "loser")
    assert (folder / lease_name(1)).is_file()
    mine = record_for(Holder("h", 2, "mine", 0.0), 2, time.time(), policy)
    store.write(mine.__class__(**{**mine.__dict__, "released": True}))
    store.prune(2)
    _remove_lease_if_released(folder, tmp_path / "ck", "mine")
    assert not (tmp_path / "ck").exists(), "its own released lease, and the folders the start made, are gone"
