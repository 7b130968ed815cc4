"""Delta Sharing set-up: the pure plan, and the set-up against two fake workspaces that accept only
requests valid for databricks-sdk's models (idempotent, partial set-ups completed, conflicts refused)."""

from __future__ import annotations

from typing import Iterator

import pytest

from lakemirror.errors import TerminalError, TransientError
from lakemirror.sinks.batch.sharing import (
    DeltaSharingSetup, Observed, ProviderNotVisible, SharingConflict, SharingMissing, SharingSpec, plan_sharing,
    schemas_of,
)
from tests.unit.databricks_workspace_fake import FakeWorkspace

SPEC = SharingSpec(recipient="dr", share="lm_prod", source_catalog="prod", schemas=("sales", "hr"),
                   shared_catalog="prod_shared")
FRESH = Observed(source_metastore="aws:a", target_metastore="azure:b")


def test_plan_from_nothing_complete_and_partial() -> None:
    assert [s.action for s in plan_sharing(SPEC, FRESH)] == [
        "create_recipient", "create_share", "add_schemas", "grant", "create_catalog"]
    done = Observed("aws:a", "azure:b", recipient_metastore="azure:b", recipient_exists=True, share_exists=True,
                    shared_objects=frozenset({"prod.sales", "prod.hr"}), granted=True, provider="p",
                    catalog_exists=True, catalog_source=("p", "lm_prod"))
    assert plan_sharing(SPEC, done) == []
    half = Observed("aws:a", "azure:b", recipient_metastore="azure:b", recipient_exists=True, share_exists=True,
                    shared_objects=frozenset({"prod.sales"}))
    steps = plan_sharing(SPEC, half)
    assert [s.action for s in steps] == ["add_schemas", "grant", "create_catalog"]
    assert steps[0].detail["schemas"] == ["prod.hr"]


@pytest.mark.parametrize("seen, says", [
    (Observed("aws:a", "aws:a"), "share the metastore"),
    (Observed("aws:a", "azure:b", recipient_exists=True, recipient_metastore="gcp:c"), "recipient 'dr' exists for"),
    (Observed("aws:a", "azure:b", provider="p", catalog_exists=True, catalog_source=(None, None)),
     "a catalog of its own"),
    (Observed("aws:a", "azure:b", provider="p", catalog_exists=True, catalog_source=("p", "other")), "p/other"),
])
def test_conflicts_are_refused_naming_what_to_change(seen: Observed, says: str) -> None:
    with pytest.raises(SharingConflict, match=says):
        plan_sharing(SPEC, seen)


def test_existing_mode_creates_nothing_and_names_each_missing_part() -> None:
    with pytest.raises(SharingMissing) as caught:
        plan_sharing(SharingSpec(**{**SPEC.__dict__, "mode": "existing"}),
                     Observed("aws:a", "azure:b", recipient_exists=True, recipient_metastore="azure:b",
                              share_exists=True, shared_objects=frozenset({"prod.sales"}), granted=True))
    assert "lacks prod.hr" in str(caught.value) and "no catalog 'prod_shared'" in str(caught.value)
    assert "no recipient" not in str(caught.value)


@pytest.fixture
def workspaces() -> Iterator[tuple[FakeWorkspace, FakeWorkspace]]:
    src, dst = FakeWorkspace("aws:us-west-2:src", name="src"), FakeWorkspace("azure:westeurope:dst", name="dst")
    src.link(dst)
    src.catalogs["prod"] = {"name": "prod"}
    for s in ("sales", "hr", "scratch", "information_schema"):
        src.schemas[f"prod.{s}"] = {"name": s, "catalog_name": "prod", "full_name": f"prod.{s}"}
    with src, dst:
        yield src, dst
    assert src.rejected == [] and dst.rejected == []  # every request was valid for the SDK's models


def test_setup_from_nothing_then_a_second_run_changes_nothing(workspaces: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = workspaces
    setup = DeltaSharingSetup(src.client(), dst.client())
    schemas = schemas_of(src.client(), "prod", lambda s: s != "scratch")
    assert schemas == ("hr", "sales")
    spec = SharingSpec(**{**SPEC.__dict__, "schemas": schemas})
    first = setup.apply(spec)
    assert first["steps"] == ["create_recipient", "create_share", "add_schemas", "grant", "create_catalog"]
    assert src.recipients["dr"]["data_recipient_global_metastore_id"] == "azure:westeurope:dst"
    assert [o["name"] for o in src.shares["lm_prod"]["objects"]] == ["prod.hr", "prod.sales"]
    assert all(o["history_data_sharing_status"] == "ENABLED" for o in src.shares["lm_prod"]["objects"])
    assert dst.catalogs["prod_shared"]["share_name"] == "lm_prod"
    before = src.mutations() + dst.mutations()
    assert setup.apply(spec)["steps"] == []
    assert src.mutations() + dst.mutations() == before  # idempotent: no write at all


def test_a_half_done_setup_is_completed_never_duplicated(workspaces: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = workspaces
    setup = DeltaSharingSetup(src.client(), dst.client())
    src.fail_next[("PATCH", "/api/2.1/unity-catalog/shares/lm_prod/permissions")] = 1  # dies before the grant
    with pytest.raises(TransientError):
        setup.apply(SPEC)
    assert "dr" in src.recipients and "prod_shared" not in dst.catalogs
    result = setup.apply(SPEC)
    assert result["steps"] == ["grant", "create_catalog"]
    assert [o["name"] for o in src.shares["lm_prod"]["objects"]].count("prod.sales") == 1
    assert [m for m in src.mutations() if m[1].endswith("/recipients")] == [("POST", "/api/2.1/unity-catalog/recipients")]


def test_the_provider_not_visible_yet_is_transient_and_denied_access_terminal() -> None:
    src, dst = FakeWorkspace("aws:1:src", name="src"), FakeWorkspace("aws:1:dst", name="dst")  # not linked
    src.catalogs["prod"] = {"name": "prod"}
    src.schemas["prod.sales"] = {"name": "sales", "catalog_name": "prod", "full_name": "prod.sales"}
    with src, dst:
        with pytest.raises(ProviderNotVisible):
            DeltaSharingSetup(src.client(), dst.client()).apply(SharingSpec(**{**SPEC.__dict__, "schemas": ("sales",)}))
        dst.catalogs["prod_shared"] = {"name": "prod_shared", "catalog_type": "MANAGED_CATALOG"}
        with pytest.raises(SharingConflict, match="a catalog of its own"):
            DeltaSharingSetup(src.client(), dst.client()).apply(SharingSpec(**{**SPEC.__dict__, "schemas": ("sales",)}))
    assert not isinstance(SharingConflict("x"), TransientError) and isinstance(SharingConflict("x"), TerminalError)


def test_replicate_sets_up_sharing_first_then_reads_the_tables_from_the_shared_catalogs(
        workspaces: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    import io

    from lakemirror.checkpoints.audit import InMemoryAuditLog
    from lakemirror.daemon.context import ReplicateContext
    from lakemirror.daemon.settings.replicate import load_replicate_config
    from lakemirror.sinks.batch.routing import ByOperation
    from lakemirror.sinks.batch.sharing import SharingOperations
    from lakemirror.sources.catalog import InMemoryDiscovery

    src, dst = workspaces
    src.catalogs["other"] = {"name": "other"}  # no schema: its set-up fails, its tables are left alone
    config = load_replicate_config(None, data={
        "runtime": {"mode": "databricks"}, "retry": {"max_attempts": 1},
        "catalogs": [{"name": "prod", "target_catalog": "dr", "exclude_schemas": ["scratch"]},
                     {"name": "other", "target_catalog": "dr_other"}],
        "delta_sharing": {"recipient": "dr_recipient"}})
    cloned: list[str] = []

    class Clones:
        def run(self, operation: str, job: object, tag: str) -> dict[str, object]:
            cloned.append(f"{job.source} -> {job.target}")  # type: ignore[attr-defined]
            return {}

        def cancel(self, tag: str) -> None:
            pass

    audit = InMemoryAuditLog()
    context = ReplicateContext(config, out=io.StringIO()).replace(
        audit=audit, execution_user="me",
        discovery=InMemoryDiscovery({"prod_shared": {"sales": ["orders"], "hr": ["people"]},
                                     "other_shared": {"x": ["t"]}}),
        operations=ByOperation(Clones(), {"delta_sharing": SharingOperations(
            lambda: DeltaSharingSetup(src.client(), dst.client()))}))
    summary = context.run()
    assert sorted(cloned) == ["prod_shared.hr.people -> dr.hr.people", "prod_shared.sales.orders -> dr.sales.orders"]
    shares = [(r.object_type, r.catalog_name, r.object_name, r.status, r.operation_type) for r in audit.records
              if r.object_type == "share"]
    assert sorted(shares) == [("share", "other_shared", "lakemirror_other", "failed", "replication"),
                              ("share", "prod_shared", "lakemirror_prod", "success", "replication")]
    assert not summary.ok and [o.job.object_type for o in summary.failed] == ["share"]
    assert [o["name"] for o in src.shares["lakemirror_prod"]["objects"]] == ["prod.hr", "prod.sales"]


@pytest.mark.parametrize("extra, where, says", [
    ({"delta_sharing": {"share": "x_{schema}"}}, "delta_sharing.share", "only {catalog}"),
    ({"delta_sharing": {"shared_catalog": "a.b"}}, "delta_sharing.shared_catalog", "letters, digits"),
    ({"delta_sharing": {"mode": "auto"}}, "delta_sharing.mode", "automatic"),
    ({"workspaces": {"source": {"host": "ftp://x"}}}, "workspaces.source.host", "https://"),
    ({"workspaces": {"target": {"token_env": "T", "profile": "p", "host": "https://h"}}}, "workspaces.target",
     "one of token, token_env and profile"),
    ({"workspaces": {"target": {"token_env": "T"}}}, "workspaces.target", "host is required"),
])
def test_bad_sharing_settings_are_refused_naming_the_field(extra: dict[str, object], where: str, says: str) -> None:
    from lakemirror.daemon.settings.replicate import load_replicate_config
    from lakemirror.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_replicate_config(None, data={"runtime": {"mode": "databricks"},
                                          "catalogs": [{"name": "prod", "target_catalog": "dr"}], **extra})
    assert any(where in loc and says in msg for loc, msg in caught.value.problems), caught.value.problems


def test_sharing_needs_a_databricks_runtime() -> None:
    from lakemirror.daemon.settings.replicate import load_replicate_config
    from lakemirror.errors import ConfigError

    with pytest.raises(ConfigError, match="set runtime.mode: databricks"):
        load_replicate_config(None, data={"catalogs": [{"name": "prod", "target_catalog": "dr"}],
                                          "delta_sharing": {}})


def test_a_named_provider_is_read_by_name_and_a_missing_one_is_not_looked_for_by_metastore(
        workspaces: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = workspaces
    setup = DeltaSharingSetup(src.client(), dst.client())
    setup.apply(SPEC)  # the recipient makes provider_src appear on the target
    named = SharingSpec(**{**SPEC.__dict__, "provider": "provider_src"})
    assert setup.apply(named)["steps"] == []
    assert ("GET", "/api/2.1/unity-catalog/providers/provider_src") in [(m, p) for m, p, _ in dst.calls]
    seen = setup.observe(SharingSpec(**{**SPEC.__dict__, "provider": "someone_else"}))
    assert seen.provider is None  # named and absent: not replaced by the one the metastore id finds
