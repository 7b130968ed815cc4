"""Imports flow one way: daemon → supervisor → sinks → sources, checkpoints → the core package.

Parsed with ``ast`` (every import statement, also those inside functions and ``TYPE_CHECKING``
blocks), so a lazy import cannot hide an upward dependency. Among the bottom layers, sinks consume
the change contract of sources and write checkpoint rows, never the other way round; the core
package (``lakemirror/``: identifiers, tables, errors, schema) imports no layer. Below the daemon
nothing imports Prometheus or the settings libraries (those belong to the daemon's edges).

A destination is a plug-in: its package under ``sinks/`` (``sinks/postgres/``) is reached from the
composition root's registry (``daemon/destinations.py``) only. The supervisor's runners are handed
its factories and never import it, so that nothing in them can branch on one destination
(:data:`DESTINATION_PACKAGES`). Delta, the default, is the exception the stream wiring drives.

``tools/`` (``lakemirror.tools``: the demos, the local Debezium stack) sits above the product: it may
import every layer, and no layer imports it, but for one door: the ``lakemirror demo`` command
imports its demo inside the command's function, so that nothing ``lakemirror run`` loads reaches it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What each layer may import, besides itself and the core package.
ALLOWED: dict[str, frozenset[str]] = {
    "daemon": frozenset({"supervisor", "sinks", "sources", "checkpoints"}),
    "supervisor": frozenset({"sinks", "sources", "checkpoints"}),
    "sinks": frozenset({"sources", "checkpoints"}),
    "sources": frozenset(),
    "checkpoints": frozenset(),
    "lakemirror": frozenset(),
    "tools": frozenset({"daemon", "supervisor", "sinks", "sources", "checkpoints"}),
}
LAYERS = tuple(ALLOWED)
#: Libraries only the daemon (the edges) may import.
EDGE_LIBRARIES = ("prometheus_client", "pydantic", "pydantic_settings")
#: The packages of destinations other than the default (Delta): the supervisor never imports them.
DESTINATION_PACKAGES = ("lakemirror.sinks.postgres",)
#: The only imports of ``lakemirror.tools`` in the product: (file, module), each inside a function.
TOOL_DOORS = frozenset({("daemon/cli.py", "lakemirror.tools.demo"), ("daemon/cli.py", "lakemirror.tools.demo_debezium")})


def imported_modules(text: str, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, module) of every import in ``text``; relative ones resolved against ``package``."""
    tree = ast.parse(text)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            out.append((node.lineno, module))
    return out


def layer_of(module: str) -> str | None:
    """The layer a ``lakemirror.*`` module belongs to; None for other distributions."""
    parts = module.split(".")
    if parts[0] != "lakemirror":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "lakemirror"


def violations(layer: str) -> list[str]:
    found = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        where = path.relative_to(ROOT)
        package = ("lakemirror", *path.relative_to(ROOT).parent.parts)
        for line, module in imported_modules(path.read_text(encoding="utf-8"), package):
            target = layer_of(module)
            if target == "tools" and (where.as_posix(), module) in TOOL_DOORS:
                continue
            if target is not None and target not in (layer, "lakemirror") and target not in ALLOWED[layer]:
                found.append(f"{where}:{line} imports {module} ({layer} must not depend on {target})")
            if layer not in ("daemon", "tools") and module.split(".")[0] in EDGE_LIBRARIES:
                found.append(f"{where}:{line} imports {module} (only the daemon imports {module.split('.')[0]})")
            if layer == "supervisor" and any(module == p or module.startswith(p + ".") for p in DESTINATION_PACKAGES):
                found.append(f"{where}:{line} imports {module} (a destination's package: the runners take its "
                             f"factories from daemon/destinations.py)")
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_upward(layer: str) -> None:
    found = violations(layer)
    assert not found, "imports against the one-way layering:\n" + "\n".join(found)


def test_every_layer_folder_is_checked() -> None:
    """A new top-level package must be placed in the layering before it can be imported from."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"bench", "tests", "scripts"}
    assert packages <= set(LAYERS), f"packages outside the layering: {sorted(packages - set(LAYERS))}"


def test_relative_and_lazy_imports_are_seen() -> None:
    """``from ..daemon import x`` and an import inside a function count like any other."""
    text = "from ...daemon import cli\nfrom .plan import x\ndef f():\n    import lakemirror.supervisor.runner\n"
    modules = [m for _, m in imported_modules(text, ("lakemirror", "sinks", "postgres"))]
    assert modules == ["lakemirror.daemon", "lakemirror.sinks.postgres.plan", "lakemirror.supervisor.runner"]
    assert [layer_of(m) for m in modules] == ["daemon", "sinks", "supervisor"]


def test_the_product_reaches_tools_only_through_the_demo_command() -> None:
    """The doors of ``TOOL_DOORS`` are imports inside a function of their file, never at its top, and
    no other product module imports ``lakemirror.tools`` (:func:`violations` reports any other)."""
    for file, module in sorted(TOOL_DOORS):
        tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
        package = ("lakemirror", *Path(file).parent.parts)
        top_level = [m for node in tree.body for _, m in imported_modules(ast.unparse(node), package)
                     if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        assert module not in top_level, f"{file} imports {module} when it is imported"
        inside = [m for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                  for _, m in imported_modules(ast.unparse(node), package)]
        assert module in inside, f"{file} no longer imports {module}: drop it from TOOL_DOORS"


def test_an_import_of_tools_from_the_product_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is not vacuous: a supervisor module importing the demo breaks the layering."""
    (tmp_path / "supervisor").mkdir()
    (tmp_path / "supervisor" / "x.py").write_text("def f():\n    from lakemirror.tools.demo import run_demo\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations("supervisor") == ["supervisor/x.py:2 imports lakemirror.tools.demo (supervisor must not depend "
                                        "on tools)"]


def test_a_supervisor_module_importing_a_destination_s_package_is_caught(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The destination rule is not vacuous: the runner's old special case of PostgreSQL breaks it."""
    (tmp_path / "supervisor").mkdir()
    (tmp_path / "supervisor" / "x.py").write_text("from lakemirror.sinks.postgres.spark_batches import PostgresTable\n"
                                                  "from lakemirror.sinks.contract import TableReplica\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations("supervisor") == ["supervisor/x.py:1 imports lakemirror.sinks.postgres.spark_batches (a "
                                        "destination's package: the runners take its factories from "
                                        "daemon/destinations.py)"]


def test_every_destination_but_the_default_is_a_package_the_supervisor_may_not_import() -> None:
    """A destination kind registered in the composition root is one package under ``sinks/`` named
    by its kind, in :data:`DESTINATION_PACKAGES` (Delta is the default; ``memory`` is the twins')."""
    from lakemirror.daemon.destinations import DESTINATIONS

    for kind in set(DESTINATIONS) - {"delta", "memory"}:
        assert (ROOT / "sinks" / kind / "__init__.py").is_file(), f"destination {kind!r} has no package sinks/{kind}"
        assert f"lakemirror.sinks.{kind}" in DESTINATION_PACKAGES, f"add lakemirror.sinks.{kind} to DESTINATION_PACKAGES"
