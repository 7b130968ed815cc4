"""Unity Catalog objects replicated from the source workspace to the target, through databricks-sdk:
catalogs, schemas, volumes, external locations, storage credentials (by reference only) and the grants
of each, with names remapped (source catalog -> target catalog) and principals mapped.

Each ``replicate_*`` function handles one object: it reads the source object and its target, creates
the target if missing or brings its comment and properties to the source's (a target made by other
means is updated, never dropped), then makes its grants match. The planners are pure:
:func:`plan_grants` (which privileges to add, and with ``revoke_extra`` to remove, per mapped principal)
and :func:`map_url` (a storage URL under a mapped prefix).

- **Storage credentials** are replicated by reference only: a credential backed by a cloud identity (an
  AWS IAM role, an Azure managed identity, a Databricks GCP service account) is created on the target
  naming the same identity; one holding a secret (an Azure service principal's client secret, a
  Cloudflare token) is refused by name: its secret never leaves the source. Create it on the target and
  map it (``storage_credentials: {source: target}``); a mapped credential is used as it is.
- **External locations** keep their name; their URL goes through ``location_urls`` (a prefix map, for a
  target in another bucket or cloud) and their credential through the credential map.
- **Volumes**: managed ones are created managed; external ones at their mapped storage location (an
  external volume whose location has no mapping is created at the same URL, which the target must reach).
- **Grants**: per principal, source privileges mapped through ``principals`` (a principal absent from the
  map keeps its name, or with ``unmapped_principals: skip`` is left out and reported).

SDK errors are translated once (:func:`~lakemirror.sinks.batch.sharing._sdk`): permission problems and
conflicts are terminal, the rest transient (the batch runner retries).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence, TypeVar

from lakemirror.errors import TerminalError
from lakemirror.sinks.batch.sharing import _absent as _absent_with, _sdk as _sdk_with

#: What a permission error tells the principal it needs.
UC_NEEDS = ("USE_CATALOG and USE_SCHEMA on the parents, and on the target the CREATE_ privilege of each "
            "object kind (or its ownership) and MANAGE to change grants")

T = TypeVar("T")


def _sdk(what: str, call: Callable[[], T]) -> T:
    return _sdk_with(what, call, UC_NEEDS)


def _absent(what: str, call: Callable[[], T]) -> T | None:
    return _absent_with(what, call, UC_NEEDS)


if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient


class CredentialHoldsSecret(TerminalError):
    code = "credential_secret"


class ViewDependencyFailed(TerminalError):
    """A view reads an object the target does not have, or a view that failed in this run (named)."""

    code = "view_dependency"


_NOT_FOUND = re.compile(r"TABLE_OR_VIEW_NOT_FOUND\]?[^`]*((?:`(?:[^`]|``)+`)(?:\.`(?:[^`]|``)+`)*)")


def missing_object(exc: BaseException) -> str | None:
    """The object a ``TABLE_OR_VIEW_NOT_FOUND`` error names (as Spark quotes it), else None."""
    text = str(exc)
    if "TABLE_OR_VIEW_NOT_FOUND" not in text:
        return None
    found = _NOT_FOUND.search(text)
    return found.group(1) if found else "an object"


@dataclass(frozen=True)
class UcMaps:
    """How source names become target names."""

    catalogs: Mapping[str, str]
    schemas: Mapping[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    principals: Mapping[str, str] = field(default_factory=dict)
    unmapped_principals: Literal["keep", "skip"] = "keep"
    location_urls: Mapping[str, str] = field(default_factory=dict)
    storage_credentials: Mapping[str, str] = field(default_factory=dict)
    revoke_extra: bool = False

    def catalog(self, name: str) -> str:
        return self.catalogs.get(name, name)

    def full_name(self, full: str) -> str:
        """``catalog[.schema[.object]]`` with its catalog (or catalog and schema) mapped."""
        parts = full.split(".", 2)
        if len(parts) >= 2 and (parts[0], parts[1]) in self.schemas:
            return ".".join([*self.schemas[(parts[0], parts[1])], *parts[2:]])
        return ".".join([self.catalog(parts[0]), *parts[1:]])


def map_url(url: str | None, prefixes: Mapping[str, str]) -> str | None:
    """``url`` under the longest mapped prefix, rewritten; unchanged when none matches. Pure."""
    if url is None:
        return None
    for src in sorted(prefixes, key=len, reverse=True):
        if url == src or url.startswith(src.rstrip("/") + "/"):
            return prefixes[src].rstrip("/") + url[len(src.rstrip("/")):]
    return url


@dataclass(frozen=True)
class GrantPlan:
    changes: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]  # (principal, add, remove)
    skipped_principals: tuple[str, ...] = ()


def plan_grants(source: Mapping[str, Sequence[str]], target: Mapping[str, Sequence[str]], maps: UcMaps) -> GrantPlan:
    """The grant changes that make ``target`` hold the source's privileges (principals mapped). Pure."""
    wanted: dict[str, set[str]] = {}
    skipped = []
    for principal, privileges in source.items():
        mapped = maps.principals.get(principal)
        if mapped is None and maps.unmapped_principals == "skip":
            skipped.append(principal)
            continue
        wanted.setdefault(mapped or principal, set()).update(privileges)
    changes = []
    for principal in sorted(set(wanted) | (set(target) if maps.revoke_extra else set())):
        have = set(target.get(principal, ()))
        add = tuple(sorted(wanted.get(principal, set()) - have))
        remove = tuple(sorted(have - wanted.get(principal, set()))) if maps.revoke_extra else ()
        if add or remove:
            changes.append((principal, add, remove))
    return GrantPlan(tuple(changes), tuple(sorted(skipped)))


def _assignments(response: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in response.privilege_assignments or []:
        if a.principal:
            out.setdefault(a.principal, []).extend(str(getattr(p, "value", p)) for p in (a.privileges or []))
    return out


class UcReplicator:
    """Replicates one object at a time (see the module docstring)."""

    def __init__(self, source: "WorkspaceClient", target: "WorkspaceClient", maps: UcMaps) -> None:
        self.source = source
        self.target = target
        self.maps = maps

    # -- grants ---------------------------------------------------------------------------------

    def grants(self, securable: str, source_name: str, target_name: str) -> dict[str, Any]:
        from databricks.sdk.service import catalog as uc

        src = _assignments(_sdk(f"grants of {securable} {source_name}",
                                lambda: self.source.grants.get(securable, source_name)))
        dst = _assignments(_sdk(f"grants of {securable} {target_name}",
                                lambda: self.target.grants.get(securable, target_name)))
        plan = plan_grants(src, dst, self.maps)
        if plan.changes:
            changes = [uc.PermissionsChange(principal=p, add=[uc.Privilege(x) for x in add] or None,
                                            remove=[uc.Privilege(x) for x in remove] or None)
                       for p, add, remove in plan.changes]
            _sdk(f"grants of {securable} {target_name}",
                 lambda: self.target.grants.update(securable, target_name, changes=changes))
        return {"grants_changed": [{"principal": p, "add": list(a), "remove": list(r)} for p, a, r in plan.changes],
                "principals_skipped": list(plan.skipped_principals)}

    # -- objects --------------------------------------------------------------------------------

    def catalog(self, name: str) -> dict[str, Any]:
        target = self.maps.catalog(name)
        src = _sdk(f"catalog {name}", lambda: self.source.catalogs.get(name))
        dst = _absent(f"catalog {target}", lambda: self.target.catalogs.get(target))
        action = "unchanged"
        if dst is None:
            _sdk(f"create catalog {target}", lambda: self.target.catalogs.create(
                target, comment=src.comment, properties=src.properties or None,
                storage_root=map_url(src.storage_root, self.maps.location_urls) if self.maps.location_urls else None))
            action = "created"
        elif (dst.comment, dst.properties or {}) != (src.comment, src.properties or {}):
            _sdk(f"update catalog {target}", lambda: self.target.catalogs.update(
                target, comment=src.comment, properties=src.properties or None))
            action = "updated"
        return {"object": target, "action": action, **self.grants("catalog", name, target)}

    def schema(self, full_name: str) -> dict[str, Any]:
        target = self.maps.full_name(full_name)
        catalog, schema = target.split(".", 1)
        src = _sdk(f"schema {full_name}", lambda: self.source.schemas.get(full_name))
        dst = _absent(f"schema {target}", lambda: self.target.schemas.get(target))
        action = "unchanged"
        if dst is None:
            _sdk(f"create schema {target}", lambda: self.target.schemas.create(
                schema, catalog, comment=src.comment, properties=src.properties or None,
                storage_root=map_url(src.storage_root, self.maps.location_urls) if self.maps.location_urls else None))
            action = "created"
        elif (dst.comment, dst.properties or {}) != (src.comment, src.properties or {}):
            _sdk(f"update schema {target}", lambda: self.target.schemas.update(
                target, comment=src.comment, properties=src.properties or None))
            action = "updated"
        return {"object": target, "action": action, **self.grants("schema", full_name, target)}

    def volume(self, full_name: str) -> dict[str, Any]:
        from databricks.sdk.service import catalog as uc

        target = self.maps.full_name(full_name)
        catalog, schema, name = target.split(".", 2)
        src = _sdk(f"volume {full_name}", lambda: self.source.volumes.read(full_name))
        dst = _absent(f"volume {target}", lambda: self.target.volumes.read(target))
        action = "unchanged"
        if dst is None:
            kind = src.volume_type or uc.VolumeType.MANAGED
            location = map_url(src.storage_location, self.maps.location_urls) if kind == uc.VolumeType.EXTERNAL else None
            _sdk(f"create volume {target}", lambda: self.target.volumes.create(
                catalog, schema, name, kind, comment=src.comment, storage_location=location))
            action = "created"
        elif dst.comment != src.comment:
            _sdk(f"update volume {target}", lambda: self.target.volumes.update(target, comment=src.comment))
            action = "updated"
        return {"object": target, "action": action, **self.grants("volume", full_name, target)}

    def storage_credential(self, name: str) -> dict[str, Any]:
        from databricks.sdk.service import catalog as uc

        mapped = self.maps.storage_credentials.get(name)
        if mapped is not None:
            if _absent(f"storage credential {mapped}", lambda: self.target.storage_credentials.get(mapped)) is None:
                raise TerminalError(f"storage credential {name} maps to {mapped}, which the target workspace does "
                                    f"not have: create it there (its secret is never copied)")
            return {"object": mapped, "action": "mapped", **self.grants("storage_credential", name, mapped)}
        src = _sdk(f"storage credential {name}", lambda: self.source.storage_credentials.get(name))
        if _absent(f"storage credential {name}", lambda: self.target.storage_credentials.get(name)) is not None:
            return {"object": name, "action": "unchanged", **self.grants("storage_credential", name, name)}
        if src.azure_service_principal is not None or src.cloudflare_api_token is not None:
            raise CredentialHoldsSecret(
                f"storage credential {name} holds a secret ({'an Azure service principal' if src.azure_service_principal else 'a Cloudflare token'}): "
                f"a secret never leaves the source. Create it on the target and map it in "
                f"uc_objects.storage_credentials")
        kwargs: dict[str, Any] = {}
        if src.aws_iam_role is not None and src.aws_iam_role.role_arn:
            kwargs["aws_iam_role"] = uc.AwsIamRoleRequest(role_arn=src.aws_iam_role.role_arn)
        elif src.azure_managed_identity is not None and src.azure_managed_identity.access_connector_id:
            kwargs["azure_managed_identity"] = uc.AzureManagedIdentityRequest(
                access_connector_id=src.azure_managed_identity.access_connector_id,
                managed_identity_id=src.azure_managed_identity.managed_identity_id)
        elif src.databricks_gcp_service_account is not None:
            kwargs["databricks_gcp_service_account"] = uc.DatabricksGcpServiceAccountRequest()
        else:
            raise TerminalError(f"storage credential {name}: no cloud identity to reference; create it on the target "
                                f"and map it in uc_objects.storage_credentials")
        _sdk(f"create storage credential {name}", lambda: self.target.storage_credentials.create(
            name, comment=src.comment, read_only=src.read_only, **kwargs))
        return {"object": name, "action": "created", "by_reference": sorted(kwargs),
                **self.grants("storage_credential", name, name)}

    def external_location(self, name: str) -> dict[str, Any]:
        src = _sdk(f"external location {name}", lambda: self.source.external_locations.get(name))
        url = map_url(src.url, self.maps.location_urls) or ""
        credential = self.maps.storage_credentials.get(src.credential_name or "", src.credential_name or "")
        dst = _absent(f"external location {name}", lambda: self.target.external_locations.get(name))
        action = "unchanged"
        if dst is None:
            _sdk(f"create external location {name}", lambda: self.target.external_locations.create(
                name, url, credential, comment=src.comment, read_only=src.read_only))
            action = "created"
        elif (dst.url, dst.credential_name, dst.comment) != (url, credential, src.comment):
            _sdk(f"update external location {name}", lambda: self.target.external_locations.update(
                name, url=url, credential_name=credential, comment=src.comment))
            action = "updated"
        return {"object": name, "action": action, "url": url, "credential": credential,
                **self.grants("external_location", name, name)}

    def table_grants(self, full_name: str) -> dict[str, Any]:
        """A table's (or view's) grants only: the object itself is replicated by clone (or as a view)."""
        target = self.maps.full_name(full_name)
        return {"object": target, **self.grants("table", full_name, target)}


#: The batch runner's operation per Unity Catalog object type.
UC_OPERATIONS = {"storage_credential": "uc_storage_credential", "external_location": "uc_external_location",
                 "catalog": "uc_catalog", "schema": "uc_schema", "volume": "uc_volume", "view": "uc_view",
                 "table_grants": "uc_table_grants"}


class UcOperations:
    """The ``uc_*`` operations of the batch runner: ``job.settings.options["uc"]["name"]`` (the source
    object) through :class:`UcReplicator`; a view (``options["view"]``) created by SQL on the attempt's
    own session. ``replicator`` builds the workspaces' clients when first needed."""

    def __init__(self, replicator: Any, sessions: Any = None) -> None:
        self._make = replicator
        self._built: UcReplicator | None = None
        self.sessions = sessions
        self._failed_views: set[str] = set()  # source names of the views whose last attempt failed
        self._lock = threading.Lock()

    @property
    def replicator(self) -> UcReplicator:
        if self._built is None:
            self._built = self._make()
        return self._built

    def run(self, operation: str, job: Any, tag: str) -> Mapping[str, Any]:
        listing_error = job.settings.options.get("uc", {}).get("listing_error")
        if listing_error:  # what this job stands for could not be listed when the phases were planned
            raise TerminalError(str(listing_error), table=str(job.source))
        if operation == "uc_view":
            from lakemirror.sinks.batch.uc_views import create_view, planned_from
            from lakemirror.sinks.sql import SparkSql

            view = planned_from(job.settings.options["view"])
            with self._lock:
                failed = [d for d in view.depends_on if d in self._failed_views]
            if failed:
                with self._lock:
                    self._failed_views.add(str(view.source))
                raise ViewDependencyFailed(
                    f"view {view.target} was not created: it reads {', '.join(failed)}, which could not be created "
                    f"on the target in this run (see its own row)", table=str(view.source))
            try:
                with self.sessions.session(tag) as session:
                    out = create_view(SparkSql(session), view)
            except Exception as exc:
                with self._lock:
                    self._failed_views.add(str(view.source))
                missing = missing_object(exc)
                if missing is None:
                    raise
                raise ViewDependencyFailed(
                    f"view {view.target} was not created: it reads {missing}, which the target does not have "
                    f"(replicate it first, or select its schema)", table=str(view.source)) from exc
            with self._lock:
                self._failed_views.discard(str(view.source))
            if job.settings.options["view"].get("grants"):
                out.update(self.replicator.table_grants(str(view.source)))
            return out
        name = str(job.settings.options["uc"]["name"])
        r = self.replicator
        method = {"uc_storage_credential": r.storage_credential, "uc_external_location": r.external_location,
                  "uc_catalog": r.catalog, "uc_schema": r.schema, "uc_volume": r.volume,
                  "uc_table_grants": r.table_grants}.get(operation)
        if method is None:
            raise TerminalError(f"unknown operation {operation!r}")
        return method(name)

    def cancel(self, tag: str) -> None:
        if self.sessions is not None:
            self.sessions.cancel(tag)
