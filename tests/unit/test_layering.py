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

The Delta format code we own (``lakemirror.delta_log``) is imported only by the product modules listed
in :data:`DELTA_LOG_IMPORTERS`, and no other module of the product or the benchmarks spells the log's
file names.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.unit.source_nodes import nodes_of

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
#: The event sinks' implementations: the event runner (supervisor/events) is handed a sink through
#: :class:`lakemirror.sinks.event_contract.EventSink` by the composition root and imports none of them.
EVENT_SINK_MODULES = ("lakemirror.sinks.events.guarded_sink", "lakemirror.sinks.events.delta_sink",
                      "lakemirror.sinks.events.memory_sink", "lakemirror.sinks.events.guard_merge",
                      "lakemirror.sinks.events.history_merge", "lakemirror.sinks.events.letter_resolution")
#: The only modules outside a destination's package that name it (in an import, or in code as a
#: string): the registry, whose one line names the package it imports when a pipeline takes the kind,
#: and the daemon's settings of the kind (its model, and its checks against the rest of the pipeline).
DESTINATION_PACKAGE_NAMERS = frozenset({
    "daemon/destinations.py",
    "daemon/settings/destination.py",
    "daemon/settings/postgres_checks.py",
})
#: The only imports of ``lakemirror.tools`` in the product: (file, module), each inside a function.
TOOL_DOORS = frozenset({("daemon/cli.py", "lakemirror.tools.demo"), ("daemon/cli.py", "lakemirror.tools.demo_debezium")})
#: The package that reads and writes Delta's files itself (its module docstring says what it reads
#: and refuses): every Delta release is checked against it, so who depends on it is kept in view.
DELTA_LOG = "lakemirror.delta_log"
DELTA_LOG_FOLDER = "lakemirror/delta_log"
#: The modules outside it that import it, each because it reads or writes a table's log files without
#: Spark (or names their types). A new one is a new dependency on Delta's format: add it on purpose.
DELTA_LOG_IMPORTERS = frozenset({
    "lakemirror/tables.py",                 # a local table is a folder with a log
    "daemon/settings/paths.py",             # the checkpoint folder may not lie inside a table
    "checkpoints/delta_store.py",           # the checkpoint table created by delta-rs where it has no log yet
    "sources/catalog.py",                   # a warehouse's tables are its folders with a log
    "sources/contract.py",                  # the change source's commit log (a type)
    "sources/delta_source.py",              # the change feed's commit log
    "sources/described.py",                 # a kept description checked against the commits since
    "sources/driver_feed.py",               # delta-rs reads only the protocols it reads as Spark does
    "sources/feed_plan.py",                 # batches planned from commit files and offsets
    "sources/head_probe.py",                # lag from commit times
    "sinks/accelerator/batch_feed.py",      # a batch's versions from its offsets and commits
    "sinks/accelerator/driver_apply.py",    # how often its commits clean the replica's log
    "sinks/accelerator/guarded_driver.py",  # how often its commits clean the replica's log
    "sinks/accelerator/dv_compaction.py",   # compaction commits written to the local log
    "sinks/accelerator/dv_merge.py",        # deletion vectors and commits written to the local log
    "sinks/batch/incremental.py",           # applied versions from the stream's offsets
    "sinks/events/guard_merge.py",          # delta-rs writes only the protocols it writes correctly
    "sinks/merge/apply_choice.py",          # the features each apply path handles
    "sinks/merge/local_replica.py",         # a local replica's protocol features
    "supervisor/change_feed/source_description.py",            # the commit files a kept description is checked against
    "supervisor/change_feed/commit_file_batches.py",           # batches read from commit files
    "supervisor/change_feed/lag_probe.py",              # the source's commit log (a type)
    "supervisor/offline/recorded_tables.py",               # the source's newest commit and commit times, offline
    "supervisor/offline/replica_transactions.py",         # the versions a recorded batch covered
    "supervisor/change_feed/table_runner.py",                 # the source's commit files, the applied version's offset
    "supervisor/change_feed/turn_taker.py",            # the source's commit log (a type)
})
#: The log's file names, spelled in code only inside ``lakemirror.delta_log`` (docstrings may name them).
DELTA_LOG_NAMES = ("_delta_log", "_last_checkpoint")
#: The nodes that may open with a docstring.
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def imported_modules(text: str, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, module) of every import in ``text``; relative ones resolved against ``package``."""
    out: list[tuple[int, str]] = []
    for node in nodes_of(text, ast.Import, ast.ImportFrom):
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
            if layer == "supervisor" and module in EVENT_SINK_MODULES:
                found.append(f"{where}:{line} imports {module} (an event sink: the event runner is handed one "
                             f"through sinks.event_contract by daemon/destinations.py)")
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
    text = "from ...daemon import cli\nfrom .plan import x\ndef f():\n    import lakemirror.supervisor.control.loop\n"
    modules = [m for _, m in imported_modules(text, ("lakemirror", "sinks", "postgres"))]
    assert modules == ["lakemirror.daemon", "lakemirror.sinks.postgres.plan", "lakemirror.supervisor.control.loop"]
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


def product_files(root: Path) -> list[Path]:
    """Every module of the product's layers and ``tools/``."""
    return sorted(p for layer in LAYERS if (root / layer).is_dir() for p in (root / layer).rglob("*.py"))


def delta_log_importers(root: Path) -> set[str]:
    """The modules outside ``lakemirror.delta_log`` that import it (lazily or not)."""
    found = set()
    for path in product_files(root):
        where = path.relative_to(root).as_posix()
        if where.startswith(DELTA_LOG_FOLDER + "/"):
            continue
        package = ("lakemirror", *path.relative_to(root).parent.parts)
        modules = [m for _, m in imported_modules(path.read_text(encoding="utf-8"), package)]
        if any(m == DELTA_LOG or m.startswith(DELTA_LOG + ".") for m in modules):
            found.add(where)
    return found


def spelled_log_names(text: str) -> list[tuple[int, str]]:
    """(line, name) of each string in ``text``'s code (docstrings aside) that holds a log file name."""
    docstrings = {id(node.body[0].value) for node in nodes_of(text, *DOCUMENTED)
                  if isinstance(node, DOCUMENTED)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    return [(node.lineno, name) for node in nodes_of(text, ast.Constant)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            for name in DELTA_LOG_NAMES if name in node.value]


def test_only_the_modules_that_need_it_import_the_delta_log_package() -> None:
    found = delta_log_importers(ROOT)
    assert sorted(found - DELTA_LOG_IMPORTERS) == [], f"new importers of {DELTA_LOG}: list them in DELTA_LOG_IMPORTERS"
    assert sorted(DELTA_LOG_IMPORTERS - found) == [], f"no longer import {DELTA_LOG}: drop them from DELTA_LOG_IMPORTERS"


def test_only_the_delta_log_package_spells_the_log_file_names() -> None:
    """In the product and the benchmarks alike (the tests may spell them, to build or inspect a log)."""
    files = [*product_files(ROOT), *sorted((ROOT / "bench").rglob("*.py"))]
    found = [f"{path.relative_to(ROOT)}:{line} spells {name!r}"
             for path in files if not path.relative_to(ROOT).as_posix().startswith(DELTA_LOG_FOLDER + "/")
             for line, name in spelled_log_names(path.read_text(encoding="utf-8"))]
    assert not found, f"only {DELTA_LOG} names the log's files (use lakemirror.delta_log.layout):\n" + "\n".join(found)


def test_the_delta_log_package_imports_only_where_a_table_lives() -> None:
    """Below every layer, it may import nothing of lakemirror but itself and ``lakemirror.tables``."""
    found = []
    for path in sorted((ROOT / DELTA_LOG_FOLDER).rglob("*.py")):
        package = ("lakemirror", *path.relative_to(ROOT).parent.parts[1:])
        for line, module in imported_modules(path.read_text(encoding="utf-8"), package):
            if module.startswith("lakemirror") and module != "lakemirror.tables" and not module.startswith(DELTA_LOG):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not found, "\n".join(found)


def test_the_delta_log_rules_are_not_vacuous(tmp_path: Path) -> None:
    """A new importer and a spelled folder name are found; a docstring that names the folder is not."""
    assert len(delta_log_importers(ROOT)) == len(DELTA_LOG_IMPORTERS)
    (tmp_path / "sinks").mkdir()
    (tmp_path / "sinks" / "x.py").write_text("def f():\n    from lakemirror.delta_log.layout import LOG_DIR\n")
    (tmp_path / "sinks" / "y.py").write_text('"""Not an import of lakemirror.delta_log."""\n')
    assert delta_log_importers(tmp_path) == {"sinks/x.py"}
    text = '"""Reads the ``_delta_log``."""\ndef f(p):\n    """In ``_delta_log``."""\n    return p / f"{p}/_delta_log"\n'
    assert spelled_log_names(text) == [(4, "_delta_log")]


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


def destination_package_names(text: str, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, name) of each import of a destination's package in ``text`` (``from lakemirror.sinks
    import postgres`` too), and of each string in its code (docstrings aside) that names one."""
    found = [(line, module) for line, module in imported_modules(text, package)]
    found += [(node.lineno, f"{node.module}.{alias.name}") for node in nodes_of(text, ast.ImportFrom)
              if isinstance(node, ast.ImportFrom) and not node.level and node.module for alias in node.names]
    docstrings = {id(node.body[0].value) for node in nodes_of(text, *DOCUMENTED)
                  if isinstance(node, DOCUMENTED)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found += [(node.lineno, node.value) for node in nodes_of(text, ast.Constant)
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]
    return sorted({(line, name) for line, name in found
                   if any(name == p or name.startswith(p + ".") or f"{p}." in name or name.endswith(p)
                          for p in DESTINATION_PACKAGES)})


def destination_package_namers(root: Path) -> dict[str, list[tuple[int, str]]]:
    """The product modules outside the destinations' packages that name one, with where."""
    out = {}
    for path in product_files(root):
        where = path.relative_to(root).as_posix()
        if any(where.startswith(p.split(".", 1)[1].replace(".", "/") + "/") for p in DESTINATION_PACKAGES):
            continue
        names = destination_package_names(path.read_text(encoding="utf-8"),
                                          ("lakemirror", *path.relative_to(root).parent.parts))
        if names:
            out[where] = names
    return out


def test_a_destination_s_package_is_named_by_its_registry_line_and_its_settings_only() -> None:
    """Anything else takes the destination through the registry's factories (or the kind's settings
    model's methods), so that a new destination is a package, its settings and one registry line."""
    found = destination_package_namers(ROOT)
    extra = {where: names for where, names in found.items() if where not in DESTINATION_PACKAGE_NAMERS}
    assert extra == {}, f"name a destination's package outside {sorted(DESTINATION_PACKAGE_NAMERS)}: {extra}"
    assert sorted(DESTINATION_PACKAGE_NAMERS - set(found)) == [], "no longer name it: drop them from the list"


def test_the_registry_names_each_packaged_destination_on_one_line() -> None:
    """daemon/destinations.py mentions PostgreSQL once: its registry line."""
    lines = (ROOT / "daemon" / "destinations.py").read_text(encoding="utf-8").splitlines()
    mentions = [line.strip() for line in lines if "postgres" in line.casefold()]
    assert mentions == ['"postgres": packaged("lakemirror.sinks.postgres.destination"),'], mentions


def test_the_destination_package_rule_is_not_vacuous(tmp_path: Path) -> None:
    """Imports (plain, from the parent, lazy) and module names in strings are found; docstrings are not."""
    (tmp_path / "daemon").mkdir()
    (tmp_path / "sinks" / "postgres").mkdir(parents=True)
    (tmp_path / "daemon" / "a.py").write_text("from lakemirror.sinks import postgres\n")
    (tmp_path / "daemon" / "b.py").write_text('def f():\n    import lakemirror.sinks.postgres.executor\n')
    (tmp_path / "daemon" / "c.py").write_text('"""See :mod:`lakemirror.sinks.postgres`."""\nM = "lakemirror.sinks.postgres.x"\n')
    (tmp_path / "daemon" / "d.py").write_text('"""Not code: lakemirror.sinks.postgres."""\nfrom lakemirror.sinks import memory\n')
    (tmp_path / "sinks" / "postgres" / "e.py").write_text("from lakemirror.sinks.postgres.plan import x\n")
    assert destination_package_namers(tmp_path) == {
        "daemon/a.py": [(1, "lakemirror.sinks.postgres")],
        "daemon/b.py": [(2, "lakemirror.sinks.postgres.executor")],
        "daemon/c.py": [(2, "lakemirror.sinks.postgres.x")]}


def test_a_supervisor_module_importing_an_event_sink_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The event sink rule is not vacuous: the guarded sink's old home beside the runner breaks it."""
    (tmp_path / "supervisor" / "events").mkdir(parents=True)
    (tmp_path / "supervisor" / "events" / "x.py").write_text(
        "from lakemirror.sinks.events.guard_merge import GuardedDeltaSink\n"
        "from lakemirror.sinks.event_contract import EventSink\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations("supervisor") == ["supervisor/events/x.py:1 imports lakemirror.sinks.events.guard_merge (an "
                                        "event sink: the event runner is handed one through sinks.event_contract "
                                        "by daemon/destinations.py)"]


def test_every_destination_but_the_default_is_a_package_the_supervisor_may_not_import() -> None:
    """A destination kind registered in the composition root is one package under ``sinks/`` named
    by its kind, in :data:`DESTINATION_PACKAGES` (Delta is the default; ``memory`` is the twins')."""
    from lakemirror.daemon.destinations import DESTINATIONS

    for kind in set(DESTINATIONS) - {"delta", "memory"}:
        assert (ROOT / "sinks" / kind / "__init__.py").is_file(), f"destination {kind!r} has no package sinks/{kind}"
        assert f"lakemirror.sinks.{kind}" in DESTINATION_PACKAGES, f"add lakemirror.sinks.{kind} to DESTINATION_PACKAGES"


def test_the_supervisor_keeps_its_modules_in_rooms() -> None:
    """supervisor/ holds sub-packages by concern, each documented in its ``__init__``; a module
    belongs in one of them (or in a new one, said in supervisor/__init__.py), never loose beside them."""
    loose = sorted(p.name for p in (ROOT / "supervisor").glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules of supervisor/ outside its sub-packages: {loose}"
    doc = (ROOT / "supervisor" / "__init__.py").read_text(encoding="utf-8")
    rooms = sorted(p.parent.name for p in (ROOT / "supervisor").glob("*/__init__.py"))
    assert [r for r in rooms if f":mod:`.{r}`" not in doc] == [], "rooms supervisor/__init__.py does not describe"
