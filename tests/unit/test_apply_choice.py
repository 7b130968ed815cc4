"""The choice between MERGE, a whole-replica rewrite and the driver's delta-rs MERGE (pure; the
executors are tested in integration)."""

from __future__ import annotations

from dataclasses import replace

from lakemirror.sinks.merge.apply_choice import (DEFAULT_DRIVER_APPLY_BELOW_BYTES, DRIVER_BATCH_MAX_ROWS, MERGE,
                                                 ApplyChoice, ReplicaFacts, choose_apply, choose_guarded_apply)

MIB = 1024 * 1024
SMALL = ReplicaFacts(size_bytes=2 * MIB, rows=100_000, columns=("id", "v", "payload"), properties={},
                     observable=True)


def _choose(facts: ReplicaFacts = SMALL, columns: tuple[str, ...] = ("id", "v", "payload"),
            limit: int = 64 * MIB) -> ApplyChoice:
    return choose_apply(facts, columns, limit)


def test_a_small_replica_with_the_batch_columns_is_rewritten() -> None:
    choice = _choose()
    assert choice.rewrite and "rewriting" in choice.reason and "64.0 MiB" in choice.reason
    assert "driver_apply is off" in choice.reason
    assert choice.bytes_per_row == 2 * MIB / 100_000 and choice.limit_bytes == 64 * MIB


def test_column_names_compare_as_spark_resolves_them() -> None:
    assert _choose(columns=("ID", "payload", "V")).rewrite


def test_each_reason_to_merge_is_named() -> None:
    cases = {
        "rewrites are off": _choose(limit=0),
        "larger than rewrite_below_bytes": _choose(ReplicaFacts(65 * MIB, 10**7, SMALL.columns, {}, True)),
        "change data feed of its own": _choose(ReplicaFacts(MIB, 10, SMALL.columns,
                                                            {"delta.enableChangeDataFeed": "TRUE"}, True)),
        "deletion vectors on": _choose(ReplicaFacts(MIB, 10, SMALL.columns,
                                                    {"delta.enableDeletionVectors": "true"}, True)),
        "columns differ": _choose(columns=("id", "v")),
        "Spark Connect": _choose(ReplicaFacts(MIB, 10, SMALL.columns, {}, observable=False)),
        "empty": _choose(ReplicaFacts(0, 0, SMALL.columns, {}, True)),
    }
    for words, choice in cases.items():
        assert not choice.rewrite and words in choice.reason and choice.reason.startswith("applies by MERGE"), words


def test_a_replica_with_an_extra_column_merges() -> None:
    """A MERGE keeps a column it does not set; a rewrite would lose it."""
    facts = ReplicaFacts(MIB, 10, ("id", "v", "payload", "note"), {}, True)
    assert not _choose(facts).rewrite


def test_the_limit_follows_the_rows_a_rewrite_observes() -> None:
    choice = _choose(limit=4 * MIB)  # 2 MiB for 100k rows: about 21 bytes a row
    assert choice.still_small(100_000) and choice.still_small(200_000)
    assert not choice.still_small(200_001)


def test_a_rewrite_writes_one_file_per_16_mib() -> None:
    choice = _choose()
    assert choice.files_for(100_000) == 1
    assert choice.files_for(800_000) == 1           # 16 MiB
    assert choice.files_for(800_001) == 2
    assert choice.files_for(3_200_000) == 4         # 64 MiB, the default limit
    assert choice.files_for(0) == 1


LOCAL = replace(SMALL, local=True, features=("appendOnly", "invariants"), driver_engine=True)


def _drive(facts: ReplicaFacts = LOCAL, columns: tuple[str, ...] = ("id", "v", "payload"),
           key_types: tuple[str, ...] = ("bigint",), on: bool = True) -> ApplyChoice:
    return choose_apply(facts, columns, 64 * MIB, driver_apply=on, key_types=key_types)


def test_a_small_local_replica_is_applied_on_the_driver() -> None:
    choice = _drive()
    assert choice.driver and not choice.rewrite and "delta-rs" in choice.reason
    assert choice.bytes_per_row == 2 * MIB / 100_000
    assert choice.limit_bytes == DEFAULT_DRIVER_APPLY_BELOW_BYTES and choice.rewrite_limit_bytes == 64 * MIB
    assert _drive(key_types=("decimal(10,2)", "string", "timestamp", "date")).driver


def test_each_reason_to_keep_spark_for_a_small_replica_is_named() -> None:
    cases = {
        "driver_apply is off": _drive(on=False),
        "deltalake package is not installed": _drive(replace(LOCAL, driver_engine=False)),
        "not a path on the driver's file system": _drive(replace(LOCAL, local=False)),
        "protocol features are unknown": _drive(replace(LOCAL, features=None)),
        "the driver does not write (columnMapping)": _drive(replace(LOCAL, features=("appendOnly", "columnMapping"))),
        "differ in case": _drive(columns=("ID", "v", "payload")),
        "does not group by (struct<a:int>)": _drive(key_types=("bigint", "struct<a:int>")),
    }
    for words, choice in cases.items():
        assert choice.rewrite and words in choice.reason and "rewriting the replica with Spark" in choice.reason, words


def test_what_keeps_a_rewrite_from_a_replica_keeps_the_driver_from_it_too() -> None:
    """Every reason to MERGE but the replica's size still applies to the driver path."""
    assert _drive(replace(LOCAL, properties={"delta.enableChangeDataFeed": "true"})).path == "merge"
    assert _drive(replace(LOCAL, observable=False)).path == "merge"


def test_a_replica_past_the_rewrite_limit_is_still_merged_on_the_driver_up_to_its_own_limit() -> None:
    large = replace(LOCAL, size_bytes=131 * MIB, rows=10_000_000)   # the steady-cost benchmark's replica
    choice = _drive(large)
    assert choice.driver and "at most 4096.0 MiB (driver_apply_below_bytes)" in choice.reason
    assert choice.still_small(10_000_000) and choice.still_small(300_000_000)
    huge = _drive(replace(LOCAL, size_bytes=5 * 1024 * MIB, rows=10**8))
    assert huge.path == "merge" and "driver_apply_below_bytes (4096.0 MiB)" in huge.reason
    assert "and the replica is not a path" in _drive(replace(large, local=False)).reason
    assert _drive(replace(large, local=False)).path == "merge", "past the rewrite limit, no rewrite"
    assert choose_apply(large, ("id", "v", "payload"), 64 * MIB, driver_apply=True, key_types=("bigint",),
                        driver_apply_below_bytes=100 * MIB).path == "merge"


S3 = replace(LOCAL, local=False, object_store=True)


def test_a_replica_on_s3_the_driver_reaches_is_applied_on_the_driver_by_conditional_puts() -> None:
    choice = _drive(S3)
    assert choice.driver and not choice.deletion_vectors
    assert "on object storage, committed by conditional put (If-None-Match)" in choice.reason
    assert "object storage" not in _drive().reason


def test_what_keeps_a_replica_on_object_storage_with_spark_is_named() -> None:
    """A catalog-managed table, a store without conditional writes: the reason the facts carry is the
    one shown; deletion vectors are written on the driver only for local replicas."""
    managed = replace(LOCAL, local=False, unreachable="the table is managed by its catalog (Unity Catalog)")
    assert "managed by its catalog" in _drive(managed).reason and not _drive(managed).driver
    dv_on_s3 = _drive(replace(DV_ON, local=False, object_store=True))
    assert dv_on_s3.path == "merge" and "deletion vectors are written on the driver only" in dv_on_s3.reason
    assert _drive(replace(S3, observable=False)).path == "merge", "Spark Connect"
    assert _drive(replace(S3, features=("columnMapping",))).path == "rewrite"


def test_a_driver_choice_refused_by_delta_rs_falls_back_to_a_rewrite_only_while_small() -> None:
    small = _drive().without_driver(100_000)
    assert small is not None and small.rewrite and small.limit_bytes == 64 * MIB
    assert _drive(replace(LOCAL, size_bytes=131 * MIB, rows=10_000_000)).without_driver(10_000_000) is None


def test_the_driver_takes_batches_that_fit_its_share_of_memory() -> None:
    assert _drive().driver_batch_rows() == DRIVER_BATCH_MAX_ROWS              # 21 bytes a row: capped
    wide = _drive(replace(LOCAL, size_bytes=50 * MIB, rows=51_200))           # 1 KiB a row
    assert wide.driver_batch_rows() == 512 * 1024 * 1024 // (4 * 1024)
    assert _drive(replace(LOCAL, size_bytes=60 * MIB, rows=10)).driver_batch_rows() == 10_000  # a floor


DV_ON = replace(LOCAL, properties={"delta.enableDeletionVectors": "true"},
                features=("appendOnly", "invariants", "deletionVectors"))


def test_a_replica_with_deletion_vectors_is_applied_on_the_driver_by_deletion_vectors() -> None:
    choice = _drive(DV_ON)
    assert choice.driver and choice.deletion_vectors and "by deletion vectors" in choice.reason
    large = _drive(replace(DV_ON, size_bytes=131 * MIB, rows=10_000_000))
    assert large.driver and large.deletion_vectors
    assert choice.without_driver(10) is None, "refused, it falls back to Spark's MERGE, never to a rewrite"
    assert not _drive().deletion_vectors


def test_what_keeps_deletion_vectors_off_the_driver_is_named_and_means_merge() -> None:
    cases = {
        "(driver_apply is off)": _drive(DV_ON, on=False),
        "the driver does not write (rowTracking)": _drive(replace(DV_ON, features=("deletionVectors", "rowTracking"))),
        "not a path on the driver's file system": _drive(replace(DV_ON, local=False)),
        "change data feed of its own": _drive(replace(DV_ON, properties={**DV_ON.properties,
                                                                        "delta.enableChangeDataFeed": "true"})),
    }
    for words, choice in cases.items():
        assert choice.path == "merge" and words in choice.reason, (words, choice.reason)


def test_an_event_replica_takes_the_driver_only_when_every_condition_holds() -> None:
    ok = dict(driver_apply=True, driver_engine=True, reachable=True, writable=True)
    assert choose_guarded_apply(**ok).driver
    for flag, why in [("driver_apply", "driver_apply is off"), ("driver_engine", "deltalake package"),
                      ("reachable", "does not reach the replica"), ("writable", "protocol features")]:
        choice = choose_guarded_apply(**{**ok, flag: False})
        assert choice.path == MERGE and why in choice.reason, (flag, choice.reason)
