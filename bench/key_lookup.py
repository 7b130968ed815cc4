"""Finding a batch's changed keys in one replica file, per kind of key: the deletion-vector apply's
share of a steady cycle that grows with the replica (:mod:`lakemirror.sinks.accelerator.dv_merge`).

For each kind, a file of ``rows`` rows and a batch of 2.2% of that many distinct keys, half of
them in the file (a 1% change of a table twice the file's size, as the steady-cost replica's two
files have it); the file's keys are kept as the apply keeps them (direct, sorted, encoded or
hashed), and side by side with the row-by-row lookup every layout replaced (one hash-set probe
per row of the file, every batch). Each lookup starts from the batch's raw keys (its hashing or
sorting included). Pure Python: no Spark, no files.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from lakemirror.sinks.accelerator.composite_keys import CompositeKeys
from lakemirror.sinks.accelerator.hashed_keys import HashedKeys
from lakemirror.sinks.accelerator.key_match import FileKeys, KeptKeys, KeyLookup, key_probe


def _kinds(rows: int, rng: np.random.Generator) -> dict[str, pa.Table]:
    """Each kind's file keys, in row order."""
    ids = rng.permutation(2 * rows)[:rows]  # a bootstrap's file: ids interleaved over twice its rows
    words = rng.integers(0, 2**63, size=(rows, 2))
    uuids = pa.array([f"{a:016x}-{b:016x}" for a, b in words.tolist()])
    region = pa.array(np.where(rng.random(rows) < 0.01, None, rng.choice(np.array(["eu", "us", "ap", "sa"]), rows)).tolist(),
                      pa.string())
    return {
        "one integer (id)": pa.table({"id": pa.array(ids)}),
        "one integer, sparse (ids over 100x the rows)": pa.table({"id": pa.array(ids * 50 + rng.integers(0, 50, rows))}),
        "two integers (tenant, id)": pa.table({"tenant": pa.array(ids % 97), "id": pa.array(ids)}),
        "UUID string": pa.table({"uuid": uuids}),
        "string and integer, 1% NULL regions (region, id)": pa.table({"region": region, "id": pa.array(ids)}),
    }


def _batch(keys: pa.Table, rng: np.random.Generator) -> pa.Table:
    """2.2% of the file's rows in distinct keys: half of them the file's, half not (the file's keys
    with their last part moved out of the file's range)."""
    size = max(2, int(keys.num_rows * 0.011))
    present = keys.take(pa.array(rng.choice(keys.num_rows, size, replace=False)))
    absent = keys.take(pa.array(rng.choice(keys.num_rows, size, replace=False)))
    last = absent.column(absent.num_columns - 1).combine_chunks()
    moved = (pa.array([f"{v}+" for v in last.to_pylist()]) if pa.types.is_string(last.type)
             else pa.array(last.to_numpy() + 100 * keys.num_rows))
    absent = absent.set_column(absent.num_columns - 1, absent.schema.field(absent.num_columns - 1), moved)
    return pa.concat_tables([present, absent])


def _kept(keys: pa.Table) -> KeptKeys:
    """``keys`` kept as the apply keeps them (``DeletionVectorMerge._file_keys``)."""
    kept = CompositeKeys.of(keys)
    if kept is None:
        probe = key_probe(keys)
        kept = HashedKeys.of(probe) or FileKeys(probe)
    return kept


def _cpu(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.process_time()
    result = action()
    return time.process_time() - started, result


def key_lookup(rows: int, repeats: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for kind, keys in _kinds(rows, rng).items():
        batch = _batch(keys, rng)
        build_s, kept = _cpu(lambda: _kept(keys))
        file_probe = key_probe(keys)
        kept_ms, row_ms = [], []
        found = expected = None
        for _ in range(repeats):
            seconds, (found, _) = _cpu(lambda: kept.find(KeyLookup(key_probe(batch), batch)))
            kept_ms.append(seconds * 1000)
            seconds, (expected, _) = _cpu(lambda: KeyLookup(key_probe(batch), batch).row_by_row(file_probe))
            row_ms.append(seconds * 1000)
        assert found is not None and expected is not None
        kept_median, row_median = statistics.median(kept_ms), statistics.median(row_ms)
        out.append({"kind": kind, "rows": rows, "batch_keys": batch.num_rows, "layout": getattr(kept, "layout", "?"),
                    "build_cpu_s": round(build_s, 2), "kept_mb": round(kept.nbytes / 1e6, 1),
                    "row_by_row_kept_mb": round(file_probe.nbytes / 1e6, 1),
                    "lookup_cpu_ms": round(kept_median, 1), "row_by_row_cpu_ms": round(row_median, 1),
                    "speedup": round(row_median / kept_median, 1) if kept_median else None,
                    "rows_found": int(len(found)),
                    "same_rows_as_row_by_row": sorted(found.tolist()) == sorted(expected.tolist())})
    return out
