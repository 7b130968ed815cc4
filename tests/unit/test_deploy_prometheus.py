"""deploy/prometheus: the alert rules pass `promtool check rules` and their `promtool test rules` unit
tests (promtool from Debian's prometheus package, installed by scripts/install-services.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = sorted(PROM.glob("*.yml"))
TESTS = sorted((PROM / "tests").glob("*.test.yml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus: run scripts/install-services.sh)")


def promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def alert_names() -> set[str]:
    return {rule["alert"] for path in RULES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule}


def test_the_required_alerts_exist_and_every_one_is_unit_tested() -> None:
    names = alert_names()
    assert {"LakemirrorLagOverSLO", "LakemirrorTableDegraded", "LakemirrorRetentionHeadroomLow",
            "LakemirrorDown", "LakemirrorDeadLetters", "LakemirrorKafkaOffsetsBehindGrowing",
            "LakemirrorEventLagHigh"} <= names
    tested = {case["alertname"] for path in TESTS for group in yaml.safe_load(path.read_text())["tests"]
              for case in group.get("alert_rule_test", [])}
    assert names <= tested, f"alerts without a promtool unit test: {names - tested}"
    for path in TESTS:
        for rule_file in yaml.safe_load(path.read_text())["rule_files"]:
            assert (path.parent / rule_file).resolve() in {r.resolve() for r in RULES}


@needs_promtool
def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", *[p.name for p in RULES])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_promtool_test_rules() -> None:
    done = promtool("test", "rules", *[str(p) for p in TESTS])
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_reports_a_wrong_expectation(tmp_path: Path) -> None:
    """The harness can fail: an alert expected before its `for` has elapsed is reported."""
    bad = tmp_path / "early.test.yml"
    bad.write_text(yaml.safe_dump({
        "rule_files": [str(PROM / "lakemirror-alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": 'up{job="lakemirror",instance="x:9464"}', "values": "0x5"}],
                   "alert_rule_test": [{"eval_time": "1m", "alertname": "LakemirrorDown",
                                        "exp_alerts": [{"exp_labels": {"severity": "critical", "job": "lakemirror",
                                                                       "instance": "x:9464"}}]}]}],
    }))
    done = promtool("test", "rules", str(bad), cwd=tmp_path)
    assert done.returncode != 0 and "LakemirrorDown" in done.stdout + done.stderr
