"""Unity Catalog tags copied across metastores through databricks-sdk's ``entity_tag_assignments``, against
two fake workspaces that accept only requests valid for the SDK's models: names remapped, idempotent,
one failed object never stopping the others, system-assigned tags left alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import pytest

from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.metadata_sync import TAG_TYPES
from lakemirror.sinks.batch.uc_tags import CrossMetastoreMetadata, SdkTags, TagPlan, TagsFailed, TagsRefused, plan_tags
from tests.unit.databricks_workspace_fake import FakeWorkspace

SRC, DST = TableName("prod", "sales", "orders"), TableName("dr", "sales_dr", "orders")


def tag(entity_type: str, name: str, key: str, value: str | None, **extra: Any) -> dict[str, Any]:
    return {"entity_type": entity_type, "entity_name": name, "tag_key": key,
            **({"tag_value": value} if value is not None else {}), **extra}


def test_plan_tags_adds_missing_keys_and_replaces_values_only_with_overwrite() -> None:
    source = {"pii": "email", "owner": "sales", "flag": None}
    target = {"owner": "old", "extra": "kept"}
    assert plan_tags(source, target, True) == TagPlan(create=(("flag", None), ("pii", "email")),
                                                      update=(("owner", "sales"),))
    assert plan_tags(source, target, False) == TagPlan(create=(("flag", None), ("pii", "email")))
    assert plan_tags({"k": None}, {"k": ""}, True) == TagPlan()  # a key without a value is the same either way
    assert plan_tags(source, {**source}, True) == TagPlan()


def seed(src: FakeWorkspace, dst: FakeWorkspace) -> None:
    for ws, (cat, sch) in ((src, ("prod", "sales")), (dst, ("dr", "sales_dr"))):
        ws.catalogs[cat] = {"name": cat}
        ws.schemas[f"{cat}.{sch}"] = {"name": sch, "catalog_name": cat, "full_name": f"{cat}.{sch}"}
        ws.tables[f"{cat}.{sch}.orders"] = {
            "name": "orders", "catalog_name": cat, "schema_name": sch, "full_name": f"{cat}.{sch}.orders",
            "table_type": "MANAGED", "columns": [{"name": "id" if ws is src else "ID"}, {"name": "email"}]
            + ([{"name": "only_in_source"}] if ws is src else [])}
    for v in ("landing", "archive"):
        src.volumes[f"prod.sales.{v}"] = {"name": v, "catalog_name": "prod", "schema_name": "sales",
                                          "full_name": f"prod.sales.{v}", "volume_type": "MANAGED"}
    dst.volumes["dr.sales_dr.landing"] = {"name": "landing", "catalog_name": "dr", "schema_name": "sales_dr",
                                          "full_name": "dr.sales_dr.landing", "volume_type": "MANAGED"}
    src.tags[("catalogs", "prod")] = {"env": tag("catalogs", "prod", "env", "production")}
    src.tags[("schemas", "prod.sales")] = {"domain": tag("schemas", "prod.sales", "domain", "sales")}
    src.tags[("tables", "prod.sales.orders")] = {
        "certified": tag("tables", "prod.sales.orders", "certified", None),
        "owner": tag("tables", "prod.sales.orders", "owner", "sales-team"),
        "class.email_address": tag("tables", "prod.sales.orders", "class.email_address", "true",
                                   source_type="TAG_ASSIGNMENT_SOURCE_TYPE_SYSTEM_DATA_CLASSIFICATION")}
    src.tags[("columns", "prod.sales.orders.id")] = {"key": tag("columns", "prod.sales.orders.id", "key", "primary")}
    src.tags[("columns", "prod.sales.orders.email")] = {"pii": tag("columns", "prod.sales.orders.email", "pii", "email")}
    src.tags[("columns", "prod.sales.orders.only_in_source")] = {"x": tag("columns", "x", "x", "y")}
    src.tags[("volumes", "prod.sales.landing")] = {"zone": tag("volumes", "prod.sales.landing", "zone", "raw")}
    src.tags[("volumes", "prod.sales.archive")] = {"zone": tag("volumes", "prod.sales.archive", "zone", "cold")}
    dst.tags[("tables", "dr.sales_dr.orders")] = {"owner": tag("tables", "dr.sales_dr.orders", "owner", "dr-team"),
                                                  "local": tag("tables", "dr.sales_dr.orders", "local", "kept")}


@pytest.fixture
def pair() -> Iterator[tuple[FakeWorkspace, FakeWorkspace]]:
    src, dst = FakeWorkspace("aws:1:src", name="src"), FakeWorkspace("azure:2:dst", name="dst")
    seed(src, dst)
    with src, dst:
        yield src, dst
    assert src.rejected == [] and dst.rejected == []


def values(ws: FakeWorkspace, entity_type: str, name: str) -> dict[str, Any]:
    return {k: t.get("tag_value") for k, t in ws.tags.get((entity_type, name), {}).items()}


def test_every_level_copied_remapped_then_a_second_run_changes_nothing(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = pair
    tags = SdkTags(src.client(), dst.client())
    out = tags.sync_table(SRC, DST, TAG_TYPES, overwrite=True)
    assert values(dst, "catalogs", "dr") == {"env": "production"}
    assert values(dst, "schemas", "dr.sales_dr") == {"domain": "sales"}
    # a key without a value arrives as one; a value the target differs in is replaced; the target's own
    # tags stay; a tag the system assigned (data classification) is not copied
    assert values(dst, "tables", "dr.sales_dr.orders") == {"certified": None, "owner": "sales-team", "local": "kept"}
    assert values(dst, "columns", "dr.sales_dr.orders.ID") == {"key": "primary"}  # columns matched ignoring case
    assert values(dst, "columns", "dr.sales_dr.orders.email") == {"pii": "email"}
    assert values(dst, "volumes", "dr.sales_dr.landing") == {"zone": "raw"}
    assert out["tags_updated"] == ["tables dr.sales_dr.orders: owner"]
    assert "columns dr.sales_dr.orders.email: pii" in out["tags_created"]
    assert out["tags_skipped"] == ["volumes dr.sales_dr.archive (the target does not have it)"]
    before = dst.mutations()
    again = tags.sync_table(SRC, DST, TAG_TYPES, overwrite=True)
    assert dst.mutations() == before and again["tags_created"] == again["tags_updated"] == []


def test_without_overwrite_only_missing_keys_are_added(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = pair
    SdkTags(src.client(), dst.client()).sync_table(SRC, DST, ["table_tag"], overwrite=False)
    assert values(dst, "tables", "dr.sales_dr.orders") == {"certified": None, "owner": "dr-team", "local": "kept"}
    assert ("catalogs", "dr") not in dst.tags  # only the kinds asked for


def test_one_failed_object_never_stops_the_others_and_is_named(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = pair
    dst.fail_next[("POST", "/api/2.1/unity-catalog/entity-tag-assignments")] = 1  # the catalog's tag, first
    with pytest.raises(TagsFailed) as caught:
        SdkTags(src.client(), dst.client()).sync_table(SRC, DST, TAG_TYPES, overwrite=True)
    assert "catalogs dr" in str(caught.value) and "1 object(s)" in str(caught.value)
    assert caught.value.details["tags_failed"][0].startswith("catalogs dr:")
    assert values(dst, "schemas", "dr.sales_dr") == {"domain": "sales"}  # the later ones were copied
    assert values(dst, "volumes", "dr.sales_dr.landing") == {"zone": "raw"}
    SdkTags(src.client(), dst.client()).sync_table(SRC, DST, TAG_TYPES, overwrite=True)  # the retry completes it
    assert values(dst, "catalogs", "dr") == {"env": "production"}


def test_terminal_failures_are_not_retried_and_a_concurrent_assignment_is_no_failure(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = pair
    del dst.catalogs["dr"]  # a catalog missing on the target: named, not retried
    dst.tags[("schemas", "dr.sales_dr")] = {"domain": tag("schemas", "dr.sales_dr", "domain", "x")}
    with pytest.raises(TagsRefused, match="catalogs dr is not on the target"):
        SdkTags(src.client(), dst.client()).sync_table(SRC, DST, ["catalog_tag"], overwrite=True)
    # a tag assigned between the read and the create (the job of another table of the schema, running at
    # the same time, or by hand) is not an error: its value is brought to the source's
    tags = SdkTags(src.client(), dst.client())
    original = tags._read

    def stale(client: Any, entity_type: str, name: str) -> Any:
        return {} if client is tags.target and entity_type == "schemas" else original(client, entity_type, name)

    tags._read = stale  # type: ignore[method-assign]
    out = tags.sync_table(SRC, DST, ["schema_tag"], overwrite=True)
    assert out["tags_updated"] == ["schemas dr.sales_dr: domain"] and values(dst, "schemas", "dr.sales_dr") == {
        "domain": "sales"}
    dst.tags[("schemas", "dr.sales_dr")]["domain"]["tag_value"] = "x"
    assert tags.sync_table(SRC, DST, ["schema_tag"], overwrite=False)["tags_updated"] == []
    assert values(dst, "schemas", "dr.sales_dr") == {"domain": "x"}
    dst.fail_next.clear()
    original_handle = dst.handle

    def denied(method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        if method == "POST":
            return 403, {"error_code": "PERMISSION_DENIED", "message": "no APPLY TAG"}
        return original_handle(method, path, query, body)

    dst.server.dynamic = denied
    with pytest.raises(TagsRefused, match="APPLY_TAG on each object"):
        SdkTags(src.client(), dst.client()).sync_table(SRC, DST, ["table_tag"], overwrite=True)


@dataclass
class Job:
    source: TableName
    target: TableName
    settings: Any


@dataclass(frozen=True)
class Settings:
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    keys: tuple[str, ...] = ()


class RecordingBase:
    def __init__(self) -> None:
        self.calls: list[tuple[str, TableName, list[str]]] = []

    def run(self, operation: str, job: Any, tag: str) -> Mapping[str, Any]:
        self.calls.append((operation, job.source, list(job.settings.options["metadata"]["object_types"])))
        return {"statements": 2}

    def cancel(self, tag: str) -> None:
        pass


def test_the_metadata_operation_reads_tags_under_the_source_names_and_the_rest_from_the_share(
        pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    from dataclasses import replace

    src, dst = pair
    base = RecordingBase()
    op = CrossMetastoreMetadata(base, lambda: SdkTags(src.client(), dst.client()), {"prod_shared": "prod"})
    settings = Settings({"metadata": {"object_types": ["table_comment", "table_tag", "column_tag"],
                                      "overwrite_tags": False}})
    job = Job(TableName("prod_shared", "sales", "orders"), DST, settings)
    out = op.run("metadata", job, "t1")  # type: ignore[arg-type]
    assert base.calls == [("metadata", TableName("prod_shared", "sales", "orders"), ["table_comment"])]
    assert out["statements"] == 2 and "tables dr.sales_dr.orders: certified" in out["tags_created"]
    assert values(dst, "tables", "dr.sales_dr.orders")["owner"] == "dr-team"  # overwrite_tags: false
    assert values(dst, "columns", "dr.sales_dr.orders.email") == {"pii": "email"}
    only_tags = replace(job, settings=Settings({"metadata": {"object_types": ["catalog_tag"]}}))
    op.run("metadata", only_tags, "t2")  # type: ignore[arg-type]
    assert len(base.calls) == 1 and values(dst, "catalogs", "dr") == {"env": "production"}


def test_the_fake_refuses_a_tag_request_the_sdk_models_do_not_allow() -> None:
    from databricks.sdk.errors import BadRequest

    with FakeWorkspace(name="w") as ws:
        ws.catalogs["c"] = {"name": "c"}
        client = ws.client()
        with pytest.raises(BadRequest, match="update_mask"):
            client.api_client.do("PATCH", "/api/2.1/unity-catalog/entity-tag-assignments/catalogs/c/tags/k",
                                 body={"entity_type": "catalogs", "entity_name": "c", "tag_key": "k"})
        with pytest.raises(BadRequest, match="tag_assignment.entity_type: required"):
            client.api_client.do("POST", "/api/2.1/unity-catalog/entity-tag-assignments",
                                 body={"entity_name": "c", "tag_key": "k"})
        with pytest.raises(BadRequest, match="unknown field"):
            client.api_client.do("POST", "/api/2.1/unity-catalog/entity-tag-assignments",
                                 body={"entity_type": "catalogs", "entity_name": "c", "tag_key": "k", "value": "v"})
        assert len(ws.rejected) == 3


def test_a_replicate_run_across_metastores_copies_the_tags_and_audits_each_table(
        pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    import io

    from lakemirror.checkpoints.audit import InMemoryAuditLog
    from lakemirror.daemon.context import ReplicateContext
    from lakemirror.daemon.settings.replicate import load_replicate_config
    from lakemirror.sinks.sql import RecordingSql
    from lakemirror.sources.catalog import InMemoryDiscovery
    from tests.unit.test_streaming_tables import FakeSession

    src, dst = pair
    src.link(dst)  # the tables are read from the catalog made from the share: prod_shared
    src.tables["prod.sales.lines"] = {"name": "lines", "catalog_name": "prod", "schema_name": "sales",
                                      "full_name": "prod.sales.lines", "table_type": "MANAGED"}
    src.tags[("tables", "prod.sales.lines")] = {"owner": tag("tables", "prod.sales.lines", "owner", "x")}
    config = load_replicate_config(None, data={
        "runtime": {"mode": "databricks"}, "operations": ["metadata"], "retry": {"max_attempts": 1},
        "metadata": {"object_types": ["catalog_tag", "table_tag", "column_tag"]},
        "workspaces": {"source": {"host": src.server.host, "token": "x"},
                       "target": {"host": dst.server.host, "token": "x"}},
        "delta_sharing": {"recipient": "dr_recipient"},
        "catalogs": [{"name": "prod", "target_catalog": "dr",
                      "schemas": [{"name": "sales", "target_schema": "sales_dr"}]}]})
    audit = InMemoryAuditLog()
    summary = ReplicateContext(config, out=io.StringIO()).replace(
        spark=FakeSession(RecordingSql({})), audit=audit, execution_user="me",
        discovery=InMemoryDiscovery({"prod_shared": {"sales": ["orders", "lines"]}})).run()
    rows = {r.object_name: r for r in audit.records}
    assert rows["lakemirror_prod"].status == "success" and dst.catalogs["prod_shared"]["share_name"] == "lakemirror_prod"
    assert rows["orders"].status == "success" and rows["orders"].operation_type == "uc_replication"
    assert values(dst, "tables", "dr.sales_dr.orders")["owner"] == "sales-team"
    assert values(dst, "catalogs", "dr") == {"env": "production"}
    # the replica of lines is missing on the target: its tags fail, named, and the other table's did not stop
    assert rows["lines"].status == "failed" and "dr.sales_dr.lines" in str(rows["lines"].error_message)
    assert [o.job.source.table for o in summary.failed] == ["lines"]
