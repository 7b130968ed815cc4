"""Settings of the disaster-recovery parts of ``lakemirror replicate`` that talk to Databricks
workspaces through databricks-sdk: the two workspaces, the Delta Sharing set-up, the backup operation
and the Unity Catalog objects replicated with their grants.

::

    workspaces:
      source: {host: https://src.cloud.databricks.com, token_env: SRC_TOKEN}
      target: {profile: dr}                   # a profile of ~/.databrickscfg; none at all: ambient auth
    delta_sharing:
      mode: automatic                         # existing: use (and check) a set-up made by other means
      recipient: lakemirror_dr
      share: "lakemirror_{catalog}"           # {catalog}: the source catalog
      shared_catalog: "{catalog}_shared"      # created on the target from the share; clones read it
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from lakemirror.daemon.settings import limits

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class WorkspaceSettings(Strict):
    """How to reach one workspace. At most one of ``token``, ``token_env`` and ``profile``; none:
    databricks-sdk's own resolution (environment, or the job's ambient credentials)."""

    host: str | None = Field(None, description="https://<workspace>; required with token or token_env.")
    token: SecretStr | None = Field(None, description="A personal access token (prefer token_env).")
    token_env: str | None = Field(None, description="Environment variable holding the token.")
    profile: str | None = Field(None, description="A profile of ~/.databrickscfg.")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        if v is not None:
            limits.path(v, "host")
        if v is not None and not re.match(r"^https?://[^/\s]+/?$", v.strip()):
            raise ValueError("https://<workspace host>, without a path")
        return v.strip().rstrip("/") if v else v

    @field_validator("token")
    @classmethod
    def _token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            limits.secret(v.get_secret_value(), "token")
        return v

    @field_validator("token_env", "profile")
    @classmethod
    def _short(cls, v: str | None, info: Any) -> str | None:
        if v is not None:
            limits.name(v, str(info.field_name))
        if v is not None and info.field_name == "token_env" and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v):
            raise ValueError("an environment variable name")
        return v

    @model_validator(mode="after")
    def _one_way(self) -> "WorkspaceSettings":
        ways = [n for n in ("token", "token_env", "profile") if getattr(self, n) is not None]
        if len(ways) > 1:
            raise ValueError(f"set one of token, token_env and profile, not {' and '.join(ways)}")
        if ways and ways[0] != "profile" and self.host is None:
            raise ValueError(f"host is required with {ways[0]}")
        return self

    def resolved_token(self) -> str | None:
        """The token (from ``token_env`` at run time); raises ``ValueError`` naming an unset variable."""
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_env is not None:
            value = os.environ.get(self.token_env)
            if not value:
                raise ValueError(f"the environment variable {self.token_env} (token_env) is not set")
            return value
        return None


class WorkspacesSettings(Strict):
    source: WorkspaceSettings = Field(default_factory=WorkspaceSettings)
    target: WorkspaceSettings = Field(default_factory=WorkspaceSettings)


def _template(v: str, field: str) -> str:
    limits.name(v, field)
    try:
        sample = v.format(catalog="c")
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"{field}: only {{catalog}} may be substituted") from None
    if not _NAME.match(sample):
        raise ValueError(f"{field}: {v!r} must give names of letters, digits, '_' and '-'")
    return v


class DeltaSharingSettings(Strict):
    """Cross-metastore replication through Delta Sharing (Databricks to Databricks)."""

    mode: Literal["automatic", "existing"] = Field(
        "automatic", description="automatic: create what is missing; existing: only check, refuse what is missing.")
    recipient: str = Field("lakemirror_dr", description="Recipient (on the source) for the target's metastore.")
    share: str = Field("lakemirror_{catalog}", description="Share per source catalog ({catalog}: its name).")
    shared_catalog: str = Field("{catalog}_shared", description="Catalog created on the target from the share; "
                                                                 "replication reads the source tables there.")
    provider: str | None = Field(None, description="Provider name on the target (default: the one whose metastore "
                                                   "is the source's).")
    history: bool = Field(True, description="Share schemas with history (time travel, change feed).")

    @field_validator("recipient", "provider")
    @classmethod
    def _plain(cls, v: str | None, info: Any) -> str | None:
        if v is not None:
            limits.name(v, str(info.field_name))
        if v is not None and not _NAME.match(v):
            raise ValueError(f"{v!r}: letters, digits, '_' and '-' only")
        return v

    @field_validator("share")
    @classmethod
    def _share(cls, v: str) -> str:
        return _template(v, "share")

    @field_validator("shared_catalog")
    @classmethod
    def _catalog(cls, v: str) -> str:
        return _template(v, "shared_catalog")


class BackupSettings(Strict):
    """The backup operation (run in the source workspace): Streaming Tables' backing tables deep cloned
    into a backup catalog, and the schemas holding what is backed up added to the share."""

    catalog: str = Field("{catalog}_backup", description="Catalog of the backing tables' deep clones "
                                                         "({catalog}: the source catalog).")
    share: str | None = Field(None, description="Share the schemas are added to (default: delta_sharing.share, "
                                                "else lakemirror_{catalog}).")
    history: bool = Field(True, description="Add the schemas with history (time travel, change feed).")
    include_checkpoints: bool = Field(False, description="Refused: streaming checkpoints are not replicated.")

    @field_validator("catalog")
    @classmethod
    def _catalog(cls, v: str) -> str:
        return _template(v, "catalog")

    @field_validator("share")
    @classmethod
    def _share(cls, v: str | None) -> str | None:
        return None if v is None else _template(v, "share")

    @field_validator("include_checkpoints")
    @classmethod
    def _checkpoints(cls, v: bool) -> bool:
        if v:
            from lakemirror.sources.streaming_tables import CHECKPOINT_REASON

            raise ValueError(f"streaming checkpoints are not backed up: {CHECKPOINT_REASON}")
        return v


UC_OBJECT_TYPES = ("storage_credential", "external_location", "catalog", "schema", "volume", "view", "table_grants")
#: The object types that live in Unity Catalog only (replicated through databricks-sdk).
SDK_OBJECT_TYPES = ("storage_credential", "external_location", "catalog", "schema", "volume", "table_grants")


class UcObjectsSettings(Strict):
    """The ``uc_objects`` operation: Unity Catalog objects and their grants, names remapped."""

    object_types: list[Literal["storage_credential", "external_location", "catalog", "schema", "volume", "view",
                               "table_grants"]] = Field(
        default_factory=lambda: list[Literal["storage_credential", "external_location", "catalog", "schema", "volume",
                                             "view", "table_grants"]](
            ["catalog", "schema", "volume", "view", "table_grants"]),
        description="What to replicate (storage credentials and external locations: the ones listed below).")
    external_locations: list[str] = Field(default_factory=list, description="External locations replicated (names); "
                                          "their storage credentials too, when storage_credential is selected.")
    principals: dict[str, str] = Field(default_factory=dict, description="Source principal -> target principal "
                                       "(users, groups, service principals) for every grant.")
    unmapped_principals: Literal["keep", "skip"] = Field("keep", description="A principal absent from principals: "
                                                         "granted under the same name, or left out (reported).")
    revoke_extra: bool = Field(False, description="Also revoke target privileges the source does not grant.")
    location_urls: dict[str, str] = Field(default_factory=dict, description="Storage URL prefix map (source -> "
                                          "target) for external locations, external volumes, storage roots.")
    storage_credentials: dict[str, str] = Field(default_factory=dict, description="Source credential -> target "
                                                "credential to use instead of creating one (needed for those "
                                                "holding a secret).")

    @field_validator("external_locations")
    @classmethod
    def _locations(cls, v: list[str]) -> list[str]:
        limits.names(v, "an external location's name")
        return v

    @field_validator("principals", "storage_credentials")
    @classmethod
    def _name_maps(cls, v: dict[str, str], info: Any) -> dict[str, str]:
        what = "a principal" if info.field_name == "principals" else "a storage credential's name"
        limits.names([*v, *v.values()], what)
        return v

    @field_validator("location_urls")
    @classmethod
    def _urls(cls, v: dict[str, str]) -> dict[str, str]:
        for url in [*v, *v.values()]:
            limits.path(url, "a storage URL")
        return v
