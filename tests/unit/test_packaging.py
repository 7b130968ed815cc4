"""The installed package is the tree: every installed folder with an ``__init__.py`` (the product's
layers and ``tools/``) is listed in pyproject.toml (so ``pip install .`` and the image carry it, not
only an editable install), each maps to its own folder, the image copies every top-level one, and
mypy (scripts/typecheck.sh) reads every one.

An editable install finds a sub-package that pyproject.toml does not list (it maps the top-level
folders and imports the rest from them), so the tests pass while the wheel and the image lack it:
only these checks see that drift. Each check is a function of a tree, and each is shown to fail on
a tree or a Dockerfile that has the drift."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from tests.unit.test_dockerfile import DOCKERFILE, STAGES, Instruction, parse, stages

ROOT = Path(__file__).resolve().parents[2]
#: The top-level folders that install as ``lakemirror.<name>`` (``lakemirror`` itself is the root).
PRODUCT_FOLDERS = ("lakemirror", "daemon", "supervisor", "sources", "sinks", "checkpoints")
#: Installed beside the product as ``lakemirror.tools`` (the demos, the local Debezium stack), never
#: imported by it (tests/unit/test_layering.py).
TOOL_FOLDERS = ("tools",)
INSTALLED_FOLDERS = PRODUCT_FOLDERS + TOOL_FOLDERS
#: Top-level folders with Python code that are not installed: the benchmarks, the tests, the scripts.
NOT_INSTALLED = ("bench", "tests", "scripts")
TYPECHECK = ROOT / "scripts" / "typecheck.sh"


def package_name(root: Path, folder: Path) -> str:
    parts = folder.relative_to(root).parts
    return ".".join(parts) if parts[0] == "lakemirror" else ".".join(("lakemirror", *parts))


def packages_in_tree(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for top in INSTALLED_FOLDERS:
        for init in (root / top).rglob("__init__.py"):
            found[package_name(root, init.parent)] = init.parent
    return found


def load_setuptools(root: Path = ROOT) -> dict[str, Any]:
    setuptools: dict[str, Any] = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return setuptools


SETUPTOOLS = load_setuptools()


def unlisted_packages(root: Path, setuptools: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(packages of the tree pyproject does not list, packages it lists that have no folder)."""
    tree, listed = set(packages_in_tree(root)), set(setuptools["packages"])
    return sorted(tree - listed), sorted(listed - tree)


def folders_without_init(root: Path = ROOT) -> list[str]:
    """Installed folders holding modules but no ``__init__.py``: no package list names them (a
    namespace folder), so neither the wheel nor the image would carry their modules."""
    folders = {p.parent for top in INSTALLED_FOLDERS for p in (root / top).rglob("*.py")}
    return sorted(f.relative_to(root).as_posix() for f in folders
                  if not (f / "__init__.py").is_file() and "__pycache__" not in f.parts)


def folders_not_copied(build: list[Instruction]) -> list[str]:
    """The installed folders a build stage does not copy from the build context."""
    copied = {ins.args.split()[0].rstrip("/") for ins in build if ins.keyword == "COPY" and "--from" not in ins.args}
    return sorted(set(INSTALLED_FOLDERS) - copied)


def data_files_not_packaged(root: Path, setuptools: dict[str, Any]) -> list[str]:
    """Files in installed folders that are not modules and that no package-data pattern of their
    package takes: the wheel would leave them out."""
    patterns: dict[str, list[str]] = setuptools.get("package-data", {})
    missing = []
    for name, folder in packages_in_tree(root).items():
        for path in folder.iterdir():
            if not path.is_file() or path.suffix in (".py", ".pyc"):
                continue
            if not any(fnmatch(path.name, pattern) for pattern in patterns.get(name, [])):
                missing.append(path.relative_to(root).as_posix())
    return sorted(missing)


def typechecked(script: str) -> tuple[set[str], set[str]]:
    """(the top-level folders scripts/typecheck.sh links into mypy's tree, the packages it checks)."""
    packages = re.search(r'PACKAGES=\$\{TYPECHECK_PACKAGES:-"([^"]*)"\}', script)
    layers = re.search(r"for layer in ([^;]*); do", script)
    assert packages and layers, "scripts/typecheck.sh no longer names its packages and layers the way this test reads"
    return set(layers.group(1).split()), set(packages.group(1).split())


def test_every_top_level_package_is_installed_or_said_not_to_be() -> None:
    """A new top-level folder must be placed: installed (and then checked below), or not."""
    tops = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {"lakemirror"}
    assert sorted(tops - set(INSTALLED_FOLDERS) - set(NOT_INSTALLED)) == [], "top-level packages this test does not place"


def test_every_package_folder_is_listed_in_pyproject() -> None:
    missing, stale = unlisted_packages(ROOT, SETUPTOOLS)
    assert missing == [], "folders missing from [tool.setuptools] packages"
    assert stale == [], "packages listed with no folder"


def test_every_folder_of_modules_is_a_package() -> None:
    assert folders_without_init() == [], "folders of modules without an __init__.py (not installed)"


def test_every_listed_package_maps_to_its_own_folder() -> None:
    tree = packages_in_tree()
    mapping = SETUPTOOLS["package-dir"]
    for name, folder in tree.items():
        assert name in mapping, f"{name} has no package-dir entry"
        assert (ROOT / mapping[name]).resolve() == folder.resolve(), f"{name} maps to {mapping[name]}"


def test_every_data_file_is_packaged() -> None:
    assert data_files_not_packaged(ROOT, SETUPTOOLS) == [], "files no [tool.setuptools.package-data] pattern takes"


def test_the_image_copies_every_installed_folder() -> None:
    """``pip install .`` in the image builds pyproject.toml's package list: a folder it lists and the
    build does not copy fails the build, one it does not list is missing from the image."""
    assert folders_not_copied(STAGES[0]) == [], "folders the image build does not copy"


def test_mypy_reads_every_installed_package() -> None:
    """scripts/typecheck.sh links every installed top-level folder into mypy's tree and checks every
    layer and every sub-package of the core: a package left out would never be type-checked."""
    layers, packages = typechecked(TYPECHECK.read_text())
    assert sorted(set(INSTALLED_FOLDERS) - {"lakemirror"} - layers) == [], "folders typecheck.sh does not link"
    core_subpackages = {name for name, folder in packages_in_tree().items() if folder.parent == ROOT / "lakemirror"}
    wanted = {f"lakemirror.{f}" for f in INSTALLED_FOLDERS if f != "lakemirror"} | core_subpackages
    assert sorted(wanted - packages) == [], "packages typecheck.sh does not check"


def _tree_as_listed(root: Path) -> None:
    """A tree with exactly the packages pyproject.toml lists, and the core's modules."""
    for name in SETUPTOOLS["packages"]:
        folder = root / SETUPTOOLS["package-dir"][name]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
        (folder / "m.py").write_text("")


def test_a_sub_package_missing_from_pyproject_is_caught(tmp_path: Path) -> None:
    """The check is not vacuous: a folder with an __init__.py that pyproject does not list is found,
    and so is a listed package whose folder is gone."""
    _tree_as_listed(tmp_path)
    assert unlisted_packages(tmp_path, SETUPTOOLS) == ([], [])
    (tmp_path / "sinks" / "newpath").mkdir()
    (tmp_path / "sinks" / "newpath" / "__init__.py").write_text("")
    (tmp_path / "lakemirror" / "newcore").mkdir()
    (tmp_path / "lakemirror" / "newcore" / "__init__.py").write_text("")
    assert unlisted_packages(tmp_path, SETUPTOOLS) == (["lakemirror.newcore", "lakemirror.sinks.newpath"], [])
    (tmp_path / "sinks" / "batch" / "__init__.py").unlink()
    assert unlisted_packages(tmp_path, SETUPTOOLS)[1] == ["lakemirror.sinks.batch"]
    assert folders_without_init(tmp_path) == ["sinks/batch"]


def test_a_folder_the_image_does_not_copy_is_caught() -> None:
    """The check is not vacuous: the Dockerfile without one of its COPY lines leaves that folder out."""
    text = DOCKERFILE.read_text()
    assert "COPY sinks ./sinks\n" in text
    assert folders_not_copied(stages(parse(text.replace("COPY sinks ./sinks\n", "")))[0]) == ["sinks"]


def test_a_data_file_no_pattern_takes_is_caught(tmp_path: Path) -> None:
    _tree_as_listed(tmp_path)
    (tmp_path / "daemon" / "ivysettings.xml").write_text("")
    (tmp_path / "sources" / "schema.json").write_text("")
    assert data_files_not_packaged(tmp_path, SETUPTOOLS) == ["sources/schema.json"]


def test_a_package_mypy_does_not_read_is_caught() -> None:
    script = TYPECHECK.read_text()
    layers, packages = typechecked(script)
    assert "sinks" in layers and "lakemirror.sinks" in packages
    layers, packages = typechecked(script.replace(" lakemirror.sinks ", " ").replace(" sinks ", " "))
    assert "sinks" not in layers and "lakemirror.sinks" not in packages
