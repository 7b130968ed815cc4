"""The README's references and the shipped examples stay true to the code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args, get_origin

from pydantic import BaseModel
from prometheus_client import CollectorRegistry

from lakemirror.daemon.config import Settings, load_settings
from lakemirror.daemon.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


#: Models documented as one row (their fields are listed in that row's text).
LEAVES = {"TableOverride", "RetrySettings", "CloneOptions", "ReconcileSettings", "MetadataSettings"}


def setting_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        sub = field.annotation
        args = get_args(sub)
        item = args[0] if get_origin(sub) is list and args else None
        if isinstance(sub, type) and issubclass(sub, BaseModel) and sub.__name__ not in LEAVES:
            out += setting_paths(sub, f"{prefix}{name}.")
        elif isinstance(item, type) and issubclass(item, BaseModel):  # a list of entries: schedules[].name
            out += [f"{prefix}{name}", *setting_paths(item, f"{prefix}{name}[].")]
        else:
            out.append(f"{prefix}{name}")
    return out


def test_every_setting_is_in_the_configuration_reference() -> None:
    documented = set(re.findall(r"^\| `([a-z_.\[\]]+)` \|", README, flags=re.M))
    missing = [p for p in setting_paths(Settings) if p not in documented]
    assert not missing, f"add these settings to the README's configuration reference: {missing}"
    unknown = documented - set(setting_paths(Settings)) - {m for m in documented if m.startswith("lakemirror_")}
    assert not unknown, f"the README documents settings that do not exist: {unknown}"


def test_every_exported_metric_is_in_the_metrics_reference() -> None:
    registry = CollectorRegistry()
    Metrics("p", registry)
    names = {m.name for m in registry.collect()}
    documented = set(re.findall(r"^\| `(lakemirror_[a-z_]+)` \|", README, flags=re.M))
    # prometheus_client strips _total from counters and _info from Info in family names.
    exported = {n if n in documented else n + "_total" if n + "_total" in documented else n + "_info"
                for n in names}
    assert exported == documented


def test_the_example_pipeline_is_valid() -> None:
    settings = load_settings(ROOT / "deploy" / "examples" / "pipeline.yaml")
    assert settings.effective_pipeline_id == "prod-orders"


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test " in README or "make test\n" in README or "make test  " in README
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
