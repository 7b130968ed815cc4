"""Settings from ``LAKEMIRROR_*`` environment variables: names matched in any case, mapping keys
kept as written, JSON values checked, and every bad value named by its variable.

pydantic-settings, matching names without regard to case, lower-cases the whole variable name, so
``LAKEMIRROR_RUNTIME__SPARK_CONF__spark.driver.maxResultSize=1g`` reached Spark as
``spark.driver.maxresultsize``, a conf Spark does not know (ignored, and its value unchecked).
Here each part of a name that names a field is matched in any case and written as the field's
name, and a part that is a key of a mapping (a Spark conf, a table property, a table's name) is
kept exactly as written; the variables are then read case-sensitively.

A value for a list, a mapping or a block of settings is JSON; one that is not JSON, or whose
object names a key twice, is a :class:`EnvValueError` naming the variable (pydantic-settings
raised a ``SettingsError`` that named only the field, as a traceback).
"""

from __future__ import annotations

import json
import os
import typing
from typing import Any, Mapping

from pydantic import BaseModel
from pydantic_settings import BaseSettings, EnvSettingsSource
from pydantic_settings import SettingsError


class EnvValueError(Exception):
    """Environment variables whose values cannot be read: ``problems`` as (variable, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{var}: {msg}" for var, msg in problems))
        self.problems = problems


class _DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"the key {key[:80]!r} appears twice in one JSON object; keep one")
        out[key] = value
    return out


def loads(text: str) -> Any:
    """JSON refusing an object that names a key twice (``ValueError``)."""
    return json.loads(text, object_pairs_hook=_unique)


def _members(annotation: Any) -> list[Any]:
    """The types a field may hold: ``X | None`` -> [X]; an ``Annotated`` union -> its members."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        return [m for arg in typing.get_args(annotation) if arg is not type(None) for m in _members(arg)]
    return [annotation]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _is_mapping(t: Any) -> bool:
    return typing.get_origin(t) in (dict, Mapping) or t is dict


def _is_complex(annotation: Any) -> bool:
    """Whether pydantic-settings reads a variable of this type as JSON (a model, mapping or collection)."""
    return any(_is_model(t) or _is_mapping(t) or typing.get_origin(t) in (list, tuple, set, frozenset)
               or t in (list, tuple, set, frozenset) for t in _members(annotation))


def resolve(model: type[BaseModel], parts: list[str]) -> tuple[list[str], Any] | None:
    """``parts`` of a variable's name (after the prefix, split at ``__``) with each field name in its
    own case and mapping keys as written, and the annotation of what the variable sets; None when
    the name sets no field (those are warned about: :mod:`lakemirror.daemon.env_check`)."""
    names: list[str] = []
    annotation: Any = model
    for part in parts:
        found = None
        for t in _members(annotation):
            if _is_model(t):
                name = next((n for n in t.model_fields if n.lower() == part.lower()), None)
                if name is not None:
                    found = (name, t.model_fields[name].annotation)
                    break
            elif _is_mapping(t):
                args = typing.get_args(t)
                found = (part, args[-1] if args else Any)
                break
        if found is None:
            return None
        names.append(found[0])
        annotation = found[1]
    return names, annotation


def _json_hint(var: str, annotation: Any) -> str:
    kinds = _members(annotation)
    if any(_is_model(t) for t in kinds):
        return (f"a block of settings is a JSON object, e.g. {var}='{{\"port\": 9464}}', or set one field at a "
                f"time: {var}__<FIELD>=<value>")
    if any(_is_mapping(t) for t in kinds):
        return f"a mapping is a JSON object, e.g. {var}='{{\"key\": \"value\"}}', or set one key: {var}__<KEY>=<value>"
    return f"a list is a JSON array, e.g. {var}='[\"id\"]'"


class LakemirrorEnvSource(EnvSettingsSource):
    """The ``LAKEMIRROR_*`` variables as a settings source (see the module's docstring)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        config = settings_cls.model_config
        self._prefix = str(config.get("env_prefix") or "")
        self._delimiter = str(config.get("env_nested_delimiter") or "__")
        self._model = settings_cls
        #: normalised name -> (variable as written, annotation of what it sets)
        self.variables: dict[str, tuple[str, Any]] = {}
        super().__init__(settings_cls, case_sensitive=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        out: dict[str, str | None] = {}
        for var, value in self._environ.items():
            if not var.upper().startswith(self._prefix.upper()):
                continue
            resolved = resolve(self._model, var[len(self._prefix):].split(self._delimiter))
            if resolved is None:
                continue
            name = self._prefix + self._delimiter.join(resolved[0])
            self.variables[name] = (var, resolved[1])
            out[name] = value
        return out

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        return loads(value)

    def __call__(self) -> dict[str, Any]:
        try:
            return super().__call__()
        except SettingsError:
            raise EnvValueError(self.problems()) from None

    def problems(self) -> list[tuple[str, str]]:
        """Each variable whose value is for a list, mapping or block of settings and is not JSON."""
        out = []
        for name, (var, annotation) in sorted(self.variables.items()):
            value = self.env_vars.get(name)
            if value is None or not _is_complex(annotation):
                continue
            try:
                loads(value)
            except ValueError as exc:
                reason = str(exc) if isinstance(exc, _DuplicateKey) else f"not valid JSON ({str(exc)[:100]})"
                out.append((var, f"{reason}; {_json_hint(var, annotation)}"))
        return out or [(f"{self._prefix}*", "an environment variable could not be read as a setting")]
