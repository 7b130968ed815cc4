"""docs/configuration.md is rendered from the settings models and cannot drift from them."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from lakemirror.daemon.settings import docs as config_docs

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_reference_is_the_rendered_models() -> None:
    written = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert written == config_docs.render(), (
        "docs/configuration.md differs from the settings models: run "
        "`.venv/bin/python -m lakemirror.daemon.settings.docs > docs/configuration.md`")


def test_every_setting_has_help_text() -> None:
    undocumented = [path for path, _, _, help_text in config_docs.rows(_settings()) if not help_text.strip()]
    assert not undocumented, f"give these fields a description=...: {undocumented}"


def test_nested_models_defaults_bounds_and_types_are_rendered() -> None:
    class Inner(BaseModel):
        """An inner block."""
        size: int = Field(3, ge=1, le=9, description="How many.")

    class Outer(BaseModel):
        mode: bool = Field(False, description="A switch.")
        items: list[Inner] = Field(default_factory=list, description="Entries.")
        named: dict[str, Inner] = Field(default_factory=dict, description="By name.")

    table = config_docs.render(Outer)
    assert "| `mode` | boolean | `false` | A switch. |" in table
    assert "| `items[].size` | integer (>= 1, <= 9) | `3` | How many. |" in table
    assert "| `named.<name>.size` | integer (>= 1, <= 9) | `3` | How many. |" in table


def _settings() -> type[BaseModel]:
    from lakemirror.daemon.settings import Settings
    return Settings


def test_a_tagged_union_lists_each_kinds_fields() -> None:
    from typing import Annotated, Literal, Union

    class Plain(BaseModel):
        kind: Literal["plain"] = "plain"

    class Remote(BaseModel):
        kind: Literal["remote"]
        host: str = Field(min_length=1, description="Where.")

    class Outer(BaseModel):
        target: Annotated[Union[Plain, Remote], Field(discriminator="kind")] = Field(
            default_factory=Plain, description="Where to.")

    table = config_docs.render(Outer)
    assert "| `target` | one of `kind: plain` \\| `kind: remote` | `{kind: plain}` | Where to. |" in table
    assert "| `target.host` | string (at least 1 characters) | required | (`kind: remote`) Where. |" in table


def test_the_api_request_body_schema_is_the_settings_model() -> None:
    import json

    from lakemirror.daemon.openapi import document
    from lakemirror.daemon.settings import Settings
    from lakemirror.daemon.settings.pipeline import DAEMON_ONLY_KEYS

    schemas = document()["components"]["schemas"]
    body = schemas["PipelineSettings"]
    assert set(body["properties"]) == set(Settings.model_fields) - set(DAEMON_ONLY_KEYS)
    assert set(body["required"]) == {"source_catalog", "destination_catalog", "schema_name"}
    assert body["properties"]["trigger_interval_seconds"]["description"] == \
        Settings.model_fields["trigger_interval_seconds"].description
    text = json.dumps(schemas)
    assert '"type": "null"' not in text and "$defs" not in text, "OpenAPI 3.0 spells these otherwise"
    refs = {part.split('"')[0] for part in text.split('"$ref": "#/components/schemas/')[1:]}
    assert refs <= set(schemas), refs - set(schemas)


def test_a_field_is_listed_under_the_name_a_yaml_file_gives_it() -> None:
    """``destination.schema`` is what a pipeline file says (the attribute is ``target_schema``)."""
    from lakemirror.daemon.settings import load_settings

    paths = {path: help_text for path, _, _, help_text in config_docs.rows(_settings())}
    assert "destination.schema" in paths and "destination.target_schema" not in paths
    assert "Also accepted as `target_schema`" in paths["destination.schema"]
    base = {"source_catalog": "s", "destination_catalog": "d", "schema_name": "x", "checkpoint_volume": "/tmp/c"}
    for key in ("schema", "target_schema"):
        settings = load_settings(None, {**base, "destination": {"kind": "postgres", "host": "h", "database": "db",
                                                                "user": "u", key: "replicas"}})
        assert settings.destination.target_schema == "replicas"  # type: ignore[union-attr]
