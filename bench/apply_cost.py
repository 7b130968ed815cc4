"""The cost of one micro-batch apply, phase by phase: where lakemirror's lag comes from.

Runs lakemirror's own sink (``DeltaMergeSink.apply``) on a local Spark session against a replica
of a ``rows``-row source, one source commit (``fraction`` of the rows changed) per apply; the
median of the applies after two warm-up ones. Side by side: the stable-source path the runner
uses (the batch read in place, statistics observed during the MERGE, no AQE), with and without
deletion vectors on the replica, and the materialized path it used before (the batch persisted,
counted by an action of its own, then copied again by Delta before the MERGE), the rewrite of
the whole replica that small replicas took instead of a MERGE, and the driver path (a delta-rs
MERGE on the driver) that small local replicas now take (:mod:`lakemirror.sinks.merge.apply_choice`). Each
apply is followed by its checkpoint row, written the way the runner writes it (a blind append for
a fresh batch) and, for comparison, the way it was written before (an append with Delta writer
transaction ids, which makes Delta reconstruct the table's transaction state on every append).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.workload import SourceTable


def checkpoint_row(batch_id: int, rows_read: int) -> Any:
    from datetime import datetime, timezone

    from lakemirror.checkpoints.records import CheckpointRow

    now = datetime.now(timezone.utc)
    return CheckpointRow(pipeline_id="bench", source_fqn="src.bench.t", dest_fqn="dst.bench.t", epoch=1,
                         batch_id=batch_id, txn_app_id="bench", first_version=batch_id, last_version=batch_id,
                         last_committed_version=batch_id, rows_read=rows_read, rows_merged=rows_read,
                         rows_inserted=0, rows_updated=0, rows_deleted=0, lag_seconds=0.0, error=None,
                         degraded=False, started_at=now, ended_at=now)


def apply_cost(rows: int, fraction: float, applies: int, seed: int) -> list[dict[str, Any]]:
    from lakemirror import tables
    from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
    from lakemirror.checkpoints.records import CHECKPOINT_DDL
    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.spark import local_session
    from lakemirror.identifiers import TableName
    from lakemirror.schema import columns_from_struct
    from lakemirror.sinks.batch import snapshot_copy
    from lakemirror.sinks.merge.apply_choice import DEFAULT_REWRITE_BELOW_BYTES, choose_apply
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink, TxnId
    from lakemirror.sinks.merge.planner import plan_merge
    from lakemirror.sources.catalog import table_id
    from lakemirror.tables import TableLocation

    workdir = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    src = SourceTable(workdir / "src" / "bench" / "t", rows)
    src.create()
    rng = random.Random(seed)
    for i in range(applies + 2):
        src.change(rng, fraction, i + 1)
    spark = local_session(RuntimeSettings(master="local[2]", shuffle_partitions=2), app_name="lakemirror-bench")
    source = TableLocation(TableName("src", "bench", "t"), str(src.path))
    snapshot = tables.read(spark, source, versionAsOf=0)
    columns = columns_from_struct(snapshot.schema)
    plan = plan_merge(columns, ["id"])
    out = []
    try:
        for path, dv in (("materialized (before)", False), ("stable", False), ("stable", True), ("rewrite", False),
                         ("driver (delta-rs)", False)):
            stable = path != "materialized (before)"
            tag = f"{path.split()[0]}_dv_{dv}"
            replica = TableLocation(TableName("dst", "bench", f"t_{tag}"), str(workdir / "dst" / f"t_{tag}"))
            snapshot_copy.write_snapshot(snapshot, replica, columns, {})
            spark.sql(f"ALTER TABLE {replica.sql} SET TBLPROPERTIES ('delta.enableDeletionVectors' = '{str(dv).lower()}')")
            facts = snapshot_copy.replica_facts(spark, replica)
            small = path in ("rewrite", "driver (delta-rs)")
            choice = choose_apply(facts, plan.column_names, DEFAULT_REWRITE_BELOW_BYTES, driver_apply=path != "rewrite",
                                  key_types=["bigint"]) if small else None
            sink = DeltaMergeSink(replica, plan, stable_source=stable, choice=choice, replica_rows=facts.rows)
            assert (sink.rewrite is not None) == (path == "rewrite") and (sink.driver is not None) == (path != "rewrite" and small), choice
            store = DeltaCheckpointStore(spark, TableLocation(TableName("a", "b", f"ck_{tag}"), str(workdir / f"ck_{tag}")))
            store.ensure()
            txn_rows = TableLocation(TableName("a", "b", f"ck_txn_{tag}"), str(workdir / f"ck_txn_{tag}"))
            DeltaCheckpointStore(spark, txn_rows).ensure()
            phases: dict[str, list[float]] = {"source table id": [], "batch stats": [], "sink apply": [],
                                              "whole apply": [], "checkpoint row": [], "checkpoint row txn": []}
            for v in range(1, applies + 3):
                batch = tables.read(spark, source, readChangeFeed="true", startingVersion=v, endingVersion=v)
                t0 = time.perf_counter()
                table_id(spark, source)
                t1 = time.perf_counter()
                sink.stats(batch)
                t2 = time.perf_counter()
                outcome = sink.apply(batch, TxnId(f"bench/{tag}", v))
                t3 = time.perf_counter()
                row = checkpoint_row(v, outcome.stats.rows_read)
                store.append(row, known_new=True)
                t4 = time.perf_counter()
                tables.write(spark.createDataFrame([tuple(row.as_dict().values())], CHECKPOINT_DDL), txn_rows,
                             "append", txnAppId=f"bench/{tag}/checkpoints", txnVersion=v)
                t5 = time.perf_counter()
                if v > 2:
                    phases["checkpoint row"].append(t4 - t3)
                    phases["checkpoint row txn"].append(t5 - t4)
                    phases["source table id"].append(t1 - t0)
                    phases["batch stats"].append(t2 - t1)
                    phases["sink apply"].append(t3 - t2)
                    phases["whole apply"].append((t1 - t0) + (t3 - t2) + (t4 - t3))
            exact = sorted(map(tuple, tables.read(spark, source).collect())) == sorted(
                map(tuple, tables.read(spark, replica).select("id", "v", "payload").collect()))
            out.append({"apply_path": path, "deletion_vectors": dv, "rows": rows, "change_rows_per_apply": int(rows * fraction * 1.1),
                        "applies": applies, "exact": exact,
                        **{f"median_{k.replace(' ', '_')}_s": round(statistics.median(x), 3)
                           for k, x in phases.items()}})
    finally:
        spark.stop()
    return out
