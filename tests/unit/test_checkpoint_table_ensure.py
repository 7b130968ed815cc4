"""A checkpoint table on the driver's own file system is found or created by delta-rs: no Spark job
before the daemon's first table launches."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
from lakemirror.checkpoints.records import CHECKPOINT_DDL
from lakemirror.identifiers import TableName
from lakemirror.tables import TableLocation


class JvmSession:
    """A session with a JVM of its own (what makes the driver's file system the table's) that fails
    any Spark call: the store must make none."""

    _jvm = object()


def _store(path: Path) -> DeltaCheckpointStore:
    return DeltaCheckpointStore(JvmSession(), TableLocation(TableName("dst", "continuous_sync", "checkpoints"),  # type: ignore[arg-type]
                                                            str(path)))


def test_a_missing_local_checkpoint_table_is_created_then_found(tmp_path: Path) -> None:
    store = _store(tmp_path / "checkpoints")
    store.ensure()
    table = DeltaTable(str(tmp_path / "checkpoints"))
    assert table.version() == 0
    assert [f.name for f in table.schema().fields] == [c.split()[0] for c in CHECKPOINT_DDL.split(", ")]
    store.ensure()
    assert DeltaTable(str(tmp_path / "checkpoints")).version() == 0, "found: nothing written again"


def test_a_log_without_its_first_commit_or_a_checkpoint_is_left_to_spark(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "_delta_log").mkdir(parents=True)
    assert not _store(tmp_path / "checkpoints")._ensure_on_driver()  # noqa: SLF001
    assert list((tmp_path / "checkpoints" / "_delta_log").iterdir()) == [], "nothing written into it"


def test_a_table_elsewhere_is_left_to_spark(tmp_path: Path) -> None:
    remote = DeltaCheckpointStore(JvmSession(), TableLocation(TableName("a", "b", "c"), "s3a://bucket/ck"))  # type: ignore[arg-type]
    assert not remote._ensure_on_driver()  # noqa: SLF001
    by_name = DeltaCheckpointStore(JvmSession(), TableLocation(TableName("a", "b", "c"), None))  # type: ignore[arg-type]
    assert not by_name._ensure_on_driver()  # noqa: SLF001
