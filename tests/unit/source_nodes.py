"""The syntax trees of the project's own Python files, parsed once per test process.

Several tests check the house by reading every module of the product (the layering rules, the
checkpoint layout, the SQL choke point, the comments' citations); parsing the files is most of their
time, so they share these caches, keyed by the file's text (a file a test writes in a temporary
folder is parsed on its own)."""

from __future__ import annotations

import ast
import functools
import io
import tokenize


@functools.lru_cache(maxsize=None)
def nodes(text: str) -> tuple[ast.AST, ...]:
    """Every node of ``text``'s syntax tree, in ``ast.walk`` order. Shared: never change a node."""
    return tuple(ast.walk(ast.parse(text)))


@functools.lru_cache(maxsize=None)
def nodes_of(text: str, *kinds: type[ast.AST]) -> tuple[ast.AST, ...]:
    """The nodes of :func:`nodes` that are instances of ``kinds``, in the same order: a check that looks
    at a few kinds of node walks each file's tree once, not once per call."""
    return tuple(node for node in nodes(text) if isinstance(node, kinds))


@functools.lru_cache(maxsize=None)
def prose(text: str) -> tuple[tuple[int, str], ...]:
    """(line, text) of every comment and every line of every string literal in ``text``."""
    out: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out += [(tok.start[0] + i, line) for i, line in enumerate(tok.string.splitlines())]
    return tuple(out)
