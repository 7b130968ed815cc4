"""What the daemon imports before its HTTP endpoint serves: nothing a local pipeline does not use.

The Databricks SDK took 60% of the import of the daemon's modules (4 of 6.7 s on the loaded 2-core
machine, ``python -X importtime``); it is imported where a workspace is called instead."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("databricks.sdk", "pyspark.sql.connect")


@pytest.mark.parametrize("module", ["lakemirror.daemon.cli", "lakemirror.daemon.context"])
def test_the_daemon_imports_no_workspace_sdk_until_it_calls_one(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_job_spec_is_still_built_with_the_sdk() -> None:
    from lakemirror.daemon import databricks_jobs as dj
    from lakemirror.daemon.settings import load_settings

    settings = load_settings(None, {"source_catalog": "a", "destination_catalog": "b", "schema_name": "s",
                                    "checkpoint_volume": "/Volumes/x/y/z", "runtime": {"mode": "databricks"}})
    spec = dj.build_job_settings(settings, dj.JobTarget(wheel="/w.whl", config_path="/c.yaml"))
    assert spec.continuous is not None and spec.tasks and spec.tasks[0].python_wheel_task is not None
