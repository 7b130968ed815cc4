"""The driver's deletion-vector apply (sinks/accelerator/dv_merge.py) against real Delta: Spark reads what it
writes, row for row, and it reads (and adds to) what Spark wrote."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakemirror.delta_log import local_log
from lakemirror.delta_log.deletion_vectors import DvDescriptor
from lakemirror.delta_log.layout import commit_file_name
from lakemirror.delta_log.local_log import load_snapshot
from lakemirror.sinks.accelerator import dv_compaction, dv_merge
from lakemirror.sinks.accelerator.dv_merge import DeletionVectorMerge, DvUnfit
from lakemirror.sinks.merge.planner import DELETE, OP_COLUMN
from lakemirror.sinks.txn import TxnId

pytestmark = pytest.mark.integration

UPSERT = "upsert"


def _replica(spark: Any, path: Path, ddl: str = "k BIGINT, v STRING", rows: list[tuple[Any, ...]] | None = None,
             props: str = "'delta.enableDeletionVectors' = 'true'", files: int = 3) -> None:
    spark.sql(f"CREATE TABLE delta.`{path}` ({ddl}) USING delta TBLPROPERTIES ({props})")
    if rows:
        schema = spark.table(f"delta.`{path}`").schema
        spark.createDataFrame(rows, schema).repartition(files).write.format("delta").mode("append").save(str(path))


def _rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in spark.read.format("delta").load(str(path)).collect()),
                  key=lambda r: tuple((x is None, x) for x in r))


def _winners(schema: pa.Schema, changes: list[tuple[Any, ...]]) -> pa.Table:
    """``changes``: (op, *row); one per key, as winning_changes hands them over."""
    columns = list(zip(*[c[1:] for c in changes])) if changes else [[] for _ in schema]
    arrays = [pa.array(list(col), f.type) for col, f in zip(columns, schema)]
    return pa.table([*arrays, pa.array([c[0] for c in changes], pa.string())],
                    names=[*schema.names, OP_COLUMN])


KV = pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.string())])


#: Compaction at every turn in the slow tier; the default tier compacts in
#: test_small_files_and_mostly_deleted_files_are_compacted_without_changing_the_data.
@pytest.mark.parametrize("compaction", ["off", pytest.param("eager", marks=pytest.mark.slow)])
def test_random_histories_equal_the_model_and_no_data_file_is_rewritten(spark, tmp_path, monkeypatch, compaction):
    """Inserts, updates, deletes and re-inserts over 12 batches: after each, Spark reads exactly the
    model; the counts are the MERGE's. Without compaction the replica's original data files are
    never rewritten; with it at every turn, nothing changes but the files."""
    if compaction == "off":
        monkeypatch.setattr(dv_compaction, "COMPACT_MIN_FILES", 10**6)
        monkeypatch.setattr(dv_compaction, "PURGE_DELETED_SHARE", 2.0)
    else:
        monkeypatch.setattr(dv_compaction, "COMPACT_MIN_FILES", 3)
        monkeypatch.setattr(dv_compaction, "PURGE_DELETED_SHARE", 0.1)
    path = tmp_path / "r"
    model = {k: f"v{k}" for k in range(300)}
    _replica(spark, path, rows=sorted(model.items()))
    original = {a["path"] for a in load_snapshot(path).files.values()}
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    rng = random.Random(7)
    for batch in range(12):
        changes, expected = [], [0, 0, 0]
        for k in rng.sample(range(400), 40):
            if rng.random() < 0.3:
                changes.append((DELETE, k, None))
                expected[2] += k in model
                model.pop(k, None)
            else:
                value = None if rng.random() < 0.1 else f"b{batch}-{k}"
                changes.append((UPSERT, k, value))
                expected[1 if k in model else 0] += 1
                model[k] = value
        counts = merge.merge(_winners(KV, changes), TxnId("app", batch))
        assert (counts.inserted, counts.updated, counts.deleted) == tuple(expected)
        assert _rows(spark, path) == sorted(model.items())
    live = load_snapshot(path).files.values()
    kept = [a for a in live if a["path"] in original]
    if compaction == "off":
        assert len(kept) == len(original) and all(a.get("deletionVector") for a in kept), "changed in place"
    else:
        assert len(live) < 12 and not kept, "compacted"


def test_composite_keys_match_null_safely_and_never_by_concatenation(spark, tmp_path):
    path = tmp_path / "r"
    rows = [("a|b", "c", 1), ("a", "b|c", 2), (None, "x", 3), ("x", None, 4), (None, None, 5), ("V1:a", "b", 6)]
    _replica(spark, path, "p STRING, q STRING, n INT", rows, files=2)
    schema = pa.schema([pa.field("p", pa.string()), pa.field("q", pa.string()), pa.field("n", pa.int32())])
    merge = DeletionVectorMerge(str(path), ["p", "q"], ["p", "q", "n"])
    counts = merge.merge(_winners(schema, [(UPSERT, "a|b", "c", 10), (UPSERT, None, None, 50), (DELETE, None, "x", None),
                                           (UPSERT, "a", "b", 99)]), TxnId("app", 0))
    assert (counts.inserted, counts.updated, counts.deleted) == (1, 2, 1)
    assert _rows(spark, path) == sorted([("a|b", "c", 10), ("a", "b|c", 2), ("x", None, 4), (None, None, 50),
                                         ("V1:a", "b", 6), ("a", "b", 99)], key=lambda r: tuple((x is None, x) for x in r))


@pytest.mark.parametrize("first", ["INT", "DATE"])
def test_keys_of_several_integer_columns_are_encoded_and_match_as_the_merge_does(spark, tmp_path, first):
    """A key of two integer (or date) columns: Spark's files keep it encoded (one integer a row);
    random inserts, updates, deletes and re-inserts, some keys with a NULL part (matched
    null-safely, their files looked up row by row), equal the model after every batch, with the
    MERGE's counts."""
    import datetime

    from lakemirror.sinks.accelerator.key_match import KEY_CACHE

    def part(n: int) -> Any:
        return n if first == "INT" else datetime.date(2026, 1, 10) + datetime.timedelta(days=n)

    path = tmp_path / "r"
    model: dict[tuple[Any, Any], str | None] = {(part(a), b): f"v{a}.{b}" for a in range(-3, 4) for b in range(40)}
    _replica(spark, path, f"a {first}, b BIGINT, v STRING", [(*k, v) for k, v in sorted(model.items())], files=2)
    schema = pa.schema([pa.field("a", pa.int32() if first == "INT" else pa.date32()), pa.field("b", pa.int64()),
                        pa.field("v", pa.string())])
    merge = DeletionVectorMerge(str(path), ["a", "b"], ["a", "b", "v"])
    rng = random.Random(11)
    for batch in range(8):
        keys = {(part(rng.randint(-5, 5)), rng.randint(-2, 45)) for _ in range(60)}
        keys |= {(None, rng.randint(0, 3)), (part(rng.randint(0, 3)), None)} if batch % 2 else set()
        changes, expected = [], [0, 0, 0]
        for key in sorted(keys, key=lambda k: tuple((x is None, x) for x in k)):
            if rng.random() < 0.3:
                changes.append((DELETE, *key, None))
                expected[2] += key in model
                model.pop(key, None)
            else:
                changes.append((UPSERT, *key, f"b{batch}"))
                expected[1 if key in model else 0] += 1
                model[key] = f"b{batch}"
        counts = merge.merge(_winners(schema, changes), TxnId("app", batch))
        assert (counts.inserted, counts.updated, counts.deleted) == tuple(expected)
        assert _rows(spark, path) == sorted(((*k, v) for k, v in model.items()),
                                            key=lambda r: tuple((x is None, x) for x in r))
        if batch == 0:
            kept = KEY_CACHE.kept(str(path))
            assert kept and all(getattr(k, "layout", "").startswith("composite") for k in kept), "Spark's files encoded"


def test_string_keys_are_found_by_hash_and_match_as_the_merge_does(spark, tmp_path):
    """A STRING key: every file's keys are kept hashed; random inserts, updates, deletes and
    re-inserts, a NULL key (equal to NULL) and two keys whose hashes collide (Thue-Morse words)
    equal the model after every batch, with the MERGE's counts."""
    from lakemirror.sinks.accelerator.key_match import KEY_CACHE

    def thue_morse(letters: str) -> str:
        bits = [0]
        while len(bits) < 1024:
            bits += [1 - b for b in bits]
        return "".join(letters[b] for b in bits)

    word, twin = thue_morse("ab"), thue_morse("ba")
    pool = [f"key-{n:04d}" for n in range(120)] + [word, twin, None, ""]
    path = tmp_path / "r"
    model: dict[str | None, str | None] = {k: f"v{n}" for n, k in enumerate(pool[:80] + [word, None])}
    _replica(spark, path, "k STRING, v STRING", sorted(model.items(), key=lambda r: (r[0] is None, r[0])), files=2)
    schema = pa.schema([pa.field("k", pa.string()), pa.field("v", pa.string())])
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    rng = random.Random(5)
    for batch in range(8):
        keys = rng.sample(pool, 40) + ([twin] if batch == 0 else [])
        changes, expected = [], [0, 0, 0]
        for key in dict.fromkeys(keys):
            if rng.random() < 0.3:
                changes.append((DELETE, key, None))
                expected[2] += key in model
                model.pop(key, None)
            else:
                changes.append((UPSERT, key, f"b{batch}"))
                expected[1 if key in model else 0] += 1
                model[key] = f"b{batch}"
        counts = merge.merge(_winners(schema, changes), TxnId("app", batch))
        assert (counts.inserted, counts.updated, counts.deleted) == tuple(expected), batch
        assert _rows(spark, path) == sorted(model.items(), key=lambda r: tuple((x is None, x) for x in r))
        kept = KEY_CACHE.kept(str(path))
        assert kept and all(getattr(k, "layout", "") == "hashed" for k in kept), "every file's keys hashed"


def test_spark_deletion_vectors_are_extended_and_spark_writes_on_top_of_ours(spark, tmp_path):
    path = tmp_path / "r"
    model = {k: f"v{k}" for k in range(200)}
    _replica(spark, path, rows=sorted(model.items()), files=2)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k % 5 = 0")  # Spark's deletion vectors
    for k in [k for k in model if k % 5 == 0]:
        del model[k]
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    changes = [(UPSERT, 5, "back"), (UPSERT, 6, "six"), (DELETE, 7, None), (DELETE, 10, None)]
    counts = merge.merge(_winners(KV, changes), TxnId("app", 0))
    assert (counts.inserted, counts.updated, counts.deleted) == (1, 1, 1)  # 5 re-inserted; 10 was gone already
    model.update({5: "back", 6: "six"})
    del model[7]
    assert _rows(spark, path) == sorted(model.items())
    spark.sql(f"UPDATE delta.`{path}` SET v = 'spark' WHERE k < 20")  # Spark extends our vectors
    model.update({k: "spark" for k in model if k < 20})
    assert _rows(spark, path) == sorted(model.items())
    counts = merge.merge(_winners(KV, [(UPSERT, 6, "again"), (DELETE, 8, None)]), TxnId("app", 1))
    assert (counts.inserted, counts.updated, counts.deleted) == (0, 1, 1)
    model[6] = "again"
    del model[8]
    assert _rows(spark, path) == sorted(model.items())


def test_a_replayed_transaction_writes_nothing(spark, tmp_path):
    path = tmp_path / "r"
    _replica(spark, path, rows=[(1, "a"), (2, "b")], files=1)
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    batch = _winners(KV, [(UPSERT, 1, "x"), (DELETE, 2, None)])
    assert merge.merge(batch, TxnId("app", 4)) is not None
    version = load_snapshot(path).version
    assert merge.merge(batch, TxnId("app", 4)) is None
    assert merge.merge(batch, TxnId("app", 3)) is None
    assert load_snapshot(path).version == version
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert [json.loads(h["userMetadata"])["batch"] for h in history if h["userMetadata"]] == [4]
    assert _rows(spark, path) == [(1, "x")]


def test_a_file_left_with_no_live_row_is_removed(spark, tmp_path):
    path = tmp_path / "r"
    _replica(spark, path, rows=[(1, "a"), (2, "b")], files=1)
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    merge.merge(_winners(KV, [(DELETE, 1, None), (DELETE, 2, None)]), TxnId("app", 0))
    assert load_snapshot(path).files == {}
    assert _rows(spark, path) == []
    merge.merge(_winners(KV, [(UPSERT, 1, "again")]), TxnId("app", 1))
    assert _rows(spark, path) == [(1, "again")]


def test_a_lost_commit_race_is_planned_again_and_leaves_no_stray_file(spark, tmp_path, monkeypatch):
    """Another writer commits between our snapshot and our commit: the batch is planned again on
    the newer snapshot; the first attempt's files are removed."""
    path = tmp_path / "r"
    _replica(spark, path, rows=[(k, "a") for k in range(10)], files=1)
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    real_write, raced = local_log.write_commit, []

    def racing_write(table_dir: Path, version: int, actions: list[dict[str, Any]]) -> bool:
        if not raced:
            raced.append(actions)
            spark.sql(f"UPDATE delta.`{path}` SET v = 'other' WHERE k = 3")  # takes `version`
        return real_write(table_dir, version, actions)

    monkeypatch.setattr(dv_merge, "write_commit", racing_write)
    counts = merge.merge(_winners(KV, [(UPSERT, 3, "ours"), (UPSERT, 11, "new"), (DELETE, 4, None)]), TxnId("app", 0))
    assert raced and (counts.inserted, counts.updated, counts.deleted) == (1, 1, 1)
    assert _rows(spark, path) == sorted([(k, "a") for k in range(10) if k not in (3, 4)] + [(3, "ours"), (11, "new")])
    lost = [a["add"] for a in raced[0] if "add" in a]
    new_rows = [a["path"] for a in lost if not a.get("deletionVector")]
    dv_files = {DvDescriptor.from_action(a["deletionVector"]).file_path(path) for a in lost
                if a.get("deletionVector")}
    assert new_rows and dv_files
    assert not any((path / p).exists() for p in new_rows) and not any(f.exists() for f in dv_files)
    assert not [n for n in os.listdir(path) if n.startswith(".lakemirror-rows-")]


def test_checkpoints_carry_the_deletion_vectors_and_spark_reads_from_them(spark, tmp_path):
    path = tmp_path / "r"
    model = {k: "a" for k in range(50)}
    _replica(spark, path, rows=sorted(model.items()),
             props="'delta.enableDeletionVectors' = 'true', 'delta.checkpointInterval' = '3'", files=2)
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    for batch in range(7):
        changes = [(UPSERT, batch * 3, f"b{batch}"), (DELETE, batch * 3 + 1, None)]
        merge.merge(_winners(KV, changes), TxnId("app", batch))
        model[batch * 3] = f"b{batch}"
        model.pop(batch * 3 + 1, None)
    hint = json.loads((path / "_delta_log" / "_last_checkpoint").read_text())
    assert hint["version"] >= 6
    snapshot = load_snapshot(path)
    assert snapshot.transactions["app"] == 6
    assert _rows(spark, path) == sorted(model.items())
    spark.catalog.clearCache()
    fresh = spark.read.format("delta").load(str(path))  # a fresh reader starts from the checkpoint
    assert sorted(tuple(r) for r in fresh.collect()) == sorted(model.items())


@pytest.mark.parametrize("ddl, props, reason", [
    ("k BIGINT, v STRING", "'delta.enableDeletionVectors' = 'true', 'delta.appendOnly' = 'true'", "append-only"),
    ("k BIGINT, v STRING", "'delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true'",
     "change data feed"),
    ("k BIGINT, v STRING", "'delta.enableDeletionVectors' = 'false'", "does not support deletion vectors"),
    ("k BIGINT, v STRING", "'delta.enableDeletionVectors' = 'true', 'delta.columnMapping.mode' = 'name'",
     "columnMapping"),
])
def test_a_replica_it_cannot_honour_is_refused_before_anything_is_written(spark, tmp_path, ddl, props, reason):
    path = tmp_path / "r"
    _replica(spark, path, ddl, [(1, "a")], props=props, files=1)
    version = load_snapshot(path).version
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    assert reason in (merge.check() or "")
    with pytest.raises(DvUnfit, match=reason):
        merge.merge(_winners(KV, [(UPSERT, 1, "b")]), TxnId("app", 0))
    assert load_snapshot(path).version == version
    assert sorted(os.listdir(path)) == sorted(n for n in os.listdir(path) if not n.startswith(".lakemirror-rows-"))


def test_a_constraint_and_a_not_null_column_are_left_to_spark(spark, tmp_path):
    path = tmp_path / "r"
    _replica(spark, path, "k BIGINT, v STRING NOT NULL", [(1, "a")], files=1)
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    with pytest.raises(DvUnfit, match="NOT NULL column v"):
        merge.merge(_winners(pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.string())]),
                             [(UPSERT, 2, None)]), TxnId("app", 0))
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT positive CHECK (k > 0)")
    assert "CHECK constraints" in (merge.check() or "")
    spark.sql(f"ALTER TABLE delta.`{path}` DROP CONSTRAINT positive")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')")
    assert merge.check() == "the replica has deletion vectors off"
    assert _rows(spark, path) == [(1, "a")]


def test_small_files_and_mostly_deleted_files_are_compacted_without_changing_the_data(spark, tmp_path, monkeypatch):
    """Each batch appends a file; once COMPACT_MIN_FILES are small they are rewritten together, and a
    file with half its rows deleted is rewritten without them. The compaction commits change no
    data (a stream over the replica skips them), and Spark reads the model throughout."""
    monkeypatch.setattr(dv_compaction, "COMPACT_MIN_FILES", 4)
    path = tmp_path / "r"
    model = {k: "a" for k in range(100)}
    _replica(spark, path, rows=sorted(model.items()), files=1)
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    for batch in range(2):
        merge.merge(_winners(KV, [(UPSERT, 1000 + batch, "new")]), TxnId("app", batch))
        model[1000 + batch] = "new"
    assert len(load_snapshot(path).files) == 3  # the original file and two of the batches'
    merge.merge(_winners(KV, [(UPSERT, 1002, "new"), (DELETE, 0, None)]), TxnId("app", 3))
    model[1002] = "new"
    del model[0]
    files = list(load_snapshot(path).files.values())
    assert len(files) == 1 and not files[0].get("deletionVector"), "all four were small: one file, no vector"
    assert _rows(spark, path) == sorted(model.items())
    deletes = [(DELETE, k, None) for k in range(1, 60)]
    merge.merge(_winners(KV, deletes), TxnId("app", 4))
    for k in range(1, 60):
        del model[k]
    files = list(load_snapshot(path).files.values())
    assert len(files) == 1 and not files[0].get("deletionVector"), "more than half deleted: purged"
    assert _rows(spark, path) == sorted(model.items())
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert [h["operation"] for h in history[:2]] == ["OPTIMIZE", "MERGE"]
    optimize = [json.loads(line) for line in (path / "_delta_log" / commit_file_name(history[0]["version"]))
                .read_text().splitlines()]
    assert all(a[k]["dataChange"] is False for a in optimize for k in ("add", "remove") if k in a)
    changes = spark.read.format("delta").option("readChangeFeed", "false").load(str(path))
    assert changes.count() == len(model)


def test_files_whose_statistics_rule_out_the_batch_are_not_read(spark, tmp_path, monkeypatch):
    path = tmp_path / "r"
    _replica(spark, path)
    for low in (0, 1000, 2000):  # three files of disjoint key ranges
        spark.range(low, low + 100).selectExpr("id AS k", "'a' AS v").write.format("delta").mode("append").save(str(path))
    read: list[str] = []
    real = dv_merge.pq.ParquetFile

    def counting(p: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(Path(p).name)
        return real(p, *args, **kwargs)

    monkeypatch.setattr(dv_merge.pq, "ParquetFile", counting)
    merge = DeletionVectorMerge(str(path), ["k"], ["k", "v"])
    counts = merge.merge(_winners(KV, [(UPSERT, 1050, "b"), (DELETE, 1060, None), (UPSERT, 1500, "new")]),
                         TxnId("app", 0))
    assert (counts.inserted, counts.updated, counts.deleted) == (1, 1, 1)
    assert len(read) == 1, read
    expected = sorted([(k, "a") for r in (0, 1000, 2000) for k in range(r, r + 100) if k not in (1050, 1060)]
                      + [(1050, "b"), (1500, "new")])
    assert _rows(spark, path) == expected
