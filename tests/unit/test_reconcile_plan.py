"""The pure reconciliation planner: encodings, bucket logic, classification."""

from __future__ import annotations

import pytest

from lakemirror.schema import Column
from lakemirror.sinks.batch.reconcile_plan import (
    DIFFERENT, EXTRA, MISSING, KeyDigest, ReconcileResult, classify, differing_buckets,
    json_encoding_sql, plan_reconcile,
)
from lakemirror.sinks.merge.planner import SchemaDiff

SRC = [Column("id", "bigint", False), Column("Name", "string"), Column("amt", "decimal(10,2)")]


def test_encoding_sorts_lowercases_and_keeps_nulls():
    sql = json_encoding_sql(["b", "A`x"])
    assert sql.startswith("to_json(named_struct('a`x', `A``x`, 'b', `b`)")
    assert "'ignoreNullFields', 'false'" in sql
    assert "SSSSSS" in sql  # microsecond timestamps, not JSON's default milliseconds


def test_plan_is_the_same_sql_for_both_sides_whatever_the_column_order_or_case():
    a = plan_reconcile(SRC, [Column("amt", "decimal(10,2)"), Column("name", "string"), Column("ID", "bigint")], ["id"])
    b = plan_reconcile(SRC, SRC, ["ID"])
    assert a.row_sql == b.row_sql and a.key_sql == b.key_sql and a.bucket_sql == b.bucket_sql
    assert a.keys == ("id",) and a.compared == ("id", "Name", "amt")
    assert a.schema.is_empty


def test_schema_diff_and_columns_compared():
    plan = plan_reconcile(SRC + [Column("new", "int")], [Column("id", "bigint"), Column("name", "int")], ["id"],
                          exclude=["amt"])
    assert plan.compared == ("id", "Name")
    assert [c.name for c in plan.schema.added] == ["new"]
    assert plan.schema.retyped == (("Name", "int", "string"),) and not plan.schema.is_additive


@pytest.mark.parametrize("bad", [dict(keys=[]), dict(keys=["nope"]), dict(keys=["id"], buckets=0),
                                 dict(keys=["id"], exclude=["id"])])
def test_plan_rejects(bad):
    keys = bad.pop("keys")
    with pytest.raises(ValueError):
        plan_reconcile(SRC, SRC, keys, **bad)


def test_bucket_filter_and_bounds():
    plan = plan_reconcile(SRC, SRC, ["id"], buckets=8)
    assert plan.in_buckets_sql([3, 1, 3]) == "`__lm_bucket` IN (1, 3)"
    assert plan.in_buckets_sql([]) == "false"
    with pytest.raises(ValueError):
        plan.in_buckets_sql([8])


def test_differing_buckets_counts_absent_as_empty():
    s = {0: (2, 5, 9), 1: (1, 1, 1), 2: (1, 7, 7)}
    r = {0: (2, 5, 9), 1: (1, 1, 2), 3: (1, 0, 0)}
    assert differing_buckets(s, r) == [1, 2, 3]
    assert differing_buckets(s, dict(s)) == []


def test_classify():
    one = KeyDigest(1, 5, 6)
    assert classify(one, None) == MISSING
    assert classify(None, one) == EXTRA
    assert classify(one, KeyDigest(1, 5, 7)) == DIFFERENT
    assert classify(one, KeyDigest(2, 5, 6)) == DIFFERENT  # a key duplicated in the replica
    assert classify(one, KeyDigest(1, 5, 6)) is None


def test_result_status_and_metric_samples():
    base = dict(source="a", replica="b", source_version=3, source_rows=10, replica_rows=10,
                schema=SchemaDiff(), buckets=8, buckets_differing=0, missing=0, extra=0, different=0)
    assert ReconcileResult(**base).status == "equal"
    r = ReconcileResult(**{**base, "missing": 2, "different": 1})
    assert r.status == "different" and r.mismatched_keys == 3
    assert r.metric_samples() == {"missing": 2, "extra": 0, "different": 1}
    breaking = ReconcileResult(**{**base, "schema": SchemaDiff(dropped=("x",))})
    assert breaking.status == "schema_breaking" and not breaking.equal
