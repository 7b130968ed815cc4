"""Views across metastores: listed by the source workspace's ``tables.list`` (databricks-sdk, against a fake
workspace that accepts only requests valid for the SDK's models), definitions rewritten to the target's
names, created level by level; a view reading an object the target lacks, or a view that failed, is
reported by name and the others are created."""

from __future__ import annotations

import io
from typing import Any, Iterator

import pytest

from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.uc_views import ViewDef, views_from_sdk
from tests.unit.databricks_workspace_fake import FakeWorkspace


def table(schema: str, name: str, kind: str, definition: str | None = None, comment: str | None = None) -> dict[str, Any]:
    return {"name": name, "catalog_name": "prod", "schema_name": schema, "full_name": f"prod.{schema}.{name}",
            "table_type": kind, **({"view_definition": definition} if definition else {}),
            **({"comment": comment} if comment else {})}


@pytest.fixture
def pair() -> Iterator[tuple[FakeWorkspace, FakeWorkspace]]:
    src, dst = FakeWorkspace("aws:1:src", name="src"), FakeWorkspace("aws:2:dst", name="dst")
    src.catalogs["prod"] = {"name": "prod"}
    for s in ("sales", "reports", "empty"):
        src.schemas[f"prod.{s}"] = {"name": s, "catalog_name": "prod", "full_name": f"prod.{s}"}
    for t in (table("sales", "orders", "MANAGED"),
              table("sales", "v1", "VIEW", "SELECT * FROM prod.sales.orders WHERE note <> 'prod.sales.x'", "base"),
              table("sales", "v2", "VIEW", "SELECT count(*) AS n FROM v1"),
              table("sales", "daily", "MATERIALIZED_VIEW", "SELECT 1"),
              table("sales", "bad", "VIEW", "SELECT * FROM prod.sales.nowhere"),
              table("sales", "bad_child", "VIEW", "SELECT * FROM bad"),
              table("reports", "r1", "VIEW", "SELECT n FROM prod.sales.v2")):
        src.tables[t["full_name"]] = t
    src.link(dst)
    with src, dst:
        yield src, dst
    assert src.rejected == [] and dst.rejected == []


def _views_config(src: Any, dst: Any, max_attempts: int) -> Any:
    """``lakemirror replicate`` of catalog prod's views into dr, across two fake workspaces."""
    from lakemirror.daemon.settings.replicate import load_replicate_config

    return load_replicate_config(None, data={
        "runtime": {"mode": "databricks"}, "operations": ["uc_objects"], "retry": {"max_attempts": max_attempts},
        "workspaces": {"source": {"host": src.server.host, "token": "x"},
                       "target": {"host": dst.server.host, "token": "x"}},
        "delta_sharing": {"recipient": "dr_recipient"},
        "uc_objects": {"object_types": ["view"]},
        "catalogs": [{"name": "prod", "target_catalog": "dr"}]})

def test_views_from_sdk_lists_only_views_with_their_definitions(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, _ = pair
    views = views_from_sdk(src.client(), "prod", "sales")
    assert sorted(v.name.table for v in views) == ["bad", "bad_child", "v1", "v2"]  # no table, no materialized view
    v1 = next(v for v in views if v.name.table == "v1")
    assert v1 == ViewDef(TableName("prod", "sales", "v1"),
                         "SELECT * FROM prod.sales.orders WHERE note <> 'prod.sales.x'", "base")
    assert views_from_sdk(src.client(), "prod", "empty") == []


def test_a_missing_schema_is_an_error_naming_it(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    from lakemirror.errors import LakemirrorError

    src, _ = pair
    with pytest.raises(LakemirrorError, match="tables of gone.sales"):
        views_from_sdk(src.client(), "gone", "sales")


def test_replicate_across_metastores_creates_the_sdk_views_rewritten_in_order(
        pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    from lakemirror.checkpoints.audit import InMemoryAuditLog
    from lakemirror.daemon.context import ReplicateContext
    from lakemirror.sinks.sql import RecordingSql
    from lakemirror.sources.catalog import InMemoryDiscovery
    from tests.unit.test_streaming_tables import FakeSession

    src, dst = pair

    def create(stmt: str) -> list[dict[str, Any]]:
        if "nowhere" in stmt:
            raise RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] The table or view `dr`.`sales`.`nowhere` cannot be found.")
        return []

    sql = RecordingSql({"CREATE OR REPLACE VIEW": create})
    config = _views_config(src, dst, max_attempts=2)
    audit = InMemoryAuditLog()
    summary = ReplicateContext(config, out=io.StringIO()).replace(
        spark=FakeSession(sql), audit=audit, execution_user="me", sleep=lambda s: None,
        discovery=InMemoryDiscovery({"prod_shared": {"sales": ["orders"], "reports": [], "empty": []}})).run()
    views = [(r.object_name, r.status, r.error_message) for r in audit.records if r.object_type == "view"]
    status = {n: s for n, s, _ in views}
    assert status == {"v1": "success", "v2": "success", "r1": "success", "bad": "failed", "bad_child": "failed"}
    errors = {n: e for n, s, e in views if s == "failed"}
    assert "reads `dr`.`sales`.`nowhere`, which the target does not have" in str(errors["bad"])
    assert "reads prod.sales.bad, which could not be created" in str(errors["bad_child"])
    assert sum(1 for n, _, _ in views if n == "bad") == 1  # a missing object is not retried
    creates = [s for s in sql.statements if s.startswith("CREATE OR REPLACE VIEW")]
    assert creates.index("CREATE OR REPLACE VIEW `dr`.`sales`.`v1` COMMENT 'base' AS SELECT * FROM dr.sales.orders "
                         "WHERE note <> 'prod.sales.x'") < creates.index(
        "CREATE OR REPLACE VIEW `dr`.`sales`.`v2` AS SELECT count(*) AS n FROM v1") < creates.index(
        "CREATE OR REPLACE VIEW `dr`.`reports`.`r1` AS SELECT n FROM dr.sales.v2")
    assert not any("bad_child" in s for s in creates)  # refused before any SQL
    assert not summary.ok and sorted(o.job.target.table for o in summary.failed) == ["bad", "bad_child"]
    listed = [p for m, p, _ in src.calls if m == "GET" and p.endswith("/tables")]
    assert len(listed) == 3  # one tables.list per schema: the views came from the source workspace


def test_a_schema_whose_views_cannot_be_listed_fails_named_and_the_others_are_created(
        pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    from lakemirror.checkpoints.audit import InMemoryAuditLog
    from lakemirror.daemon.context import ReplicateContext
    from lakemirror.sinks.sql import RecordingSql
    from lakemirror.sources.catalog import InMemoryDiscovery
    from tests.unit.test_streaming_tables import FakeSession

    src, dst = pair
    for name in ("bad", "bad_child"):
        del src.tables[f"prod.sales.{name}"]
    original = src.handle  # the principal may not read prod.reports

    def handle(method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        if method == "GET" and path.endswith("/tables") and query.get("schema_name") == ["reports"]:
            return 403, {"error_code": "PERMISSION_DENIED", "message": "no USE SCHEMA on prod.reports"}
        return original(method, path, query, body)

    src.server.dynamic = handle
    sql = RecordingSql({})
    config = _views_config(src, dst, max_attempts=1)
    audit = InMemoryAuditLog()
    summary = ReplicateContext(config, out=io.StringIO()).replace(
        spark=FakeSession(sql), audit=audit, execution_user="me",
        discovery=InMemoryDiscovery({"prod_shared": {"sales": ["orders"]}})).run()
    rows = [(r.schema_name, r.object_name, r.status, r.error_message) for r in audit.records if r.object_type == "view"]
    failed = [r for r in rows if r[2] == "failed"]
    assert len(failed) == 1 and failed[0][:3] == ("reports", "*", "failed")
    assert "the views of prod.reports could not be read" in str(failed[0][3]) and "permission denied" in str(failed[0][3])
    assert sorted(r[1] for r in rows if r[2] == "success") == ["v1", "v2"]
    assert [o.job.source for o in summary.failed] == [TableName("prod", "reports", "*")]
