"""The control API's request body (``POST /api/continuous-sync``) as an OpenAPI 3.0 schema,
generated from :class:`~lakemirror.daemon.settings.pipeline.Settings`: the body is the pipeline's
YAML as JSON, so the schema is the model's, without the daemon's own blocks and with
``checkpoint_volume`` optional (the daemon supplies ``<its checkpoint_volume>/api``).

Pydantic writes JSON Schema 2020-12; OpenAPI 3.0 spells an optional value ``nullable: true``
instead of a ``{"type": "null"}`` alternative and keeps shared models under
``components/schemas``, which is what :func:`to_openapi` rewrites.
"""

from __future__ import annotations

from typing import Any

from lakemirror.daemon.settings.pipeline import DAEMON_ONLY_KEYS, Settings

_REF_PREFIX = "#/components/schemas/"


def to_openapi(node: Any) -> Any:
    """A JSON Schema 2020-12 fragment as OpenAPI 3.0 writes it."""
    if isinstance(node, list):
        return [to_openapi(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_openapi(v) for k, v in node.items() if k not in ("$defs", "title")}
    for key in ("anyOf", "oneOf"):
        options = out.get(key)
        if isinstance(options, list) and {"type": "null"} in options:
            rest = [o for o in options if o != {"type": "null"}]
            del out[key]
            out.update(rest[0] if len(rest) == 1 else {key: rest})
            out["nullable"] = True
    if "const" in out:  # OpenAPI 3.0 has no const: a one-value enum says the same
        out["enum"] = [out.pop("const")]
    return out


def pipeline_settings_schemas() -> dict[str, Any]:
    """``PipelineSettings`` (the request body) and the models it refers to, by name, for
    ``components/schemas``."""
    schema = Settings.model_json_schema(ref_template=_REF_PREFIX + "{model}", mode="validation")
    components: dict[str, Any] = {name: to_openapi(s) for name, s in schema.pop("$defs", {}).items()}
    body = to_openapi(schema)
    for key in DAEMON_ONLY_KEYS:
        body["properties"].pop(key)
    body["required"] = [f for f in body.get("required", []) if f != "checkpoint_volume"]
    body["description"] = (
        "The settings of the pipeline YAML (docs/configuration.md) except " + ", ".join(DAEMON_ONLY_KEYS)
        + ", which are the daemon's. checkpoint_volume may be left out here (unlike in the YAML): it defaults to "
        "<the daemon's checkpoint_volume>/api, so the pipeline's folder is <checkpoint_volume>/api/<pipeline_id>.")
    used = _refs(body)
    while True:  # the models the body reaches, and the ones they reach
        more = set().union(*(_refs(components[name]) for name in used)) - used
        if not more:
            break
        used |= more
    return {"PipelineSettings": body, **{name: components[name] for name in sorted(used)}}


def _refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(_refs(x) for x in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["$ref"][len(_REF_PREFIX):]} if isinstance(node.get("$ref"), str) else set()
    return found.union(*(_refs(v) for v in node.values()))
