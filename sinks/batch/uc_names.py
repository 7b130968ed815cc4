"""Names inside SQL text: rewriting a view's definition to the target's names, and the order views must
be created in. Pure.

A view's text names other objects as ``catalog.schema.object`` or ``schema.object`` (or bare names, which
resolve against the catalog and schema the view is created in: lakemirror creates each view with its
target catalog and schema current, so those follow). :func:`rewrite_names` replaces the qualified names
whose catalog (or catalog and schema) are mapped, and nothing else: string literals, comments, and
quoted identifiers that are not names of a mapped catalog or schema stay byte for byte. A name is an
identifier chain (``a.b.c``, each part bare or backtick-quoted) not preceded by ``.``; a column reference
``t.col`` is never mistaken for a schema-qualified name unless ``t`` is a mapped source schema.

:func:`dependency_levels` orders views so that each is created after the views it reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

from lakemirror.errors import TerminalError
from lakemirror.identifiers import quote

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<line>--[^\n]*)
  | (?P<block>/\*.*?\*/)
  | (?P<str>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*")
  | (?P<qid>`(?:[^`]|``)+`)
  | (?P<id>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<dot>\.)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str

    @property
    def ident(self) -> str | None:
        if self.kind == "id":
            return self.text
        if self.kind == "qid":
            return self.text[1:-1].replace("``", "`")
        return None


def _tokens(sql: str) -> list[_Tok]:
    out = []
    for m in _TOKEN.finditer(sql):
        kind = m.lastgroup or "other"
        out.append(_Tok(kind, m.group()))
    return out


@dataclass(frozen=True)
class _Chain:
    start: int          # index of the first token
    end: int            # index after the last token
    parts: tuple[str, ...]


def _chains(toks: Sequence[_Tok]) -> Iterator[_Chain]:
    i = 0
    while i < len(toks):
        t = toks[i]
        prev = next((toks[j] for j in range(i - 1, -1, -1) if toks[j].kind != "ws"), None)
        if t.ident is None or (prev is not None and prev.kind == "dot"):
            i += 1
            continue
        parts, j = [t.ident], i + 1
        while j + 1 < len(toks) and toks[j].kind == "dot" and toks[j + 1].ident is not None:
            parts.append(str(toks[j + 1].ident))
            j += 2
        yield _Chain(i, j, tuple(parts))
        i = j


def _norm(name: str) -> str:
    return name.lower()


@dataclass(frozen=True)
class NameMap:
    """Source -> target names: whole catalogs, and (catalog, schema) pairs (which win)."""

    catalogs: Mapping[str, str]
    schemas: Mapping[tuple[str, str], tuple[str, str]]

    def map3(self, catalog: str, schema: str) -> tuple[str, str] | None:
        for (c, s), target in self.schemas.items():
            if _norm(c) == _norm(catalog) and _norm(s) == _norm(schema):
                return target
        for c, target_catalog in self.catalogs.items():
            if _norm(c) == _norm(catalog):
                return target_catalog, schema
        return None

    def renamed_schema(self, catalog: str, schema: str) -> tuple[str, str] | None:
        """The target of an explicitly mapped (catalog, schema) pair, else None."""
        for (c, sc), target in self.schemas.items():
            if _norm(c) == _norm(catalog) and _norm(sc) == _norm(schema):
                return target
        return None


def _render(parts: Iterable[str]) -> str:
    return ".".join(p if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else quote(p) for p in parts)


def rewrite_names(sql: str, names: NameMap, home: tuple[str, str]) -> str:
    """``sql``, read in the source (catalog, schema) ``home``, with every mapped qualified name replaced
    (see the module docstring)."""
    toks = _tokens(sql)
    target_home = names.map3(*home) or home
    out: list[str] = []
    i = 0
    for chain in _chains(toks):
        out += [t.text for t in toks[i:chain.start]]
        parts = chain.parts
        mapped: tuple[str, ...] | None = None
        if len(parts) >= 3:
            target = names.map3(parts[0], parts[1])
            if target is not None:
                mapped = (*target, *parts[2:])
        elif len(parts) == 2:
            target = names.renamed_schema(home[0], parts[0])
            if target is not None:
                mapped = (target[1], parts[1]) if _norm(target[0]) == _norm(target_home[0]) else (*target, parts[1])
        out += [_render(mapped)] if mapped is not None else [t.text for t in toks[chain.start:chain.end]]
        i = chain.end
    out += [t.text for t in toks[i:]]
    return "".join(out)


def references(sql: str, home: tuple[str, str]) -> set[tuple[str, str, str]]:
    """Every name of ``sql`` as (catalog, schema, object), lower-cased; a bare name is read in ``home``
    (catalog, schema). Column references come out too: callers intersect with names they know."""
    out: set[tuple[str, str, str]] = set()
    for chain in _chains(_tokens(sql)):
        p = [_norm(x) for x in chain.parts]
        if len(p) >= 3:
            out.add((p[0], p[1], p[2]))
        elif len(p) == 2:
            out.add((_norm(home[0]), p[0], p[1]))
        else:
            out.add((_norm(home[0]), _norm(home[1]), p[0]))
    return out


class ViewCycle(TerminalError):
    code = "view_cycle"


def dependency_levels(views: Mapping[tuple[str, str, str], set[tuple[str, str, str]]]) -> list[list[tuple[str, str, str]]]:
    """Views in levels: each level's views read only tables and views of earlier levels. ``views``:
    each view (lower-cased full name) and what it references. Raises :class:`ViewCycle`."""
    known = set(views)
    deps = {v: {r for r in refs if r in known and r != v} for v, refs in views.items()}
    levels: list[list[tuple[str, str, str]]] = []
    placed: set[tuple[str, str, str]] = set()
    while len(placed) < len(deps):
        level = sorted(v for v, d in deps.items() if v not in placed and d <= placed)
        if not level:
            stuck = sorted(".".join(v) for v in deps if v not in placed)
            raise ViewCycle(f"views reference each other in a cycle: {', '.join(stuck)}")
        levels.append(level)
        placed |= set(level)
    return levels
