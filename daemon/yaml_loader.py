"""YAML for configuration files: PyYAML's safe loader, refusing a mapping that names a key twice
and a document nested deeper than a configuration ever is.

PyYAML (like the YAML 1.1 spec's most lenient readers) keeps the last of two equal keys, so
``schema_name: a`` followed by ``schema_name: b`` — or two ``runtime:`` blocks — would silently
replicate the wrong schema. YAML 1.2 says keys of a mapping are unique; this loader enforces it at
every depth while the mapping is constructed, and says where both occurrences are.

PyYAML composes and constructs nested collections recursively, so a document nested a few hundred
levels deep (or whose aliases nest it that deep) ends in Python's ``RecursionError``. Nesting is
counted on the parser's events first, which are produced without recursion: deeper than
:data:`MAX_DEPTH` is a :class:`TooDeepError` with its line, before anything is composed.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.events import CollectionEndEvent, CollectionStartEvent
from yaml.nodes import MappingNode

#: The deepest nesting of mappings and sequences accepted (a pipeline's settings nest 4 levels).
MAX_DEPTH = 32


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names ``key`` twice: first at line ``first_line``, again at ``line`` (1-based)."""

    def __init__(self, key: Any, first_line: int, line: int, column: int) -> None:
        self.key, self.first_line, self.line, self.column = key, first_line, line, column
        super().__init__(f"key {key!r} appears twice in one mapping (lines {first_line} and {line}); "
                         f"keep one")


class TooDeepError(yaml.YAMLError):
    """The document nests collections deeper than ``limit`` (first at ``line``, 1-based)."""

    def __init__(self, limit: int, line: int | None) -> None:
        self.limit, self.line = limit, line
        super().__init__(f"mappings and lists nest deeper than {limit} levels (aliases included); a "
                         f"configuration nests a few")


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that raises :class:`DuplicateKeyError` on a repeated mapping key."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *anchor` merges are expanded by flatten_mapping, not repeated keys
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise ConstructorError("while constructing a mapping", node.start_mark,
                                           "found an unhashable key", key_node.start_mark) from None
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise DuplicateKeyError(key, seen[key], line, key_node.start_mark.column + 1)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`TooDeepError` when ``text`` nests collections deeper than ``limit``."""
    depth = 0
    for event in yaml.parse(text, Loader=UniqueKeyLoader):
        if isinstance(event, CollectionStartEvent):
            depth += 1
            if depth > limit:
                raise TooDeepError(limit, event.start_mark.line + 1 if event.start_mark else None)
        elif isinstance(event, CollectionEndEvent):
            depth -= 1


def load(text: str) -> Any:
    """Parse one YAML document with :class:`UniqueKeyLoader` (safe: plain data only), refusing one
    nested deeper than :data:`MAX_DEPTH` (:class:`TooDeepError`)."""
    check_depth(text)
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # aliases can nest a document deeper than its text does
        raise TooDeepError(MAX_DEPTH, None) from None
