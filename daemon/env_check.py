"""Environment variables with our prefix that set nothing: a misspelling would otherwise be ignored.

pydantic-settings reads only the variables that name a field (``LAKEMIRROR_TRIGGER_INTERVAL_SECONDS``,
``LAKEMIRROR_RUNTIME__MASTER``) and silently skips every other one, so
``LAKEMIRROR_TRIGGER_INTERVALSECONDS=60`` left the interval at its default with no word said.
:func:`unknown_variables` lists such variables with the closest valid name. Pure: the environment is
passed in.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, Iterable, Mapping

from pydantic import BaseModel


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every model an annotation may hold: ``Model``, ``Model | None``, or each kind of a union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _is_mapping(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (dict, Mapping):
        return True
    return any(_is_mapping(arg) for arg in typing.get_args(annotation))  # dict[...] | None


def variable_names(model: type[BaseModel], prefix: str, delimiter: str = "__") -> tuple[set[str], set[str]]:
    """(every variable that names a field, the prefixes under which any name is a mapping key)."""
    names: set[str] = set()
    open_prefixes: set[str] = set()
    for field_name, info in model.model_fields.items():
        name = f"{prefix}{field_name}".upper()
        names.add(name)
        nested = _models_in(info.annotation)
        if _is_mapping(info.annotation):  # dict[str, X]: any key, e.g. LAKEMIRROR_TABLE_OVERRIDES__ORDERS__KEYS
            open_prefixes.add(name + delimiter)
        else:
            for model_type in nested:
                sub_names, sub_open = variable_names(model_type, name + delimiter, delimiter)
                names |= sub_names
                open_prefixes |= sub_open
    return names, open_prefixes


def unknown_variables(environ: Mapping[str, str], model: type[BaseModel], prefix: str,
                      delimiter: str = "__", also_known: Iterable[str] = ()) -> list[tuple[str, str | None]]:
    """Each variable of ``environ`` starting with ``prefix`` (any case, as pydantic-settings reads them)
    that sets no field of ``model``, with the closest valid name or None."""
    names, open_prefixes = variable_names(model, prefix, delimiter)
    known = names | {k.upper() for k in also_known}
    out = []
    for var in sorted(environ):
        upper = var.upper()
        if not upper.startswith(prefix.upper()) or upper in known or any(upper.startswith(p) for p in open_prefixes):
            continue
        cut = len(prefix)  # compare what follows the prefix, which every name shares
        close = difflib.get_close_matches(upper[cut:], sorted(n[cut:] for n in names), n=1, cutoff=0.6)
        out.append((var, prefix.upper() + close[0] if close else None))
    return out
