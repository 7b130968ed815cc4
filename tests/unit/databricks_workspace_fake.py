"""A stateful fake of a Databricks workspace's Unity Catalog, Delta Sharing and Pipelines REST APIs,
served on loopback (:class:`~tests.unit.databricks_fake.FakeJobsApi`'s server) for databricks-sdk.

It accepts only requests valid for the SDK's own models: each route is tied to the SDK method that
calls it, and a request's body (or query) may hold only that method's parameters, with every required
one present and each value of the parameter's declared type — an enum's known values, a dataclass's
own fields, recursively. Anything else is answered ``400 INVALID_PARAMETER_VALUE`` naming the field,
as a workspace does, and recorded in :attr:`FakeWorkspace.rejected` so a test can assert there were
none. Answers are checked against the SDK method's return model too.

Two workspaces can be linked (:meth:`FakeWorkspace.link`) as a provider and a recipient metastore: a
Databricks recipient created on the provider with the other's global metastore id makes a provider
appear on the recipient side, and shares granted to that recipient become listable there, which is
what ``catalogs.create(provider_name=…, share_name=…)`` needs.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import threading
import typing
from functools import cache
from typing import TYPE_CHECKING, Any, Callable

from tests.unit.databricks_fake import FakeJobsApi

if TYPE_CHECKING:  # the SDK is imported where a fake is used: collecting the tests needs none of it
    from databricks.sdk import WorkspaceClient

Answer = tuple[int, Any]


class Invalid(Exception):
    pass


def _check(annotation: Any, value: Any, where: str) -> None:
    """Raise :class:`Invalid` unless ``value`` (JSON) is valid for ``annotation`` (an SDK type)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                _check(a, value, where)
                return
            except Invalid as exc:
                errors.append(str(exc))
        raise Invalid(errors[0])
    if origin in (list, typing.List):
        if not isinstance(value, list):
            raise Invalid(f"{where}: expected a list")
        for i, v in enumerate(value):
            _check(args[0], v, f"{where}[{i}]")
        return
    if origin in (dict, typing.Dict):
        if not isinstance(value, dict):
            raise Invalid(f"{where}: expected an object")
        for k, v in value.items():
            _check(args[1], v, f"{where}.{k}")
        return
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        if value not in {m.value for m in annotation}:
            raise Invalid(f"{where}: {value!r} is not one of {sorted(m.value for m in annotation)}")
        return
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise Invalid(f"{where}: expected an object")
        hints = typing.get_type_hints(annotation)
        for k, v in value.items():
            if k not in hints:
                raise Invalid(f"{where}.{k}: unknown field of {annotation.__name__}")
            _check(hints[k], v, f"{where}.{k}")
        return
    if annotation is bool and not isinstance(value, bool) and value not in ("true", "false"):  # JSON, or a query
        raise Invalid(f"{where}: expected a boolean")
    if annotation is int and (not isinstance(value, int) or isinstance(value, bool)):
        if not (isinstance(value, str) and value.lstrip("-").isdigit()):  # query strings
            raise Invalid(f"{where}: expected an integer")
    if annotation is str and not isinstance(value, str):
        raise Invalid(f"{where}: expected a string")
    if annotation is float and not isinstance(value, (int, float)):
        raise Invalid(f"{where}: expected a number")


def validate_request(method: Callable[..., Any], path_params: dict[str, str], payload: dict[str, Any]) -> None:
    """Body or query of a call to the SDK ``method``: only its parameters, every required one, each typed."""
    sig = inspect.signature(method)
    hints = typing.get_type_hints(method)
    params = {n: p for n, p in sig.parameters.items() if n != "self"}
    for key, value in payload.items():
        if key not in params:
            raise Invalid(f"{key}: not a parameter of {method.__qualname__}")
        _check(hints[key], value, key)
    for name, p in params.items():
        if p.default is inspect.Parameter.empty and name not in path_params and name not in payload:
            raise Invalid(f"{name}: required by {method.__qualname__}")


#: SDK methods whose JSON body is one parameter's model (``create(tag_assignment)`` sends
#: ``tag_assignment.as_dict()``), not their parameters: the body is checked against that model.
@cache
def body_models() -> dict[Callable[..., Any], str]:
    from databricks.sdk.service import catalog as uc

    return {uc.EntityTagAssignmentsAPI.create: "tag_assignment", uc.EntityTagAssignmentsAPI.update: "tag_assignment"}


def validate_body_model(method: Callable[..., Any], path_params: dict[str, str], body: Any,
                        query: dict[str, Any]) -> None:
    """A body that is the model of ``body_models()[method]`` (its required fields present, every field
    typed), and a query of the method's other parameters."""
    param = body_models()[method]
    model = typing.get_type_hints(method)[param]
    if not isinstance(body, dict):
        raise Invalid(f"{param}: expected an object")
    _check(model, body, param)
    for f in dataclasses.fields(model):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in body:
            raise Invalid(f"{param}.{f.name}: required by {model.__name__}")
    validate_request(method, {**path_params, param: "body"}, query)


def validate_answer(method: Callable[..., Any], payload: Any) -> None:
    ret = typing.get_type_hints(method).get("return")
    if ret is None or payload is None or ret is type(None):
        return
    if typing.get_origin(ret) is typing.Iterator or str(ret).startswith("typing.Iterator"):
        return  # list endpoints: checked per item by the SDK's own from_dict
    _check(ret, payload, f"answer of {method.__qualname__}")


def _not_found(what: str) -> Answer:
    return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": f"{what} does not exist."}


def _exists(what: str) -> Answer:
    return 409, {"error_code": "RESOURCE_ALREADY_EXISTS", "message": f"{what} already exists."}


class FakeWorkspace:
    """See the module docstring. State is plain dicts a test may read or seed."""

    def __init__(self, global_metastore_id: str = "aws:us-west-2:source-ms", *, name: str = "ws") -> None:
        self.name = name
        self.global_metastore_id = global_metastore_id
        self.catalogs: dict[str, dict[str, Any]] = {}
        self.schemas: dict[str, dict[str, Any]] = {}
        self.tables: dict[str, dict[str, Any]] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.recipients: dict[str, dict[str, Any]] = {}
        self.shares: dict[str, dict[str, Any]] = {}
        self.share_grants: dict[str, dict[str, set[str]]] = {}
        self.providers: dict[str, dict[str, Any]] = {}
        self.pipelines: dict[str, dict[str, Any]] = {}
        self.external_locations: dict[str, dict[str, Any]] = {}
        self.storage_credentials: dict[str, dict[str, Any]] = {}
        self.grants: dict[tuple[str, str], dict[str, set[str]]] = {}
        #: (entity_type, entity_name) -> {tag_key: assignment as the API answers it}
        self.tags: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self.rejected: list[str] = []
        self.calls: list[tuple[str, str, Any]] = []
        self.fail_next: dict[tuple[str, str], int] = {}  # (method, path prefix) -> failures to inject (500)
        self.recipient_side: FakeWorkspace | None = None
        self.provider_side: FakeWorkspace | None = None
        self._lock = threading.RLock()
        self.server = FakeJobsApi({}, dynamic=self.handle)
        self._routes = self._route_table()

    # -- life -----------------------------------------------------------------------------------

    def __enter__(self) -> "FakeWorkspace":
        self.server.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.__exit__(*exc)

    def client(self) -> "WorkspaceClient":
        return self.server.client()

    def link(self, recipient_side: "FakeWorkspace") -> None:
        """This workspace shares to ``recipient_side`` (Databricks-to-Databricks)."""
        self.recipient_side = recipient_side
        recipient_side.provider_side = self

    def mutations(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _ in self.calls if m != "GET"]

    # -- routing ----------------------------------------------------------------------------------

    def _route_table(self) -> list[tuple[str, re.Pattern[str], Callable[..., Any], Callable[..., Answer]]]:
        from databricks.sdk.service import catalog as uc
        from databricks.sdk.service import pipelines as dlt
        from databricks.sdk.service import sharing

        u = "/api/2.1/unity-catalog"
        table = [
            ("GET", f"{u}/metastore_summary", uc.MetastoresAPI.summary, self._summary),
            ("POST", f"{u}/recipients", sharing.RecipientsAPI.create, self._create_recipient),
            ("GET", f"{u}/recipients/(?P<name>[^/]+)", sharing.RecipientsAPI.get, self._get_recipient),
            ("POST", f"{u}/shares", sharing.SharesAPI.create, self._create_share),
            ("GET", f"{u}/shares/(?P<name>[^/]+)", sharing.SharesAPI.get, self._get_share),
            ("PATCH", f"{u}/shares/(?P<name>[^/]+)", sharing.SharesAPI.update, self._update_share),
            ("GET", f"{u}/shares/(?P<name>[^/]+)/permissions", sharing.SharesAPI.share_permissions,
             self._share_permissions),
            ("PATCH", f"{u}/shares/(?P<name>[^/]+)/permissions", sharing.SharesAPI.update_permissions,
             self._update_share_permissions),
            ("GET", f"{u}/providers", sharing.ProvidersAPI.list, self._list_providers),
            ("GET", f"{u}/providers/(?P<name>[^/]+)", sharing.ProvidersAPI.get, self._get_provider),
            ("GET", f"{u}/providers/(?P<name>[^/]+)/shares", sharing.ProvidersAPI.list_shares,
             self._provider_shares),
            ("GET", f"{u}/catalogs/(?P<name>[^/]+)", uc.CatalogsAPI.get, self._get_catalog),
            ("POST", f"{u}/catalogs", uc.CatalogsAPI.create, self._create_catalog),
            ("PATCH", f"{u}/catalogs/(?P<name>[^/]+)", uc.CatalogsAPI.update, self._update_catalog),
            ("GET", f"{u}/schemas", uc.SchemasAPI.list, self._list_schemas),
            ("GET", f"{u}/schemas/(?P<full_name>[^/]+)", uc.SchemasAPI.get, self._get_schema),
            ("POST", f"{u}/schemas", uc.SchemasAPI.create, self._create_schema),
            ("PATCH", f"{u}/schemas/(?P<full_name>[^/]+)", uc.SchemasAPI.update, self._update_schema),
            ("GET", f"{u}/tables", uc.TablesAPI.list, self._list_tables),
            ("GET", f"{u}/tables/(?P<full_name>[^/]+)", uc.TablesAPI.get, self._get_table),
            ("GET", f"{u}/volumes", uc.VolumesAPI.list, self._list_volumes),
            ("GET", f"{u}/volumes/(?P<name>[^/]+)", uc.VolumesAPI.read, self._get_volume),
            ("POST", f"{u}/volumes", uc.VolumesAPI.create, self._create_volume),
            ("PATCH", f"{u}/volumes/(?P<name>[^/]+)", uc.VolumesAPI.update, self._update_volume),
            ("GET", f"{u}/external-locations", uc.ExternalLocationsAPI.list, self._list_locations),
            ("GET", f"{u}/external-locations/(?P<name>[^/]+)", uc.ExternalLocationsAPI.get, self._get_location),
            ("POST", f"{u}/external-locations", uc.ExternalLocationsAPI.create, self._create_location),
            ("PATCH", f"{u}/external-locations/(?P<name>[^/]+)", uc.ExternalLocationsAPI.update,
             self._update_location),
            ("GET", f"{u}/storage-credentials", uc.StorageCredentialsAPI.list, self._list_credentials),
            ("GET", f"{u}/storage-credentials/(?P<name>[^/]+)", uc.StorageCredentialsAPI.get,
             self._get_credential),
            ("POST", f"{u}/storage-credentials", uc.StorageCredentialsAPI.create, self._create_credential),
            ("GET", f"{u}/permissions/(?P<securable_type>[^/]+)/(?P<full_name>[^/]+)", uc.GrantsAPI.get,
             self._get_grants),
            ("PATCH", f"{u}/permissions/(?P<securable_type>[^/]+)/(?P<full_name>[^/]+)", uc.GrantsAPI.update,
             self._update_grants),
            ("GET", "/api/2.0/pipelines/(?P<pipeline_id>[^/]+)", dlt.PipelinesAPI.get, self._get_pipeline),
            ("GET", f"{u}/entity-tag-assignments/(?P<entity_type>[^/]+)/(?P<entity_name>[^/]+)/tags",
             uc.EntityTagAssignmentsAPI.list, self._list_tags),
            ("POST", f"{u}/entity-tag-assignments", uc.EntityTagAssignmentsAPI.create, self._create_tag),
            ("GET", f"{u}/entity-tag-assignments/(?P<entity_type>[^/]+)/(?P<entity_name>[^/]+)/tags/(?P<tag_key>[^/]+)",
             uc.EntityTagAssignmentsAPI.get, self._get_tag),
            ("PATCH", f"{u}/entity-tag-assignments/(?P<entity_type>[^/]+)/(?P<entity_name>[^/]+)/tags/(?P<tag_key>[^/]+)",
             uc.EntityTagAssignmentsAPI.update, self._update_tag),
        ]
        return [(m, re.compile(p + "$"), sdk, fn) for m, p, sdk, fn in table]

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Answer | None:
        from urllib.parse import unquote

        with self._lock:
            for prefix_key, n in list(self.fail_next.items()):
                if n and method == prefix_key[0] and path.startswith(prefix_key[1]):
                    self.fail_next[prefix_key] = n - 1
                    self.calls.append((method, path, body))
                    return 500, {"error_code": "INTERNAL_ERROR", "message": "injected failure"}
            for m, pattern, sdk, fn in self._routes:
                hit = pattern.match(path)
                if m != method or hit is None:
                    continue
                params = {k: unquote(v) for k, v in hit.groupdict().items()}
                payload = body if isinstance(body, dict) else {k: v[-1] for k, v in query.items()}
                if isinstance(body, dict) and query:
                    payload = {**{k: v[-1] for k, v in query.items()}, **body}
                try:
                    if sdk in body_models():
                        validate_body_model(sdk, params, body, {k: v[-1] for k, v in query.items()})
                        payload = {**{k: v[-1] for k, v in query.items()}, **body}
                    else:
                        validate_request(sdk, params, {k: v for k, v in payload.items() if k not in params})
                except Invalid as exc:
                    self.rejected.append(f"{method} {path}: {exc}")
                    return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": str(exc)}
                self.calls.append((method, path, payload))
                status, answer = fn(params, payload)
                if status == 200:
                    validate_answer(sdk, answer)
                return status, answer
        return None

    # -- metastore ---------------------------------------------------------------------------------

    def _summary(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        return 200, {"global_metastore_id": self.global_metastore_id, "metastore_id": f"id-{self.name}",
                     "name": f"metastore-{self.name}"}

    # -- sharing -----------------------------------------------------------------------------------

    def _create_recipient(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        name = b["name"]
        if name in self.recipients:
            return _exists(f"Recipient {name}")
        self.recipients[name] = {"name": name, "authentication_type": b["authentication_type"],
                                 "data_recipient_global_metastore_id": b.get("data_recipient_global_metastore_id")}
        other = self.recipient_side
        if other is not None and b.get("data_recipient_global_metastore_id") == other.global_metastore_id:
            provider = f"provider_{self.name}"
            other.providers.setdefault(provider, {"name": provider, "authentication_type": "DATABRICKS",
                                                  "data_provider_global_metastore_id": self.global_metastore_id})
        return 200, self.recipients[name]

    def _get_recipient(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.recipients.get(p["name"])
        return (200, found) if found else _not_found(f"Recipient {p['name']}")

    def _create_share(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        if b["name"] in self.shares:
            return _exists(f"Share {b['name']}")
        self.shares[b["name"]] = {"name": b["name"], "objects": []}
        return 200, {"name": b["name"]}

    def _get_share(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        share = self.shares.get(p["name"])
        if share is None:
            return _not_found(f"Share {p['name']}")
        return 200, share if str(b.get("include_shared_data", "")).lower() == "true" else {"name": share["name"]}

    def _update_share(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        share = self.shares.get(p["name"])
        if share is None:
            return _not_found(f"Share {p['name']}")
        for update in b.get("updates", []):
            obj = update["data_object"]
            names = [o["name"] for o in share["objects"]]
            if update["action"] == "ADD":
                if obj["name"] in names:
                    return 400, {"error_code": "INVALID_PARAMETER_VALUE",
                                 "message": f"{obj['name']} is already in share {p['name']}"}
                kind = obj.get("data_object_type")
                if kind == "SCHEMA" and obj["name"] not in self.schemas:
                    return _not_found(f"Schema {obj['name']}")
                share["objects"].append(dict(obj))
            elif update["action"] == "REMOVE":
                share["objects"] = [o for o in share["objects"] if o["name"] != obj["name"]]
        return 200, share

    def _share_permissions(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        grants = self.share_grants.get(p["name"], {})
        return 200, {"privilege_assignments": [{"principal": k, "privileges": sorted(v)} for k, v in grants.items()]}

    def _update_share_permissions(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        if p["name"] not in self.shares:
            return _not_found(f"Share {p['name']}")
        grants = self.share_grants.setdefault(p["name"], {})
        for change in b.get("changes", []):
            principal = change["principal"]
            if principal not in self.recipients:
                return _not_found(f"Recipient {principal}")
            grants.setdefault(principal, set()).update(change.get("add", []))
            grants[principal].difference_update(change.get("remove", []))
        return 200, {}

    def _list_providers(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        return 200, {"providers": list(self.providers.values())}

    def _get_provider(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.providers.get(p["name"])
        return (200, found) if found else _not_found(f"Provider {p['name']}")

    def _visible_shares(self, provider: str) -> list[str]:
        src = self.provider_side
        if src is None or provider not in self.providers:
            return []
        recipients = {n for n, r in src.recipients.items()
                      if r.get("data_recipient_global_metastore_id") == self.global_metastore_id}
        return sorted(s for s, g in src.share_grants.items() if any("SELECT" in g.get(r, set()) for r in recipients))

    def _provider_shares(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        if p["name"] not in self.providers:
            return _not_found(f"Provider {p['name']}")
        return 200, {"shares": [{"name": s} for s in self._visible_shares(p["name"])]}

    # -- catalogs and schemas --------------------------------------------------------------------

    def _get_catalog(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.catalogs.get(p["name"])
        return (200, found) if found else _not_found(f"Catalog '{p['name']}'")

    def _create_catalog(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        name = b["name"]
        if name in self.catalogs:
            return _exists(f"Catalog '{name}'")
        info: dict[str, Any] = {"name": name, "full_name": name, "catalog_type": "MANAGED_CATALOG"}
        if b.get("provider_name") or b.get("share_name"):
            provider, share = b.get("provider_name"), b.get("share_name")
            if provider not in self.providers:
                return _not_found(f"Provider {provider}")
            if share not in self._visible_shares(str(provider)):
                return 403, {"error_code": "PERMISSION_DENIED",
                             "message": f"Share {share} of provider {provider} is not shared with this metastore"}
            info.update(catalog_type="DELTASHARING_CATALOG", provider_name=provider, share_name=share)
        for key in ("comment", "properties", "storage_root", "options"):
            if key in b:
                info[key] = b[key]
        self.catalogs[name] = info
        return 200, info

    def _update_catalog(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        info = self.catalogs.get(p["name"])
        if info is None:
            return _not_found(f"Catalog '{p['name']}'")
        info.update({k: v for k, v in b.items() if k in ("comment", "properties", "owner")})
        return 200, info

    def _list_schemas(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        cat = b["catalog_name"]
        if cat not in self.catalogs:
            return _not_found(f"Catalog '{cat}'")
        return 200, {"schemas": [s for s in self.schemas.values() if s["catalog_name"] == cat]}

    def _get_schema(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.schemas.get(p["full_name"])
        return (200, found) if found else _not_found(f"Schema '{p['full_name']}'")

    def _create_schema(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        full = f"{b['catalog_name']}.{b['name']}"
        if b["catalog_name"] not in self.catalogs:
            return _not_found(f"Catalog '{b['catalog_name']}'")
        if full in self.schemas:
            return _exists(f"Schema '{full}'")
        self.schemas[full] = {"name": b["name"], "catalog_name": b["catalog_name"], "full_name": full,
                              **{k: b[k] for k in ("comment", "properties", "storage_root") if k in b}}
        return 200, self.schemas[full]

    def _update_schema(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        info = self.schemas.get(p["full_name"])
        if info is None:
            return _not_found(f"Schema '{p['full_name']}'")
        info.update({k: v for k, v in b.items() if k in ("comment", "properties", "owner")})
        return 200, info

    def _list_tables(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        if f"{b['catalog_name']}.{b['schema_name']}" not in self.schemas:
            return _not_found(f"Schema '{b['catalog_name']}.{b['schema_name']}'")
        return 200, {"tables": [t for t in self.tables.values() if t["catalog_name"] == b["catalog_name"]
                                and t["schema_name"] == b["schema_name"]]}

    def _get_table(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.tables.get(p["full_name"])
        return (200, found) if found else _not_found(f"Table '{p['full_name']}'")

    # -- volumes, locations, credentials ---------------------------------------------------------

    def _list_volumes(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        if f"{b['catalog_name']}.{b['schema_name']}" not in self.schemas:
            return _not_found(f"Schema '{b['catalog_name']}.{b['schema_name']}'")
        return 200, {"volumes": [v for v in self.volumes.values() if v["catalog_name"] == b["catalog_name"]
                                 and v["schema_name"] == b["schema_name"]]}

    def _get_volume(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.volumes.get(p["name"])
        return (200, found) if found else _not_found(f"Volume '{p['name']}'")

    def _create_volume(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        full = f"{b['catalog_name']}.{b['schema_name']}.{b['name']}"
        if f"{b['catalog_name']}.{b['schema_name']}" not in self.schemas:
            return _not_found(f"Schema '{b['catalog_name']}.{b['schema_name']}'")
        if full in self.volumes:
            return _exists(f"Volume '{full}'")
        if b["volume_type"] == "EXTERNAL" and not b.get("storage_location"):
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "an EXTERNAL volume needs storage_location"}
        self.volumes[full] = {"name": b["name"], "catalog_name": b["catalog_name"], "schema_name": b["schema_name"],
                              "full_name": full, "volume_type": b["volume_type"],
                              **{k: b[k] for k in ("comment", "storage_location") if k in b}}
        return 200, self.volumes[full]

    def _update_volume(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        info = self.volumes.get(p["name"])
        if info is None:
            return _not_found(f"Volume '{p['name']}'")
        info.update({k: v for k, v in b.items() if k in ("comment", "owner")})
        return 200, info

    def _list_locations(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        return 200, {"external_locations": list(self.external_locations.values())}

    def _get_location(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.external_locations.get(p["name"])
        return (200, found) if found else _not_found(f"External location '{p['name']}'")

    def _create_location(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        if b["name"] in self.external_locations:
            return _exists(f"External location '{b['name']}'")
        if b["credential_name"] not in self.storage_credentials:
            return _not_found(f"Storage credential '{b['credential_name']}'")
        self.external_locations[b["name"]] = {k: v for k, v in b.items()}
        return 200, self.external_locations[b["name"]]

    def _update_location(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        info = self.external_locations.get(p["name"])
        if info is None:
            return _not_found(f"External location '{p['name']}'")
        info.update({k: v for k, v in b.items() if k in ("comment", "url", "credential_name", "read_only", "owner")})
        return 200, info

    def _list_credentials(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        return 200, {"storage_credentials": list(self.storage_credentials.values())}

    def _get_credential(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.storage_credentials.get(p["name"])
        return (200, found) if found else _not_found(f"Storage credential '{p['name']}'")

    def _create_credential(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        if b["name"] in self.storage_credentials:
            return _exists(f"Storage credential '{b['name']}'")
        kinds = [k for k in ("aws_iam_role", "azure_managed_identity", "azure_service_principal",
                             "databricks_gcp_service_account", "cloudflare_api_token") if k in b]
        if len(kinds) != 1:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "exactly one credential kind is required"}
        self.storage_credentials[b["name"]] = dict(b)
        return 200, self.storage_credentials[b["name"]]

    # -- grants ----------------------------------------------------------------------------------

    def _get_grants(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        grants = self.grants.get((p["securable_type"], p["full_name"]), {})
        return 200, {"privilege_assignments": [{"principal": k, "privileges": sorted(v)}
                                               for k, v in sorted(grants.items())]}

    def _update_grants(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        grants = self.grants.setdefault((p["securable_type"], p["full_name"]), {})
        for change in b.get("changes", []):
            grants.setdefault(change["principal"], set()).update(change.get("add", []))
            grants[change["principal"]].difference_update(change.get("remove", []))
        return 200, {"privilege_assignments": [{"principal": k, "privileges": sorted(v)}
                                               for k, v in sorted(grants.items())]}

    # -- tags ------------------------------------------------------------------------------------

    def _entity_exists(self, entity_type: str, name: str) -> bool:
        if entity_type == "columns":
            table, _, column = name.rpartition(".")
            return any(c["name"] == column for c in self.tables.get(table, {}).get("columns", []))
        store = {"catalogs": self.catalogs, "schemas": self.schemas, "tables": self.tables,
                 "volumes": self.volumes}.get(entity_type)
        if store is None:
            raise Invalid(f"entity_type: {entity_type!r} is not one of catalogs, columns, schemas, tables, volumes")
        return name in store

    def _tagged(self, entity_type: str, name: str) -> tuple[Answer | None, dict[str, dict[str, Any]]]:
        try:
            exists = self._entity_exists(entity_type, name)
        except Invalid as exc:
            return (400, {"error_code": "INVALID_PARAMETER_VALUE", "message": str(exc)}), {}
        if not exists:
            return _not_found(f"{entity_type[:-1].capitalize()} '{name}'"), {}
        return None, self.tags.setdefault((entity_type, name), {})

    def _list_tags(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        error, tags = self._tagged(p["entity_type"], p["entity_name"])
        return error or (200, {"tag_assignments": list(tags.values())})

    def _create_tag(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        if "source_type" in b or "update_time" in b or "updated_by" in b:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "source_type, update_time and "
                         "updated_by are output only"}
        error, tags = self._tagged(b["entity_type"], b["entity_name"])
        if error:
            return error
        if b["tag_key"] in tags:
            return _exists(f"Tag assignment {b['tag_key']} on {b['entity_name']}")
        tags[b["tag_key"]] = {k: b[k] for k in ("entity_type", "entity_name", "tag_key", "tag_value") if k in b}
        return 200, tags[b["tag_key"]]

    def _get_tag(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        error, tags = self._tagged(p["entity_type"], p["entity_name"])
        if error:
            return error
        found = tags.get(p["tag_key"])
        return (200, found) if found else _not_found(f"Tag assignment {p['tag_key']} on {p['entity_name']}")

    def _update_tag(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        error, tags = self._tagged(p["entity_type"], p["entity_name"])
        if error:
            return error
        if p["tag_key"] not in tags:
            return _not_found(f"Tag assignment {p['tag_key']} on {p['entity_name']}")
        if (b["entity_type"], b["entity_name"], b["tag_key"]) != (p["entity_type"], p["entity_name"], p["tag_key"]):
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "the body names another tag assignment"}
        if b["update_mask"] not in ("tag_value", "*"):
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "only tag_value can be updated"}
        tags[p["tag_key"]]["tag_value"] = b.get("tag_value")
        return 200, tags[p["tag_key"]]

    # -- pipelines -------------------------------------------------------------------------------

    def _get_pipeline(self, p: dict[str, str], b: dict[str, Any]) -> Answer:
        found = self.pipelines.get(p["pipeline_id"])
        return (200, found) if found else _not_found(f"Pipeline {p['pipeline_id']}")
