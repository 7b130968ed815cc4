"""Pure parts of the control API: readiness verdicts, which checkpoint folder DELETE may remove, the worker."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lakemirror.daemon.pipelines import checkpoint_dir_to_delete, claim_folder
from lakemirror.daemon.worker import CommandWorker, WorkerClosed, WorkerTimeout
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sources.catalog import TableInfo
from lakemirror.sources.cdf_check import assess, unreadable
from lakemirror.tables import TableLocation

ID = Column("id", "bigint", False)


def info(cols: tuple[Column, ...] = (ID,), cdf: bool = True, declared: tuple[str, ...] = (),
         path: str | None = "/wh/c/s/t", **props: str) -> TableInfo:
    properties = {"delta.enableChangeDataFeed": str(cdf).lower(), **props}
    return TableInfo(TableLocation(TableName("c", "s", "t"), path), "tid", cols, properties, declared)


def test_a_cdf_table_with_an_id_is_ready_with_the_whole_window_as_headroom() -> None:
    r = assess(info())
    assert (r.ready, r.cdf_enabled, r.key, r.key_rule, r.problems, r.fixes, r.warnings) == (
        True, True, ("id",), "column named id", (), (), ())
    assert r.retention_headroom_seconds == 7 * 86400.0


@pytest.mark.parametrize("kw, key, rule", [
    (dict(configured_keys=["a"]), ("a",), "config"),
    (dict(), ("a", "b"), "declared constraint"),
])
def test_the_key_and_the_rule_that_found_it(kw: dict[str, list[str]], key: tuple[str, ...], rule: str) -> None:
    r = assess(info((Column("a", "int"), Column("b", "int")), declared=("a", "b")), **kw)  # type: ignore[arg-type]
    assert (r.ready, r.key, r.key_rule) == (True, key, rule)


def test_cdf_off_gives_the_exact_alter_table() -> None:
    r = assess(info(cdf=False))
    assert not r.ready and r.problems == ("Change Data Feed is not enabled",)
    assert r.fixes == ("ALTER TABLE delta.`/wh/c/s/t` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",)


def test_no_usable_key_locally_says_which_property_to_set_or_which_override() -> None:
    r = assess(info((Column("x", "string"),)))
    assert not r.ready and r.key is None and r.key_rule is None
    assert "no usable primary key" in r.problems[0]
    assert r.fixes[0] == "ALTER TABLE delta.`/wh/c/s/t` SET TBLPROPERTIES ('lakemirror.primaryKey' = '<col1,col2>')"
    assert "table_overrides: {t: {keys:" in r.fixes[1]


def test_no_usable_key_in_unity_catalog_says_to_add_a_primary_key_constraint() -> None:
    r = assess(info((Column("x", "string"),), path=None), key_declaration="constraint")
    assert "ALTER TABLE `c`.`s`.`t` ADD CONSTRAINT <name> PRIMARY KEY" in r.fixes[0]


def test_a_short_retention_window_is_a_warning_with_its_fix_not_a_refusal() -> None:
    r = assess(info(**{"delta.logRetentionDuration": "interval 2 hours"}), retention_warning_seconds=86400)
    assert r.ready and r.retention_headroom_seconds == 7200.0 and "7200s" in r.warnings[0]
    assert r.fixes == ("ALTER TABLE delta.`/wh/c/s/t` SET TBLPROPERTIES ('delta.deletedFileRetentionDuration' = "
                       "'interval 7 days', 'delta.logRetentionDuration' = 'interval 30 days')",)


def test_a_table_that_cannot_be_described_is_not_ready() -> None:
    r = unreadable("c.s.t", "not a Delta table")
    assert not r.ready and "not a Delta table" in r.problems[0]


# -- checkpoint cleanup ------------------------------------------------------------------------------

def test_only_the_pipelines_own_directory_may_be_deleted(tmp_path: Path) -> None:
    assert claim_folder(tmp_path / "ck" / "p", "p")
    assert checkpoint_dir_to_delete(str(tmp_path / "ck"), "p", [tmp_path / "ck" / "other"]) == tmp_path / "ck" / "p"
    assert checkpoint_dir_to_delete(str(tmp_path / "ck"), "p", [], root=str(tmp_path)) == tmp_path / "ck" / "p"
    assert not claim_folder(tmp_path / "ck" / "p", "p"), "an existing folder is never claimed again"
    (tmp_path / "ck" / "mine").mkdir()
    with pytest.raises(ValueError, match="was not created by lakemirror for pipeline 'mine'"):
        checkpoint_dir_to_delete(str(tmp_path / "ck"), "mine", [])
    with pytest.raises(ValueError, match="not inside the daemon's checkpoint folder"):
        checkpoint_dir_to_delete(str(tmp_path / "ck"), "p", [], root=str(tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="not inside the daemon's checkpoint folder"):
        checkpoint_dir_to_delete(str(tmp_path), "ck", [], root=str(tmp_path / "ck"))  # the root itself


@pytest.mark.parametrize("pid", ["", ".", "..", "a/../..", "a\\b"])
def test_ids_that_are_not_one_plain_name_are_refused(tmp_path: Path, pid: str) -> None:
    with pytest.raises(ValueError):
        checkpoint_dir_to_delete(str(tmp_path), pid, [])


def test_a_symlinked_or_overlapping_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "p").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="symbolic link"):
        checkpoint_dir_to_delete(str(tmp_path / "ck"), "p", [])
    with pytest.raises(ValueError, match="overlaps"):
        checkpoint_dir_to_delete(str(tmp_path / "ck"), "q", [tmp_path / "ck" / "q" / "nested"])
    with pytest.raises(ValueError, match="overlaps"):
        checkpoint_dir_to_delete(str(tmp_path / "ck"), "q", [tmp_path / "ck"])


# -- the worker ---------------------------------------------------------------------------------------

def test_the_worker_runs_commands_in_order_on_its_own_thread_and_times_out() -> None:
    worker = CommandWorker()
    try:
        assert worker.call("name", lambda: threading.current_thread().name, 5).startswith("api-worker")
        gate = threading.Event()
        with pytest.raises(WorkerTimeout) as running:
            worker.call("slow", lambda: gate.wait(5), 0.1)
        assert running.value.started
        with pytest.raises(WorkerTimeout) as queued:
            worker.call("queued", lambda: None, 0.1)
        assert not queued.value.started
        gate.set()
        with pytest.raises(KeyError):
            worker.call("fails", lambda: {}["x"], 5)

        def raises_timeout() -> None:
            raise TimeoutError("its own")
        with pytest.raises(TimeoutError, match="its own"):
            worker.call("own timeout", raises_timeout, 5)
    finally:
        worker.close()
    with pytest.raises(WorkerClosed):
        worker.call("late", lambda: None, 1)
