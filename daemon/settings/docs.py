"""The configuration reference, rendered from the settings models themselves.

``docs/configuration.md`` is this module's output (``python -m lakemirror.daemon.settings.docs``
writes it; a unit test fails when the file and the models disagree), so a field's name, type,
default and help text are written once, on the model, and the reference cannot drift from them.
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any, Iterator, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

INTRO = """# Configuration reference

Generated from the settings models (`python -m lakemirror.daemon.settings.docs > docs/configuration.md`);
do not edit by hand. A pipeline is a YAML file; environment variables override it
(`LAKEMIRROR_<FIELD>`, nested with `__`: `LAKEMIRROR_RUNTIME__MASTER=local[4]`), and command-line
flags override both (`--set runtime.master=local[4]`). `lakemirror validate FILE` reports every
problem with where it came from and exits 2; `run` starts nothing while any remains.

Names in a variable are matched in any case, except the keys of a mapping, which are kept as
written (`LAKEMIRROR_RUNTIME__SPARK_CONF__spark.driver.maxResultSize=1g`). A list, a mapping or a
block of settings given whole in a variable is JSON (`LAKEMIRROR_TABLES='["orders"]'`); a value
that is not JSON, or an object naming a key twice, is refused naming the variable.

Limits: the file is a regular UTF-8 file of at most 1 MiB whose mappings and lists nest at most 32
levels, and names no key twice in one mapping; catalog, schema, table, column, topic and other names
have at most 255 characters, paths, URLs and patterns at most 4096, secrets at most 16384; durations
and other fields have the upper bounds shown below. A file none of
whose top-level keys is a setting is refused as not a configuration, without quoting it; messages
quote at most a few hundred characters of a value, with credentials masked.
"""


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names) + (" or unset" if type(None) in args else "")
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_type_name(args[1])}" if len(args) == 2 else "mapping"
    if annotation is SecretStr:
        return "secret string"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return ""
        if isinstance(value, BaseModel):
            kind = getattr(value, "kind", None)
            return f"`{{kind: {kind}}}`" if isinstance(kind, str) else "see below"
        return f"`{value!r}`" if value not in ([], {}, ()) else "empty"
    value = info.default
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, SecretStr):
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`" if not isinstance(value, str) else f"`{value!r}`" if value == "" else f"`{value}`"


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The model a field holds and how its fields are addressed under it: ``.`` directly or
    optionally, ``[].`` as list items, ``.<name>.`` as the values of a mapping."""
    if _is_model(annotation):
        return annotation, "."
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (list, tuple) and args and _is_model(args[0]):
        return args[0], "[]."
    if origin is dict and len(args) == 2 and _is_model(args[1]):
        return args[1], ".<name>."
    if origin in (Union, types.UnionType):
        models = [a for a in args if _is_model(a)]
        if len(models) == 1:
            return models[0], "."
    return None, "."


def _bounds(info: FieldInfo) -> str:
    text = info.annotation is str or (get_origin(info.annotation) in (Union, types.UnionType)
                                      and str in get_args(info.annotation))
    unit = " characters" if text else " items"
    words = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "at least", "max_length": "at most"}
    parts = []
    for item in info.metadata:
        for attr, word in words.items():
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{word} {value}" + (unit if attr.endswith("length") else ""))
    return f" ({', '.join(parts)})" if parts else ""


def _variants(annotation: Any) -> list[type[BaseModel]]:
    """The models of a union of several (a tagged union such as ``destination``), else []."""
    if get_origin(annotation) in (Union, types.UnionType):
        models = [a for a in get_args(annotation) if _is_model(a)]
        if len(models) > 1:
            return models
    return []


def _kind(model: type[BaseModel]) -> str:
    """A variant's tag: the default (or only) value of its ``kind`` field, else its name."""
    kind = model.model_fields.get("kind")
    if kind is not None:
        if isinstance(kind.default, str):
            return kind.default
        args = get_args(kind.annotation)
        if args:
            return str(args[0])
    return model.__name__


def rows(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(path, type, default, help) for every field of ``model``, nested models flattened; the
    fields of each variant of a tagged union are listed under the variant's ``kind``."""
    for name, info in model.model_fields.items():
        # A field is written under its alias in the YAML (``schema``, whose attribute is
        # ``target_schema``); the attribute's name is accepted too.
        path = f"{prefix}{info.alias or name}"
        sub, joint = _model_of(info.annotation)
        help_text = " ".join((info.description or "").split())
        if info.alias and info.alias != name:
            help_text = f"{help_text} Also accepted as `{name}`.".strip()
        variants = _variants(info.annotation)
        if variants:
            kinds = " \\| ".join(f"`kind: {_kind(v)}`" for v in variants)
            yield path, f"one of {kinds}", _default(info), help_text
            for variant in variants:
                for sub_path, type_name, default, sub_help in rows(variant, f"{path}."):
                    if sub_path != f"{path}.kind":
                        yield sub_path, type_name, default, f"(`kind: {_kind(variant)}`) {sub_help}".strip()
        elif sub is not None:
            doc_lines = (sub.__doc__ or "").strip().splitlines()
            kind = {"[].": "list of mappings", ".<name>.": "mapping of names to mappings"}.get(joint, "mapping")
            yield (path, kind, _default(info),
                   help_text or (doc_lines[0] if doc_lines else "Its fields follow."))
            yield from rows(sub, f"{path}{joint}")
        else:
            yield path, _type_name(info.annotation) + _bounds(info), _default(info), help_text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(model: type[BaseModel] | None = None) -> str:
    if model is None:
        from lakemirror.daemon.settings import Settings
        model = Settings
    out = [INTRO, "| Setting | Type | Default | Meaning |", "|---|---|---|---|"]
    for path, type_name, default, help_text in rows(model):
        out.append(f"| `{path}` | {type_name} | {default} | {_cell(help_text)} |")
    return "\n".join(out) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
