"""Unity Catalog objects replicated through databricks-sdk against two fake workspaces that accept only
requests valid for the SDK's models: names remapped, grants with a principal mapping, credentials by
reference only, idempotent on a second run."""

from __future__ import annotations

from typing import Iterator

import pytest

from lakemirror.errors import TerminalError
from lakemirror.sinks.batch.uc_objects import CredentialHoldsSecret, UcMaps, UcReplicator, map_url, plan_grants
from tests.unit.databricks_workspace_fake import FakeWorkspace

MAPS = UcMaps(catalogs={"prod": "dr"}, principals={"prod-analysts": "dr-analysts"},
              location_urls={"s3://prod-bucket": "abfss://dr@acct.dfs.core.windows.net"},
              storage_credentials={"prod_sp": "dr_sp"})


def test_pure_planners() -> None:
    assert map_url("s3://prod-bucket/raw/x", MAPS.location_urls) == "abfss://dr@acct.dfs.core.windows.net/raw/x"
    assert map_url("s3://prod-bucket-2/raw", MAPS.location_urls) == "s3://prod-bucket-2/raw"  # a prefix of a name
    plan = plan_grants({"prod-analysts": ["SELECT", "USE_SCHEMA"], "alice@x.com": ["MODIFY"]},
                       {"dr-analysts": ["SELECT"], "stranger": ["ALL_PRIVILEGES"]}, MAPS)
    assert plan.changes == (("alice@x.com", ("MODIFY",), ()), ("dr-analysts", ("USE_SCHEMA",), ()))
    strict = UcMaps(catalogs={}, principals={}, unmapped_principals="skip", revoke_extra=True)
    plan = plan_grants({"bob": ["SELECT"]}, {"stranger": ["ALL_PRIVILEGES"]}, strict)
    assert plan.changes == (("stranger", (), ("ALL_PRIVILEGES",)),) and plan.skipped_principals == ("bob",)


@pytest.fixture
def pair() -> Iterator[tuple[FakeWorkspace, FakeWorkspace]]:
    src, dst = FakeWorkspace("aws:1:src", name="src"), FakeWorkspace("azure:2:dst", name="dst")
    src.catalogs["prod"] = {"name": "prod", "comment": "production", "properties": {"owner_team": "data"}}
    src.schemas["prod.sales"] = {"name": "sales", "catalog_name": "prod", "full_name": "prod.sales", "comment": "S"}
    src.volumes["prod.sales.landing"] = {"name": "landing", "catalog_name": "prod", "schema_name": "sales",
                                         "full_name": "prod.sales.landing", "volume_type": "EXTERNAL",
                                         "storage_location": "s3://prod-bucket/landing", "comment": "raw files"}
    src.storage_credentials["prod_role"] = {"name": "prod_role", "aws_iam_role": {"role_arn": "arn:aws:iam::1:role/r"}}
    src.storage_credentials["prod_sp"] = {"name": "prod_sp", "azure_service_principal": {
        "directory_id": "d", "application_id": "a", "client_secret": "SECRET-VALUE"}}
    src.storage_credentials["prod_other_sp"] = {"name": "prod_other_sp", "azure_service_principal": {
        "directory_id": "d", "application_id": "a", "client_secret": "SECRET-VALUE"}}
    src.external_locations["landing"] = {"name": "landing", "url": "s3://prod-bucket/landing",
                                         "credential_name": "prod_sp", "comment": "c"}
    src.grants[("catalog", "prod")] = {"prod-analysts": {"USE_CATALOG"}}
    src.grants[("schema", "prod.sales")] = {"prod-analysts": {"USE_SCHEMA", "SELECT"}, "etl@x.com": {"MODIFY"}}
    src.grants[("volume", "prod.sales.landing")] = {"prod-analysts": {"READ_VOLUME"}}
    dst.storage_credentials["dr_sp"] = {"name": "dr_sp", "azure_managed_identity": {"access_connector_id": "ac"}}
    with src, dst:
        yield src, dst
    assert src.rejected == [] and dst.rejected == []


def test_objects_are_created_remapped_with_grants_then_left_alone(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = pair
    rep = UcReplicator(src.client(), dst.client(), MAPS)
    assert rep.catalog("prod")["action"] == "created"
    assert rep.schema("prod.sales")["action"] == "created"
    assert rep.volume("prod.sales.landing")["action"] == "created"
    assert rep.storage_credential("prod_role")["action"] == "created"
    assert rep.storage_credential("prod_sp")["action"] == "mapped"
    assert rep.external_location("landing")["action"] == "created"
    assert dst.catalogs["dr"]["comment"] == "production" and dst.catalogs["dr"]["properties"] == {"owner_team": "data"}
    assert dst.volumes["dr.sales.landing"]["storage_location"] == "abfss://dr@acct.dfs.core.windows.net/landing"
    assert dst.storage_credentials["prod_role"]["aws_iam_role"] == {"role_arn": "arn:aws:iam::1:role/r"}
    assert dst.external_locations["landing"]["credential_name"] == "dr_sp"
    assert dst.grants[("schema", "dr.sales")] == {"dr-analysts": {"USE_SCHEMA", "SELECT"}, "etl@x.com": {"MODIFY"}}
    assert dst.grants[("volume", "dr.sales.landing")] == {"dr-analysts": {"READ_VOLUME"}}
    before = dst.mutations()
    assert rep.catalog("prod")["action"] == rep.schema("prod.sales")["action"] == "unchanged"
    assert rep.volume("prod.sales.landing")["action"] == rep.external_location("landing")["action"] == "unchanged"
    assert dst.mutations() == before  # a second run writes nothing
    src.schemas["prod.sales"]["comment"] = "Sales, renamed"
    assert rep.schema("prod.sales")["action"] == "updated" and dst.schemas["dr.sales"]["comment"] == "Sales, renamed"


def test_a_credential_with_a_secret_is_refused_by_name_and_never_sent(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = pair
    rep = UcReplicator(src.client(), dst.client(), MAPS)
    with pytest.raises(CredentialHoldsSecret, match="prod_other_sp holds a secret"):
        rep.storage_credential("prod_other_sp")
    assert all("SECRET-VALUE" not in str(body) for _, _, body in dst.calls)
    with pytest.raises(TerminalError, match="maps to dr_missing"):
        UcReplicator(src.client(), dst.client(), UcMaps(catalogs={}, storage_credentials={"prod_sp": "dr_missing"})
                     ).storage_credential("prod_sp")


def test_sdk_objects_outside_databricks_and_bad_types_are_refused_naming_the_field() -> None:
    from lakemirror.daemon.settings.replicate import load_replicate_config
    from lakemirror.errors import ConfigError

    base = {"operations": ["uc_objects"], "catalogs": [{"name": "prod", "target_catalog": "dr"}]}
    with pytest.raises(ConfigError) as caught:
        load_replicate_config(None, data={**base, "uc_objects": {"object_types": ["view", "catalog"]}})
    assert any(loc.endswith("uc_objects.object_types") and "catalog live in Unity Catalog" in msg
               for loc, msg in caught.value.problems)
    assert load_replicate_config(None, data={**base, "uc_objects": {"object_types": ["view"]}}).runs_uc_objects()
    with pytest.raises(ConfigError) as caught:
        load_replicate_config(None, data={**base, "uc_objects": {"object_types": ["function"]}})
    assert any("uc_objects.object_types" in loc for loc, _ in caught.value.problems)
    with pytest.raises(ConfigError) as caught:
        load_replicate_config(None, data={**base, "uc_objects": {"unmapped_principals": "drop"}})
    assert any("uc_objects.unmapped_principals" in loc for loc, _ in caught.value.problems)


def test_catalogs_volumes_and_locations_that_differ_are_updated_in_place(pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = pair
    rep = UcReplicator(src.client(), dst.client(), MAPS)
    rep.catalog("prod"), rep.schema("prod.sales"), rep.volume("prod.sales.landing"), rep.external_location("landing")
    src.catalogs["prod"].update(comment="production, audited", properties={"owner_team": "platform"})
    src.volumes["prod.sales.landing"]["comment"] = "raw files, kept 30 days"
    src.external_locations["landing"].update(url="s3://prod-bucket/landing-v2", comment="moved")
    assert rep.catalog("prod")["action"] == "updated"
    assert dst.catalogs["dr"]["comment"] == "production, audited"
    assert dst.catalogs["dr"]["properties"] == {"owner_team": "platform"}
    assert rep.volume("prod.sales.landing")["action"] == "updated"
    assert dst.volumes["dr.sales.landing"]["comment"] == "raw files, kept 30 days"
    out = rep.external_location("landing")
    assert out["action"] == "updated" and out["url"] == "abfss://dr@acct.dfs.core.windows.net/landing-v2"
    assert dst.external_locations["landing"]["url"] == "abfss://dr@acct.dfs.core.windows.net/landing-v2"
    assert dst.external_locations["landing"]["comment"] == "moved" and dst.external_locations["landing"]["credential_name"] == "dr_sp"
    assert [m for m in dst.mutations() if m[0] == "PATCH" and "/permissions/" not in m[1]] == [
        ("PATCH", "/api/2.1/unity-catalog/catalogs/dr"), ("PATCH", "/api/2.1/unity-catalog/volumes/dr.sales.landing"),
        ("PATCH", "/api/2.1/unity-catalog/external-locations/landing")]


def test_every_cloud_identity_is_referenced_and_extra_grants_are_revoked_only_when_asked(
        pair: tuple[FakeWorkspace, FakeWorkspace]) -> None:
    src, dst = pair
    src.storage_credentials["azure_mi"] = {"name": "azure_mi", "azure_managed_identity": {
        "access_connector_id": "/subscriptions/s/ac", "managed_identity_id": "/subscriptions/s/mi"}}
    src.storage_credentials["gcp_sa"] = {"name": "gcp_sa", "databricks_gcp_service_account": {"email": "x@gcp"}}
    src.storage_credentials["bare"] = {"name": "bare", "comment": "nothing to reference"}
    rep = UcReplicator(src.client(), dst.client(), MAPS)
    assert rep.storage_credential("azure_mi")["by_reference"] == ["azure_managed_identity"]
    assert dst.storage_credentials["azure_mi"]["azure_managed_identity"] == {
        "access_connector_id": "/subscriptions/s/ac", "managed_identity_id": "/subscriptions/s/mi"}
    assert rep.storage_credential("gcp_sa")["by_reference"] == ["databricks_gcp_service_account"]
    assert dst.storage_credentials["gcp_sa"]["databricks_gcp_service_account"] == {}  # the target makes its own
    with pytest.raises(TerminalError, match="bare: no cloud identity to reference"):
        rep.storage_credential("bare")
    rep.catalog("prod")
    dst.grants[("catalog", "dr")]["stranger"] = {"ALL_PRIVILEGES"}
    assert rep.catalog("prod")["grants_changed"] == []  # kept: revoke_extra is off
    strict = UcReplicator(src.client(), dst.client(), UcMaps(catalogs={"prod": "dr"},
                                                             principals={"prod-analysts": "dr-analysts"},
                                                             revoke_extra=True))
    assert strict.catalog("prod")["grants_changed"] == [{"principal": "stranger", "add": [], "remove": ["ALL_PRIVILEGES"]}]
    assert dst.grants[("catalog", "dr")] == {"dr-analysts": {"USE_CATALOG"}, "stranger": set()}
