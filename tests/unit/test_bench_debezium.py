"""The Debezium benchmark's workload has the disorder it claims, and its reference fold is right."""

from __future__ import annotations

from collections import Counter

from bench.debezium_events import expected, workload


def test_the_workload_has_same_millisecond_changes_of_one_key_and_tombstones() -> None:
    events = list(workload(3000, seed=1))
    values = [v for _, _, _, v in events if v is not None]
    assert len(values) == 3000 and sum(1 for *_, v in events if v is None) == Counter(v["op"] for v in values)["d"]
    per_key_ms = Counter((v["source"]["table"], (v["after"] or v["before"])["id"], v["source"]["ts_ms"]) for v in values)
    assert max(per_key_ms.values()) >= 2  # a timestamp cannot order these
    lsns = [v["source"]["lsn"] for v in values]
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)


def test_the_reference_fold_ignores_redeliveries_and_applies_in_log_order() -> None:
    events = list(workload(500, seed=2))
    replayed = events + events[100:200]  # a range delivered again after newer ones
    want = expected(replayed)
    assert want == expected(events)
    table = events[0][2]["id"], events[0][3]["source"]["table"]
    last = [v for _, _, k, v in events if v is not None and k["id"] == table[0] and v["source"]["table"] == table[1]][-1]
    assert want[table[1]].get(table[0]) == (None if last["op"] == "d" else last["after"])
