"""deploy/databricks/databricks.yml: the bundle's job checked against the bundle schema's models
(``databricks-bundles``, generated from the bundle JSON schema) and against this repository."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Iterator

import yaml

from lakemirror.daemon.settings import Settings, load_settings, parse_set_flags

ROOT = Path(__file__).resolve().parents[2]
BUNDLE_DIR = ROOT / "deploy" / "databricks"
BUNDLE: dict[str, Any] = yaml.safe_load((BUNDLE_DIR / "databricks.yml").read_text(encoding="utf-8"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VAR = re.compile(r"\$\{var\.([A-Za-z0-9_]+)\}")
# Top-level mappings of a bundle configuration, and the ones a target may override.
ROOT_KEYS = {"bundle", "variables", "artifacts", "resources", "targets", "workspace", "include", "sync",
             "permissions", "run_as", "presets", "experimental", "environments", "scripts"}
TARGET_KEYS = {"mode", "default", "workspace", "variables", "resources", "presets", "run_as", "artifacts",
               "bundle", "permissions", "sync", "git", "cluster_id", "compute_id"}


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def the_job() -> dict[str, Any]:
    jobs = BUNDLE["resources"]["jobs"]
    assert len(jobs) == 1, "the bundle holds one job, the continuous sync"
    return dict(next(iter(jobs.values())))


def test_top_level_structure() -> None:
    assert set(BUNDLE) <= ROOT_KEYS, f"unknown top-level keys: {set(BUNDLE) - ROOT_KEYS}"
    assert BUNDLE["bundle"]["name"] == "lakemirror"
    for name, target in BUNDLE["targets"].items():
        assert set(target) <= TARGET_KEYS, f"target {name}: unknown keys {set(target) - TARGET_KEYS}"
        assert target.get("mode") in (None, "development", "production")
        assert set(target.get("variables", {})) <= set(BUNDLE["variables"]), f"target {name} sets unknown variables"
    assert sum(1 for t in BUNDLE["targets"].values() if t.get("default")) == 1


def test_the_job_matches_the_bundle_schema() -> None:
    from databricks.bundles.jobs import Job

    job = Job.from_dict(the_job())  # raises on an unknown field, a bad enum value or a wrong shape
    assert job.continuous is not None and job.schedule is None
    assert [t.task_key for t in job.tasks] == ["lakemirror"]


def test_the_job_is_continuous_with_the_lakemirror_tags() -> None:
    job = the_job()
    assert set(job["continuous"]) == {"pause_status"}
    assert BUNDLE["variables"]["pause_status"]["default"] == "UNPAUSED"
    assert job["max_concurrent_runs"] == 1
    assert job["tags"]["created_by"] == "lakemirror" and job["tags"]["kind"] == "continuous-sync"
    assert VAR.findall(job["tags"]["source"]) == ["source_catalog", "schema_name"]
    assert VAR.findall(job["tags"]["destination"]) == ["destination_catalog", "schema_name"]
    [task] = job["tasks"]
    assert "max_retries" not in task, "continuous jobs take no retry policy (the Jobs service backs off)"
    assert task["job_cluster_key"] in {c["job_cluster_key"] for c in job["job_clusters"]}


def test_the_task_runs_the_wheels_console_script() -> None:
    [task] = the_job()["tasks"]
    wheel_task = task["python_wheel_task"]
    assert wheel_task["package_name"] == PYPROJECT["project"]["name"]
    assert wheel_task["entry_point"] in PYPROJECT["project"]["scripts"]
    assert wheel_task["parameters"][0] == "run"
    [artifact] = BUNDLE["artifacts"].values()
    assert artifact["type"] == "whl"
    source = (BUNDLE_DIR / artifact["path"]).resolve()
    assert source == ROOT and (source / "pyproject.toml").is_file()
    assert "--wheel-dir dist" in artifact["build"]
    assert task["libraries"] == [{"whl": f"{artifact['path']}/dist/*.whl"}]


def test_the_task_arguments_parse_into_valid_settings(tmp_path: Path) -> None:
    """The `--set` flags of the task name real settings; with a pipeline YAML they load."""
    [task] = the_job()["tasks"]
    params = task["python_wheel_task"]["parameters"]
    assert params[1] == "${var.config_path}"
    flags = [params[i + 1] for i, p in enumerate(params) if p == "--set"]
    assert len(flags) * 2 + 2 == len(params)
    values = {"source_catalog": "prod", "destination_catalog": "prod_mirror", "schema_name": "orders"}
    resolved = [VAR.sub(lambda m: values[m.group(1)], f) for f in flags]
    overrides = parse_set_flags(resolved)
    assert set(overrides) <= set(Settings.model_fields)
    config = tmp_path / "pipeline.yaml"
    config.write_text("source_catalog: x\ndestination_catalog: y\nschema_name: z\n"
                      "checkpoint_volume: /Volumes/ops/lakemirror/checkpoints\n")
    settings = load_settings(config, overrides)
    assert settings.runtime.mode == "databricks"
    assert (settings.source_catalog, settings.destination_catalog, settings.schema_name) == (
        "prod", "prod_mirror", "orders")


def test_every_variable_used_is_defined_and_every_one_defined_is_used() -> None:
    used = {name for s in strings({k: v for k, v in BUNDLE.items() if k != "variables"}) for name in VAR.findall(s)}
    defined = set(BUNDLE["variables"])
    assert used - defined == set(), f"undefined variables: {used - defined}"
    assert defined - used == set(), f"variables never used: {defined - used}"
    for name, spec in BUNDLE["variables"].items():
        assert spec.get("description"), f"variable {name} has no description"
