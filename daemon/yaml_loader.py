"""YAML for configuration files: PyYAML's safe loader, refusing a mapping that names a key twice.

PyYAML (like the YAML 1.1 spec's most lenient readers) keeps the last of two equal keys, so
``schema_name: a`` followed by ``schema_name: b`` — or two ``runtime:`` blocks — would silently
replicate the wrong schema. YAML 1.2 says keys of a mapping are unique; this loader enforces it at
every depth while the mapping is constructed, and says where both occurrences are.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names ``key`` twice: first at line ``first_line``, again at ``line`` (1-based)."""

    def __init__(self, key: Any, first_line: int, line: int, column: int) -> None:
        self.key, self.first_line, self.line, self.column = key, first_line, line, column
        super().__init__(f"key {key!r} appears twice in one mapping (lines {first_line} and {line}); "
                         f"keep one")


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
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def load(text: str) -> Any:
    """Parse one YAML document with :class:`UniqueKeyLoader` (safe: plain data only)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
