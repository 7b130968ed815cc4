"""The documented references and the shipped examples stay true to the code (the configuration
reference is rendered from the settings models: tests/unit/test_settings_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path
from prometheus_client import CollectorRegistry

from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
METRICS_DOC = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")


def test_every_exported_metric_is_in_the_metrics_reference() -> None:
    registry = CollectorRegistry()
    Metrics("p", registry)
    names = {m.name for m in registry.collect()}
    documented = set(re.findall(r"^\| `(lakemirror_[a-z_]+)` \|", METRICS_DOC, flags=re.M))
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


def test_the_readme_links_to_documents_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert links, "the README links its documents"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"the README links to missing files: {missing}"
