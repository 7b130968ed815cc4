"""Source tables and their writer, driven with delta-rs (no JVM in the benchmark's own process).

Every table has ``rows`` rows (id BIGINT, v BIGINT, payload STRING) with the Change Data Feed on.
One writer step is one MERGE per table touching ``change_fraction`` of its rows: mostly updates,
some deletes and inserts of new ids, so the feed carries all three kinds of change.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake

CDF = {"delta.enableChangeDataFeed": "true"}


def same_rows(a: Path | str, b: Path | str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Row-for-row equality of two tables of the benchmark's schema (sorted by id, in Arrow).

    Read through delta-rs's query engine, which honours deletion vectors (its plain Arrow reader
    refuses tables that have them). ``storage_options``: delta-rs's, for tables on object storage."""
    def rows(p: Path | str) -> pa.Table:
        table = DeltaTable(str(p), storage_options=dict(storage_options or {}))
        reader = QueryBuilder().register("t", table).execute("SELECT id, v, payload FROM t ORDER BY id")
        table = pa.table(reader.read_all())
        return table.cast(pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.int64()),
                                     pa.field("payload", pa.string())]))
    return bool(rows(a).equals(rows(b)))


def table_path(warehouse: Path, catalog: str, schema: str, table: str) -> Path:
    return warehouse / catalog / schema / table


@dataclass
class SourceTable:
    path: Path | str  # a local path, or a URI delta-rs reads with ``storage_options`` (s3://bucket/...)
    rows: int
    next_id: int = 0
    live: list[int] = field(default_factory=list)
    commits: dict[int, float] = field(default_factory=dict)  # version -> wall time the commit returned
    storage_options: dict[str, str] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)  # table properties besides the change feed

    def table(self) -> DeltaTable:
        return DeltaTable(str(self.path), storage_options=self.storage_options)

    def commit_stamps(self) -> dict[int, float]:
        """Each version's own commit time (``inCommitTimestamp``, else ``commitInfo.timestamp``), taken by
        its writer just before the commit file was put: the time the daemon prices a commit at, where
        :attr:`commits` holds when the writer's call returned (after the put and any checkpoint)."""
        stamps: dict[int, float] = {}
        for info in self.table().history():
            stamped = info.get("inCommitTimestamp", info.get("timestamp"))
            if isinstance(info.get("version"), int) and isinstance(stamped, int):
                stamps[info["version"]] = stamped / 1000.0
        return stamps

    def initial_rows(self) -> pa.Table:
        ids = pa.array(range(self.rows), pa.int64())
        return pa.table({"id": ids, "v": ids, "payload": pa.array([f"p{i}" for i in range(self.rows)])})

    def create(self) -> None:
        write_deltalake(str(self.path), self.initial_rows(), configuration={**CDF, **self.properties},
                        storage_options=self.storage_options)
        self.next_id = self.rows
        self.live = list(range(self.rows))

    def version(self) -> int:
        return int(self.table().version())

    def append(self, n: int, stamp: int) -> None:
        """One append of ``n`` new ids (a cheap commit: the steady-cost workload's warm-up)."""
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        write_deltalake(str(self.path), pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([stamp] * n, pa.int64()),
                                                  "payload": pa.array([f"a{stamp}"] * n)}), mode="append",
                        storage_options=self.storage_options)
        self.commits[self.version()] = time.time()
        self.live.extend(ids)  # new ids are above every live one: still sorted

    def change(self, rng: random.Random, fraction: float, stamp: int) -> int:
        """One MERGE changing about ``fraction`` of the rows; returns the number of change rows.

        The changes are drawn the same way whichever engine writes them (:meth:`merge`), so a
        Spark-written source (bench/spark_writer.py) gets the same changes as this one."""
        n = max(3, int(self.rows * fraction))
        touched = rng.sample(self.live, min(len(self.live), n))
        deletes = set(touched[: n // 10])
        updates = touched[n // 10:]
        inserts = list(range(self.next_id, self.next_id + n // 10))
        self.next_id += len(inserts)
        ids = [*deletes, *updates, *inserts]
        ops = ["d"] * len(deletes) + ["u"] * len(updates) + ["i"] * len(inserts)
        source = pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([stamp] * len(ids), pa.int64()),
                           "payload": pa.array([f"s{stamp}"] * len(ids)), "op": pa.array(ops)})
        self.merge(source)
        returned = time.time()  # the commit's time: when the writer's MERGE returned
        self.commits[self.version()] = returned
        live = set(self.live) - deletes
        live.update(inserts)
        self.live = sorted(live)
        return len(ids)

    def merge(self, source: pa.Table) -> None:
        """One commit applying ``source`` (``id``, ``v``, ``payload``, ``op`` of d/u/i), by delta-rs."""
        (self.table().merge(source, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_delete(predicate="s.op = 'd'")
         .when_matched_update(updates={"v": "s.v", "payload": "s.payload"}, predicate="s.op = 'u'")
         .when_not_matched_insert(updates={"id": "s.id", "v": "s.v", "payload": "s.payload"}, predicate="s.op = 'i'")
         .execute())
