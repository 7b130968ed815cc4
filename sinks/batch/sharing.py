"""Delta Sharing set-up for replication across metastores, automatic or over an existing set-up.

Databricks-to-Databricks sharing, through databricks-sdk: on the source workspace a recipient for the
target's metastore (``recipients``), a share (``shares``) holding the source schemas, granted to the
recipient; on the target workspace the provider that the recipient makes appear there (``providers``)
and a catalog created from the share (``catalogs.create(provider_name=…, share_name=…)``).
Replication then deep clones from that shared catalog into the target catalog.

:func:`plan_sharing` is pure: from what is wanted (:class:`SharingSpec`) and what was found
(:class:`Observed`) it gives the steps still missing, so a second run changes nothing and a set-up
left half done (a run killed between two steps, or made by hand) is completed, never duplicated. What
cannot be completed without destroying something (a recipient of that name for another metastore,
a catalog of that name that is not the share's) is refused with what to change. With
``mode: existing`` nothing is created: a missing part is an error naming it.

:class:`DeltaSharingSetup` observes both workspaces, plans and applies. SDK errors are translated
here once: not found is an answer, permission errors and conflicts are terminal (a person must act),
anything else transient (the batch runner retries with backoff; each retry observes again).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence, TypeVar

from lakemirror.errors import TerminalError, TransientError

if TYPE_CHECKING:
    from databricks.sdk import WorkspaceClient

log = logging.getLogger(__name__)

Mode = Literal["automatic", "existing"]
T = TypeVar("T")


@dataclass(frozen=True)
class SharingSpec:
    """What one source catalog's set-up must be."""

    recipient: str
    share: str
    source_catalog: str
    schemas: tuple[str, ...]        # schema names of source_catalog
    shared_catalog: str             # created on the target from the share
    provider: str | None = None     # the target's provider; default the one of the source's metastore
    mode: Mode = "automatic"
    history: bool = True            # share with history: time travel and the change feed


@dataclass(frozen=True)
class Observed:
    """What the two workspaces hold now (None: absent)."""

    source_metastore: str
    target_metastore: str
    recipient_metastore: str | None = None   # the recipient's data_recipient_global_metastore_id
    recipient_exists: bool = False
    share_exists: bool = False
    shared_objects: frozenset[str] = frozenset()
    granted: bool = False
    provider: str | None = None               # the provider found on the target
    provider_metastore: str | None = None     # its data_provider_global_metastore_id
    catalog_exists: bool = False
    catalog_source: tuple[str | None, str | None] = (None, None)  # (provider_name, share_name)


@dataclass(frozen=True)
class Step:
    action: Literal["create_recipient", "create_share", "add_schemas", "grant", "create_catalog"]
    detail: Mapping[str, Any] = field(default_factory=dict)


class SharingConflict(TerminalError):
    code = "sharing_conflict"


class SharingMissing(TerminalError):
    code = "sharing_missing"


class ProviderNotVisible(TransientError):
    code = "provider_not_visible"


def plan_sharing(spec: SharingSpec, seen: Observed) -> list[Step]:
    """The steps still missing, in order (see the module docstring). Pure."""
    if seen.source_metastore == seen.target_metastore:
        raise SharingConflict(f"the source and target workspaces share the metastore {seen.source_metastore}: "
                              f"replicate within it (no Delta Sharing), or name another target workspace")
    if seen.recipient_exists and seen.recipient_metastore != seen.target_metastore:
        raise SharingConflict(f"recipient {spec.recipient!r} exists for metastore {seen.recipient_metastore}, not the "
                              f"target's {seen.target_metastore}; name another recipient")
    if spec.provider is not None and seen.provider is not None and seen.provider_metastore not in (
            None, seen.source_metastore):
        raise SharingConflict(f"provider {spec.provider!r} on the target is metastore {seen.provider_metastore}, "
                              f"not the source's {seen.source_metastore}")
    provider_of_catalog, share_of_catalog = seen.catalog_source
    if seen.catalog_exists and (share_of_catalog != spec.share
                                or (seen.provider is not None and provider_of_catalog != seen.provider)):
        raise SharingConflict(f"catalog {spec.shared_catalog!r} exists on the target but is not the catalog of share "
                              f"{spec.share!r} (it is "
                              f"{f'{provider_of_catalog}/{share_of_catalog}' if share_of_catalog else 'a catalog of its own'}"
                              f"); name another shared_catalog")
    steps: list[Step] = []
    if not seen.recipient_exists:
        steps.append(Step("create_recipient", {"name": spec.recipient, "metastore": seen.target_metastore}))
    if not seen.share_exists:
        steps.append(Step("create_share", {"name": spec.share}))
    missing = [s for s in spec.schemas if f"{spec.source_catalog}.{s}" not in seen.shared_objects]
    if missing:
        steps.append(Step("add_schemas", {"share": spec.share,
                                          "schemas": [f"{spec.source_catalog}.{s}" for s in missing]}))
    if not seen.granted:
        steps.append(Step("grant", {"share": spec.share, "recipient": spec.recipient}))
    if not seen.catalog_exists:
        steps.append(Step("create_catalog", {"name": spec.shared_catalog, "share": spec.share}))
    if spec.mode == "existing" and steps:
        raise SharingMissing("mode existing: the Delta Sharing set-up is incomplete, and nothing is created in this "
                             "mode: " + "; ".join(_describe(s) for s in steps)
                             + ". Create them, or set delta_sharing.mode: automatic")
    return steps


def _describe(step: Step) -> str:
    d = step.detail
    return {"create_recipient": lambda: f"no recipient {d['name']!r} for metastore {d['metastore']}",
            "create_share": lambda: f"no share {d['name']!r}",
            "add_schemas": lambda: f"share {d['share']!r} lacks {', '.join(d['schemas'])}",
            "grant": lambda: f"share {d['share']!r} is not granted to {d['recipient']!r}",
            "create_catalog": lambda: f"no catalog {d['name']!r} from share {d['share']!r} on the target"}[step.action]()


#: What a permission error of the set-up tells the principal it needs.
SHARING_NEEDS = "metastore admin, or CREATE_RECIPIENT, CREATE_SHARE, USE_PROVIDER, CREATE_CATALOG"


def _sdk(what: str, call: Callable[[], T], needs: str = SHARING_NEEDS) -> T:
    """``call()``, its SDK errors translated (not found is raised as ``NotFound`` for the caller);
    a permission error names ``needs``, the privileges the caller's operation uses."""
    from databricks.sdk.errors.base import DatabricksError
    from databricks.sdk.errors.platform import NotFound, PermissionDenied, ResourceConflict
    from databricks.sdk.errors.platform import BadRequest, Unauthenticated

    try:
        return call()
    except NotFound:
        raise
    except (PermissionDenied, Unauthenticated) as exc:
        raise TerminalError(f"{what}: permission denied ({exc}); the principal needs {needs}") from exc
    except (ResourceConflict, BadRequest) as exc:
        raise SharingConflict(f"{what}: {exc}") from exc
    except (DatabricksError, OSError) as exc:
        raise TransientError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _absent(what: str, call: Callable[[], T], needs: str = SHARING_NEEDS) -> T | None:
    from databricks.sdk.errors import NotFound

    try:
        return _sdk(what, call, needs)
    except NotFound:
        return None


class DeltaSharingSetup:
    """Observes, plans and applies one catalog's set-up on two workspaces."""

    def __init__(self, source: "WorkspaceClient", target: "WorkspaceClient") -> None:
        self.source = source
        self.target = target

    def observe(self, spec: SharingSpec) -> Observed:
        src_ms = str(_sdk("source metastore", lambda: self.source.metastores.summary()).global_metastore_id)
        dst_ms = str(_sdk("target metastore", lambda: self.target.metastores.summary()).global_metastore_id)
        recipient = _absent(f"recipient {spec.recipient}", lambda: self.source.recipients.get(spec.recipient))
        share = _absent(f"share {spec.share}", lambda: self.source.shares.get(spec.share, include_shared_data=True))
        granted = False
        if share is not None:
            perms = _sdk(f"share {spec.share} permissions", lambda: self.source.shares.share_permissions(spec.share))
            granted = any(a.principal == spec.recipient and "SELECT" in [str(getattr(p, "value", p))
                                                                         for p in (a.privileges or [])]
                          for a in (perms.privilege_assignments or []))
        provider_name, provider_ms = self._provider(spec, src_ms)
        catalog = _absent(f"catalog {spec.shared_catalog}", lambda: self.target.catalogs.get(spec.shared_catalog))
        return Observed(
            source_metastore=src_ms, target_metastore=dst_ms,
            recipient_exists=recipient is not None,
            recipient_metastore=recipient.data_recipient_global_metastore_id if recipient is not None else None,
            share_exists=share is not None,
            shared_objects=frozenset(o.name for o in (share.objects or []) if o.name) if share is not None else frozenset(),
            granted=granted, provider=provider_name, provider_metastore=provider_ms,
            catalog_exists=catalog is not None,
            catalog_source=(catalog.provider_name, catalog.share_name) if catalog is not None else (None, None))

    def _provider(self, spec: SharingSpec, source_metastore: str) -> tuple[str | None, str | None]:
        if spec.provider is not None:
            found = _absent(f"provider {spec.provider}", lambda: self.target.providers.get(spec.provider or ""))
            return (found.name, found.data_provider_global_metastore_id) if found is not None else (None, None)
        for p in _sdk("providers", lambda: list(self.target.providers.list())):
            if p.data_provider_global_metastore_id == source_metastore:
                return p.name, p.data_provider_global_metastore_id
        return None, None

    def apply(self, spec: SharingSpec) -> dict[str, Any]:
        """Complete the set-up; the steps taken (none when it was complete)."""
        from databricks.sdk.service import sharing

        seen = self.observe(spec)
        steps = plan_sharing(spec, seen)
        done: list[str] = []
        for step in steps:
            d = step.detail
            if step.action == "create_recipient":
                self._create(f"recipient {d['name']}", lambda: self.source.recipients.create(
                    d["name"], sharing.AuthenticationType.DATABRICKS,
                    data_recipient_global_metastore_id=d["metastore"],
                    comment="lakemirror: disaster-recovery replication"))
            elif step.action == "create_share":
                self._create(f"share {d['name']}", lambda: self.source.shares.create(
                    d["name"], comment="lakemirror: disaster-recovery replication"))
            elif step.action == "add_schemas":
                history = (sharing.SharedDataObjectHistoryDataSharingStatus.ENABLED if spec.history
                           else sharing.SharedDataObjectHistoryDataSharingStatus.DISABLED)
                updates = [sharing.SharedDataObjectUpdate(
                    action=sharing.SharedDataObjectUpdateAction.ADD,
                    data_object=sharing.SharedDataObject(
                        name=name, data_object_type=sharing.SharedDataObjectDataObjectType.SCHEMA,
                        history_data_sharing_status=history)) for name in d["schemas"]]
                _sdk(f"share {d['share']}: add {', '.join(d['schemas'])}",
                     lambda: self.source.shares.update(d["share"], updates=updates))
            elif step.action == "grant":
                _sdk(f"share {d['share']}: grant to {d['recipient']}", lambda: self.source.shares.update_permissions(
                    d["share"], changes=[sharing.PermissionsChange(principal=d["recipient"], add=["SELECT"])]))
            elif step.action == "create_catalog":
                provider = seen.provider or self._provider(spec, seen.source_metastore)[0]
                if provider is None:
                    raise ProviderNotVisible(
                        f"the target workspace shows no provider for the source metastore {seen.source_metastore} yet "
                        f"(it appears once the recipient exists); retried")
                self._create(f"catalog {d['name']}", lambda: self.target.catalogs.create(
                    d["name"], provider_name=provider, share_name=d["share"],
                    comment=f"lakemirror: share {d['share']} of {spec.source_catalog}"))
            done.append(_describe(step))
            log.info("delta sharing %s: %s", spec.source_catalog, step.action)
        return {"share": spec.share, "recipient": spec.recipient, "shared_catalog": spec.shared_catalog,
                "steps": [s.action for s in steps], "completed": done}

    @staticmethod
    def _create(what: str, call: Callable[[], Any]) -> None:
        """Create, treating "already exists" as done (a concurrent or earlier run made it)."""
        from databricks.sdk.errors import ResourceAlreadyExists
        from databricks.sdk.errors.platform import AlreadyExists

        try:
            _sdk(what, call)
        except SharingConflict as exc:
            if isinstance(exc.__cause__, (ResourceAlreadyExists, AlreadyExists)):
                return
            raise


def schemas_of(client: "WorkspaceClient", catalog: str, selected: Callable[[str], bool]) -> tuple[str, ...]:
    """The schemas of ``catalog`` on ``client``'s metastore that ``selected`` keeps (never information_schema)."""
    names = [s.name for s in _sdk(f"schemas of {catalog}", lambda: list(client.schemas.list(catalog)))]
    return tuple(sorted(n for n in names if n and n != "information_schema" and selected(n)))


def sharing_specs(catalogs: Sequence[tuple[str, tuple[str, ...]]], *, recipient: str, share: str, shared_catalog: str,
                  provider: str | None, mode: Mode, history: bool) -> list[SharingSpec]:
    """One spec per (source catalog, its schemas); ``share`` and ``shared_catalog`` may hold ``{catalog}``."""
    return [SharingSpec(recipient=recipient, share=share.format(catalog=c), source_catalog=c, schemas=s,
                        shared_catalog=shared_catalog.format(catalog=c), provider=provider, mode=mode,
                        history=history) for c, s in catalogs]


class SharingOperations:
    """The ``delta_sharing`` operation of the batch runner: one catalog's set-up per job, its spec in
    ``job.settings.options["delta_sharing"]`` (``schemas`` listed on the source at run time from the
    ``include``/``exclude`` patterns). ``setup`` builds the two workspaces' clients when first needed."""

    def __init__(self, setup: Callable[[], DeltaSharingSetup]) -> None:
        self._setup = setup
        self._built: DeltaSharingSetup | None = None

    @property
    def setup(self) -> DeltaSharingSetup:
        if self._built is None:
            self._built = self._setup()
        return self._built

    def run(self, operation: str, job: Any, tag: str) -> Mapping[str, Any]:
        import fnmatch

        o = dict(job.settings.options.get("delta_sharing", {}))
        include, exclude = o.get("include"), tuple(o.get("exclude", ()))

        def selected(name: str) -> bool:
            if any(fnmatch.fnmatchcase(name, p) for p in exclude):
                return False
            return include is None or any(fnmatch.fnmatchcase(name, p) for p in include)

        catalog = str(o["source_catalog"])
        spec = SharingSpec(recipient=str(o["recipient"]), share=str(o["share"]), source_catalog=catalog,
                           schemas=schemas_of(self.setup.source, catalog, selected),
                           shared_catalog=str(o["shared_catalog"]), provider=o.get("provider"),
                           mode=o.get("mode", "automatic"), history=bool(o.get("history", True)))
        if not spec.schemas:
            raise SharingMissing(f"catalog {catalog}: no schema of the source workspace is selected "
                                 f"(include_schemas / exclude_schemas / --target-schemas)")
        return {**self.setup.apply(spec), "schemas": list(spec.schemas)}

    def cancel(self, tag: str) -> None:
        pass  # SDK calls are short; the attempt ends at its next call


def add_schemas(client: "WorkspaceClient", share: str, schemas: Sequence[str], *, history: bool = True) -> list[str]:
    """Add the schemas (``catalog.schema``) the share lacks; the ones added (idempotent)."""
    from databricks.sdk.service import sharing

    found = _absent(f"share {share}", lambda: client.shares.get(share, include_shared_data=True))
    if found is None:
        raise SharingMissing(f"share {share!r} does not exist on the source workspace; configure delta_sharing "
                             f"(mode automatic creates it) or create it")
    present = {o.name for o in (found.objects or [])}
    missing = [s for s in dict.fromkeys(schemas) if s not in present]
    if missing:
        status = (sharing.SharedDataObjectHistoryDataSharingStatus.ENABLED if history
                  else sharing.SharedDataObjectHistoryDataSharingStatus.DISABLED)
        updates = [sharing.SharedDataObjectUpdate(
            action=sharing.SharedDataObjectUpdateAction.ADD, data_object=sharing.SharedDataObject(
                name=s, data_object_type=sharing.SharedDataObjectDataObjectType.SCHEMA,
                history_data_sharing_status=status)) for s in missing]
        _sdk(f"share {share}: add {', '.join(missing)}", lambda: client.shares.update(share, updates=updates))
    return missing
