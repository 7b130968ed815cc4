"""The benchmark's user recipe (bench/recipe.py) is exact, idempotent, and read right from outside.

The production workload compares lakemirror with this recipe; a recipe that lost or doubled changes,
or whose progress the benchmark misread, would make that comparison worthless."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import lose_commit_entry

pytestmark = pytest.mark.integration


def _rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).select("id", "v", "payload").collect())


def test_the_last_change_per_key_wins_and_preimages_are_dropped(spark: Any) -> None:
    from bench.recipe import latest_change_per_key

    cols = ["id", "v", "payload", "_change_type", "_commit_version", "_commit_timestamp"]
    changes = spark.createDataFrame([
        (1, 1, "a", "delete", 5, None), (1, 2, "b", "insert", 5, None),            # one version: the insert wins
        (2, 3, "c", "insert", 3, None), (2, 3, "c", "update_preimage", 4, None),
        (2, 4, "d", "update_postimage", 4, None),                                     # a later version wins
        (3, 5, "e", "update_postimage", 6, None), (3, 5, "e", "delete", 7, None),     # deleted last
    ], "id BIGINT, v BIGINT, payload STRING, _change_type STRING, _commit_version BIGINT, _commit_timestamp TIMESTAMP")
    latest = sorted((r.id, r.v, r._change_type) for r in latest_change_per_key(changes.select(*cols), ["id"]).collect())
    assert latest == [(1, 2, "insert"), (2, 4, "update_postimage"), (3, 5, "delete")]


# The benchmark's baseline, not the product: in the slow tier (`make test-all`); the recipe's fold of the
# change feed (the part whose error would double or lose changes) is checked above in every run.
@pytest.mark.slow
def test_the_recipe_replicates_exactly_skips_a_replayed_batch_and_its_progress_reads_right(
        spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from bench.recipe import start_table
    from bench.recipe_job import LocalStore, TableProgress

    source, target, checkpoint = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    spark.sql(f"CREATE TABLE delta.`{source}` (id BIGINT, v BIGINT, payload STRING) USING delta "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"INSERT INTO delta.`{source}` SELECT id, id, 'p' FROM range(20)")

    def run(changes: bool) -> None:
        query = start_table(spark, source=str(source), target=str(target), checkpoint=str(checkpoint), keys=["id"],
                            app_id="cdc-recipe-t", trigger_seconds=0.5, name="bench_recipe_test")
        try:
            query.processAllAvailable()
            if changes:
                spark.sql(f"UPDATE delta.`{source}` SET v = v + 100 WHERE id < 5")
                spark.sql(f"DELETE FROM delta.`{source}` WHERE id >= 15")
                spark.sql(f"MERGE INTO delta.`{source}` t USING (SELECT id, -id v, 'm' payload FROM range(10, 25)) s "
                          "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
                query.processAllAvailable()
        finally:
            query.stop()
    run(changes=True)
    assert _rows(spark, target) == _rows(spark, source)

    head = int(DeltaTable(str(source)).version())
    progress = TableProgress(checkpoint, "src", "dst", "cdc-recipe-t", LocalStore(tmp_path),
                             snapshot_files=lambda v: len(DeltaTable(str(source), version=v).file_uris()))
    assert progress.applied_through() == head
    applies = progress.applies()
    assert applies and applies[-1].through == head and [a.at for a in applies] == sorted(a.at for a in applies)
    assert all(seconds >= 0 for _, seconds, _ in progress.batch_times())

    # A crash after the MERGE and before Spark's commit entry: the batch runs again, Delta skips it.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    lose_commit_entry(checkpoint / "commits", last, missing_ok=True)
    replica_version = int(DeltaTable(str(target)).version())
    run(changes=False)
    assert (checkpoint / "commits" / str(last)).exists()
    assert int(DeltaTable(str(target)).version()) == replica_version  # no second commit of the batch
    assert _rows(spark, target) == _rows(spark, source)
