"""What the pipeline's records say without Spark: delta-rs tables on a temp folder, no JVM."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from lakemirror.checkpoints.delta_store import arrow_rows
from lakemirror.checkpoints.offline import read_rows, summarize
from lakemirror.checkpoints.records import CheckpointRow
from lakemirror.checkpoints.state import FileStateStore, TableProgress
from lakemirror.identifiers import TableName
from lakemirror.sinks.txn import txn_app_id
from lakemirror.sources.catalog import LocalCatalog
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec
from lakemirror.supervisor.offline.recorded_tables import read_pipeline
from lakemirror.supervisor.offline.replica_transactions import stream_checkpoint

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def row(batch_id: int, last: int | None, error: str | None = None) -> CheckpointRow:
    return CheckpointRow("p", "src.s.t", "dst.s.t", 1, batch_id, "lakemirror/p/src__s__t/e1", last, last, last,
                         0 if error else 4, 0 if error else 3, 3, 0, 0, None, error, error is not None,
                         AT.replace(minute=batch_id), AT.replace(minute=batch_id))


def test_a_failure_row_is_not_a_batch() -> None:
    """Five batch rows then the failure of batch 5: five batches, not batch_id + 1 = 6."""
    rows = [row(b, b + 1) for b in range(5)] + [row(5, None, error="boom")]
    summary = summarize(rows)["src.s.t"]
    assert (summary.batches, summary.rows_applied, summary.latest.error, summary.last_batch.batch_id) == (  # type: ignore[union-attr]
        5, 15, "boom", 4)


def _write_source(path: Path, commits: int) -> None:
    for i in range(commits):
        write_deltalake(str(path), pa.table({"id": [i]}), mode="append")


def test_a_stopped_table_reports_its_replica_and_the_sources_unapplied_commits(tmp_path: Path) -> None:
    warehouse, volume = tmp_path / "lake", tmp_path / "ck"
    catalog = LocalCatalog(warehouse)
    spec = PipelineSpec("p", "src", "dst", "s", "s", str(volume), tables=("t", "u"))
    source, replica = catalog.locate(spec.source("t")), catalog.locate(spec.destination("t"))
    slug = spec.source("t").slug
    _write_source(Path(source.path or ""), 4)                      # versions 0..3
    states = FileStateStore(volume / "p")
    states.save(slug, TableProgress(epoch=1, bootstrap_version=0, bootstrapped=True))
    app_id = txn_app_id("p", slug, 1)
    write_deltalake(str(replica.path), pa.table({"id": [0]}), mode="append")
    write_deltalake(str(replica.path), pa.table({"id": [1]}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(app_id, 1)]))
    offsets = Path(stream_checkpoint(spec.checkpoint_root, "p", slug, 1)) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"reservoirVersion":3,"index":-1}')
    checkpoint_table = catalog.locate(TableName.parse("dst.continuous_sync.checkpoints"))
    write_deltalake(str(checkpoint_table.path), arrow_rows([row(0, 1), row(1, 2), row(2, None, error="x")]))

    def read() -> dict:  # type: ignore[type-arg]
        return read_pipeline(spec, locate=catalog.locate, states=states, state_dir=volume / "p" / "state",
                             checkpoint_table=checkpoint_table)

    t = read()["t"]
    u = read()["u"]  # configured but never started: listed, with nothing recorded
    assert (u.started, u.applied_through, u.versions_behind, u.lag_seconds(time.time())) == (False, None, None, None)
    assert t.started
    # The replica holds batch 1, whose offset ends before version 3: applied through 2, one behind.
    assert (t.applied_through, t.latest_version, t.versions_behind, t.batches) == (2, 3, 1, 2)
    commit_3 = os.stat(Path(source.path or "") / "_delta_log" / f"{3:020d}.json").st_mtime
    assert abs((t.lag_seconds(commit_3 + 100.0) or 0) - 100.0) < 0.01
    (offsets / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"reservoirVersion":4,"index":-1}')
    caught_up = read()["t"]
    assert (caught_up.versions_behind, caught_up.lag_seconds(time.time() + 3600)) == (0, 0.0)


def test_every_configured_table_is_listed_even_when_its_records_cannot_be_read(tmp_path: Path) -> None:
    """A first bootstrap killed early leaves little behind, and a state file may be unreadable: the
    configured tables are still all listed (status never shows ``tables: []`` for a known config)."""
    catalog = LocalCatalog(tmp_path / "lake")
    spec = PipelineSpec("p", "src", "dst", "s", "s", str(tmp_path / "ck"), tables=("a", "b"))
    states = FileStateStore(tmp_path / "ck" / "p")
    states.dir.mkdir(parents=True)
    (states.dir / f"{spec.source('a').slug}.json").write_text("{ not json")
    found = read_pipeline(spec, locate=catalog.locate, states=states, state_dir=states.dir,
                          checkpoint_table=catalog.locate(TableName.parse("dst.continuous_sync.checkpoints")))
    assert sorted(found) == ["a", "b"]
    assert found["b"].started is False


def test_a_refreshed_record_follows_the_source_while_the_table_starts(tmp_path: Path) -> None:
    from dataclasses import replace

    from lakemirror.supervisor.offline.recorded_tables import RecordedTable, refreshed

    catalog = LocalCatalog(tmp_path / "lake")
    spec = PipelineSpec("p", "src", "dst", "s", "s", str(tmp_path / "ck"), tables=("t",))
    path = Path(catalog.locate(spec.source("t")).path or "")
    _write_source(path, 3)
    known = RecordedTable("t", applied_through=1, latest_version=2, oldest_unapplied_at=None)
    _write_source(path, 2)  # the source moves on: versions 3 and 4
    fresh = refreshed(known, spec, catalog.locate)
    commit_2 = os.stat(path / "_delta_log" / f"{2:020d}.json").st_mtime
    assert (fresh.latest_version, fresh.versions_behind) == (4, 3)
    assert fresh.oldest_unapplied_at is not None and abs(fresh.oldest_unapplied_at - commit_2) < 0.01
    assert refreshed(replace(known, table="missing"), spec, catalog.locate).latest_version == 2
