"""The checkpoint volume's layout is named in one module (lakemirror.checkpoints.layout) and joined
nowhere else: the paths it gives, the tree its docstring draws, and a guard against hand-made joins."""

from __future__ import annotations

import ast
from pathlib import Path

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.bootstrap_state import FileBootstrapStore, bootstrap_store_for
from lakemirror.checkpoints.state import FileStateStore
from tests.unit.source_nodes import nodes_of
from tests.unit.test_packaging import PRODUCT_FOLDERS

ROOT = Path(__file__).resolve().parents[2]

#: Every name the layout gives to a file or folder.
NAMES = {value for key, value in vars(layout).items()
         if key.isupper() and isinstance(value, str) and key != "RETIRED_CHECKPOINT_PREFIX"}


def test_a_pipelines_files_and_folders() -> None:
    pipeline = layout.pipeline_dir("/vol", "orders-sync")
    assert pipeline == Path("/vol/orders-sync")
    assert layout.daemon_file(pipeline) == pipeline / "daemon.json"
    assert layout.daemon_file_tmp(pipeline, 42) == pipeline / ".daemon.json.42.tmp"
    assert layout.token_file(pipeline) == pipeline / "daemon.token"
    assert layout.token_file_tmp(pipeline, 42) == pipeline / ".daemon.token.42.tmp"
    assert layout.owner_marker(pipeline) == pipeline / ".lakemirror-pipeline"
    assert layout.lease_dir(pipeline) == pipeline / "lease"
    assert layout.state_dir(pipeline) == pipeline / "state"
    assert layout.bootstrap_dir(layout.state_dir(pipeline)) == pipeline / "bootstrap"
    assert layout.cycles_dir(pipeline) == pipeline / "cycles"
    source = layout.event_source_dir(pipeline, "shop")
    assert source == pipeline / "events" / "shop"
    assert layout.event_epoch_file(source) == source / "epoch"
    assert layout.event_checkpoint(source) == source / "checkpoint"
    assert layout.retired_event_checkpoint(source, "ab12") == source / "checkpoint.retired-ab12"
    assert layout.incremental_dir("/vol", "orders-sync") == pipeline / "incremental"


def test_spark_locations_are_joined_as_strings_so_a_uri_keeps_its_scheme() -> None:
    assert layout.stream_checkpoint("dbfs:/Volumes/c/s/v/", "p", "c__s__t", 3) == "dbfs:/Volumes/c/s/v/p/c__s__t/e3"
    assert layout.change_log_table("/vol", "p", "c__s__t", 3) == "/vol/p/c__s__t/e3-changes"
    assert layout.incremental_checkpoint("/vol/", "replicate", "c__s__t", 2) == "/vol/replicate/incremental/c__s__t/e2"
    assert layout.api_checkpoint_volume("/vol/") == "/vol/api"
    assert layout.replicate_dir("/vol") == Path("/vol/replicate")
    assert layout.volume_manifest_dir("/vol/replicate", "c__s__v") == Path("/vol/replicate/volumes/c__s__v")


def test_the_stores_keep_their_files_where_the_layout_says(tmp_path: Path) -> None:
    states = FileStateStore(tmp_path)
    assert states.dir == layout.state_dir(tmp_path)
    bootstraps = bootstrap_store_for(states)
    assert isinstance(bootstraps, FileBootstrapStore) and bootstraps.dir == tmp_path / "bootstrap"


def test_the_docstring_draws_every_name() -> None:
    tree = layout.__doc__ or ""
    missing = sorted(name for name in NAMES if name not in tree)
    assert not missing, f"names of lakemirror.checkpoints.layout its tree does not show: {missing}"


def hand_joins(text: str) -> list[int]:
    """Lines that join a layout name onto a path by hand (``x / "state"``) or spell an epoch's folder
    (``f"{root}/{pipeline}/{slug}/e{epoch}"``). Transaction app ids (``f"lakemirror/…/e{epoch}"``) are
    spelled alike and are not paths."""
    found = []
    for node in nodes_of(text, ast.BinOp, ast.JoinedStr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) \
                and node.right.value in NAMES:
            found.append(node.lineno)
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            app_id = isinstance(parts[0], ast.Constant) and str(parts[0].value).startswith("lakemirror")
            if not app_id and any(isinstance(a, ast.Constant) and str(a.value).endswith("/e") and isinstance(b, ast.FormattedValue)
                   and "epoch" in ast.unparse(b.value) for a, b in zip(parts, parts[1:])):
                found.append(node.lineno)
    return found


def test_no_product_module_joins_the_layout_by_hand() -> None:
    found = []
    for top in PRODUCT_FOLDERS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "checkpoints" / "layout.py":
                continue
            found += [f"{path.relative_to(ROOT)}:{line}" for line in hand_joins(path.read_text(encoding="utf-8"))]
    assert not found, "use lakemirror.checkpoints.layout instead of joining its names:\n" + "\n".join(found)


def test_a_hand_made_join_is_caught() -> None:
    assert hand_joins('folder = pipeline / "events" / name\n') == [1]
    assert hand_joins('x = root / "daemon.json"\n') == [1]
    assert hand_joins('p = f"{root}/{pipeline_id}/{slug}/e{epoch}"\n') == [1]
    assert hand_joins('p = f"{root}/{namespace}/incremental/{slug}/e{progress.epoch}"\n') == [1]
    assert hand_joins('app = f"lakemirror/{pipeline_id}/{slug}/e{epoch}"\n') == []  # a transaction app id
    assert hand_joins('p = folder / "offsets" / str(batch)\n') == []  # inside Spark's checkpoint: Spark's layout
