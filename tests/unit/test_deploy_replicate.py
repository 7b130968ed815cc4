"""deploy/databricks: the scheduled ``lakemirror replicate`` job (resources/replicate_job.yml, included by
databricks.yml) against the bundle schema's models, and every ``configs/*_default.yaml`` a valid replicate
configuration."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lakemirror.daemon.cli import build_parser
from lakemirror.daemon.settings.replicate import load_replicate_config

ROOT = Path(__file__).resolve().parents[2]
BUNDLE_DIR = ROOT / "deploy" / "databricks"
VAR = re.compile(r"\$\{var\.([A-Za-z0-9_]+)\}")
CONFIGS = sorted((BUNDLE_DIR / "configs").glob("*_default.yaml"))


def load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text(encoding="utf-8")))


def included() -> list[Path]:
    bundle = load(BUNDLE_DIR / "databricks.yml")
    return sorted(p for pattern in bundle.get("include", []) for p in BUNDLE_DIR.glob(pattern))


def test_the_bundle_includes_the_replicate_job_and_declares_every_variable_it_uses() -> None:
    files = included()
    assert BUNDLE_DIR / "resources" / "replicate_job.yml" in files
    declared = set(load(BUNDLE_DIR / "databricks.yml")["variables"])
    for f in files:
        declared |= set(load(f).get("variables", {}))
    used = set(VAR.findall((BUNDLE_DIR / "resources" / "replicate_job.yml").read_text(encoding="utf-8")))
    assert used <= declared, f"undeclared variables: {used - declared}"


def test_the_replicate_job_is_scheduled_and_runs_the_command() -> None:
    [(key, spec)] = load(BUNDLE_DIR / "resources" / "replicate_job.yml")["resources"]["jobs"].items()
    from databricks.bundles.jobs import Job

    job = Job.from_dict(spec)  # raises on an unknown field, a bad enum value or a wrong shape
    assert job.schedule is not None and job.continuous is None
    assert spec["max_concurrent_runs"] == 1 and spec["tags"]["kind"] == "replicate"
    [task] = spec["tasks"]
    params = task["python_wheel_task"]["parameters"]
    assert params[0] == "replicate"
    args = build_parser().parse_args([p.replace("${var.replicate_config_path}", "/Volumes/x/c.yaml") for p in params])
    assert args.command == "replicate" and args.config == "/Volumes/x/c.yaml"
    wheel = (BUNDLE_DIR / "resources" / task["libraries"][0]["whl"]).resolve().parent
    assert wheel == (ROOT / "dist").resolve(), "the wheel path is relative to the file that names it"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_each_default_config_is_valid(path: Path) -> None:
    config = load_replicate_config(path)
    assert config.catalogs and config.runtime.mode == "databricks"


def test_there_is_a_default_config_per_operation() -> None:
    names = {p.name for p in CONFIGS}
    assert {"replication_default.yaml", "incremental_default.yaml", "backup_default.yaml",
            "reconciliation_default.yaml", "uc_metadata_default.yaml", "volume_files_default.yaml"} <= names
