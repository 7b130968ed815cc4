"""The installed package is the tree: every installed folder with an ``__init__.py`` (the product's
layers and ``tools/``) is listed in pyproject.toml (so ``pip install .`` and the image carry it, not
only an editable install), each maps to its own folder, and the image copies every top-level one."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.unit.test_dockerfile import STAGES

ROOT = Path(__file__).resolve().parents[2]
#: The top-level folders that install as ``lakemirror.<name>`` (``lakemirror`` itself is the root).
PRODUCT_FOLDERS = ("lakemirror", "daemon", "supervisor", "sources", "sinks", "checkpoints")
#: Installed beside the product as ``lakemirror.tools`` (the demos, the local Debezium stack), never
#: imported by it (tests/unit/test_layering.py).
TOOL_FOLDERS = ("tools",)
INSTALLED_FOLDERS = PRODUCT_FOLDERS + TOOL_FOLDERS


def package_name(root: Path, folder: Path) -> str:
    parts = folder.relative_to(root).parts
    return ".".join(parts) if parts[0] == "lakemirror" else ".".join(("lakemirror", *parts))


def packages_in_tree(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for top in INSTALLED_FOLDERS:
        for init in (root / top).rglob("__init__.py"):
            found[package_name(root, init.parent)] = init.parent
    return found


SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    tree = packages_in_tree()
    listed = set(SETUPTOOLS["packages"])
    assert sorted(set(tree) - listed) == [], "folders missing from [tool.setuptools] packages"
    assert sorted(listed - set(tree)) == [], "packages listed with no folder"


def test_every_listed_package_maps_to_its_own_folder() -> None:
    tree = packages_in_tree()
    mapping = SETUPTOOLS["package-dir"]
    for name, folder in tree.items():
        assert name in mapping, f"{name} has no package-dir entry"
        assert (ROOT / mapping[name]).resolve() == folder.resolve(), f"{name} maps to {mapping[name]}"


def test_the_image_copies_every_installed_folder() -> None:
    """``pip install .`` in the image builds pyproject.toml's package list: a folder it lists and the
    build does not copy fails the build, one it does not list is missing from the image."""
    build = STAGES[0]
    copied = {ins.args.split()[0].rstrip("/") for ins in build if ins.keyword == "COPY" and "--from" not in ins.args}
    assert sorted(set(INSTALLED_FOLDERS) - copied) == [], "folders the image build does not copy"


def test_a_new_sub_package_would_be_caught(tmp_path: Path) -> None:
    """The check is not vacuous: a folder with an __init__.py that pyproject does not list is found."""
    for name in SETUPTOOLS["packages"]:
        folder = tmp_path / SETUPTOOLS["package-dir"][name]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
    (tmp_path / "sinks" / "newpath").mkdir()
    (tmp_path / "sinks" / "newpath" / "__init__.py").write_text("")
    assert set(packages_in_tree(tmp_path)) - set(SETUPTOOLS["packages"]) == {"lakemirror.sinks.newpath"}
