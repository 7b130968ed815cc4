"""deploy/grafana: the dashboard queries only metrics the daemon exports, through its `datasource`
variable, and the provisioning files point at it. The alert rules are held to the same metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lakemirror.daemon.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD: dict[str, Any] = json.loads((GRAFANA / "dashboards" / "lakemirror.json").read_text(encoding="utf-8"))

# ---------------------------------------------------------------------------------------------
# METRICS QUERIED BEFORE THE DAEMON EXPORTS THEM. Keep this list empty. A name may sit here only
# while the change that adds it to lakemirror.daemon.metrics.Metrics is in flight;
# test_pending_metrics_are_not_exported_yet fails as soon as Metrics exports one of them, so the
# exception is removed with the change that made it unnecessary.
# (lakemirror_retention_headroom_seconds, the last one, is exported now.)
NOT_YET_EXPORTED: frozenset[str] = frozenset()
# ---------------------------------------------------------------------------------------------

# Prometheus's own series, allowed in the alert rules only.
PROMETHEUS_SERIES = {"up"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan", "atan2"}


def exported_sample_names() -> set[str]:
    """The sample names Metrics exposes, from its families (prometheus_client's naming rules)."""
    registry = CollectorRegistry()
    Metrics("p", registry)
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_count", "_sum"],
                "summary": ["", "_count", "_sum"], "info": ["_info"]}
    return {family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels and strings removed)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)  # strings
    text = re.sub(r"\{[^{}]*\}", " ", text)                                  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)                                # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)  # label lists
    text = re.sub(r"\$\{?\w+\}?", " ", text)                                 # dashboard variables
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end():].lstrip()
        if following.startswith("(") or match.group().lower() in PROMQL_WORDS:
            continue  # a function call or a keyword
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number, e.g. 1e3
        names.add(match.group())
    return names


def panels(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in node.get("panels", []):
        yield panel
        yield from panels(panel)


def dashboard_queries() -> Iterator[tuple[str, str]]:
    for panel in panels(DASHBOARD):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            yield f"variable {var['name']}", inner.group(1) if inner else query


def test_the_metric_name_extraction() -> None:
    assert metric_names('histogram_quantile(0.95, sum by (le, table) (rate(x_bucket{op="a{b}",t=~"$t"}'
                        '[$__rate_interval])))') == {"x_bucket"}
    assert metric_names("time() - max by (table) (a_ts) > 1e3 and on (table) b unless c offset 5m") == {
        "a_ts", "b", "c"}
    assert metric_names('count by (state) (s{state="degraded"} == 1)') == {"s"}


def test_every_queried_metric_is_exported() -> None:
    exported = exported_sample_names()
    used: dict[str, set[str]] = {}
    for where, expr in dashboard_queries():
        for name in metric_names(expr):
            used.setdefault(name, set()).add(where)
    assert used, "the dashboard queries nothing"
    unknown = {name: sorted(wheres) for name, wheres in used.items()
               if name not in exported and name not in NOT_YET_EXPORTED}
    assert not unknown, f"the dashboard queries metrics the daemon does not export: {unknown}"


def test_pending_metrics_are_not_exported_yet() -> None:
    exported = exported_sample_names()
    assert not (NOT_YET_EXPORTED & exported), (
        f"{sorted(NOT_YET_EXPORTED & exported)} is exported now: remove it from NOT_YET_EXPORTED")


def test_the_alert_rules_use_exported_metrics_only() -> None:
    exported = exported_sample_names() | PROMETHEUS_SERIES
    for path in sorted((ROOT / "deploy" / "prometheus").glob("*.yml")):
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                unknown = metric_names(rule["expr"]) - exported - NOT_YET_EXPORTED
                assert not unknown, f"{path.name} {rule.get('alert')}: {unknown} not exported"


@pytest.mark.parametrize("title, metric", [
    ("Lag per table", "lakemirror_lag_seconds"),
    ("Versions behind", "lakemirror_versions_behind"),
    ("Rows applied by operation", "lakemirror_rows_applied_total"),
    ("Batch duration", "lakemirror_batch_duration_seconds_bucket"),
    ("Table states", "lakemirror_table_state"),
    ("Retries", "lakemirror_retries_total"),
    ("Retention headroom", "lakemirror_retention_headroom_seconds"),
    ("Kafka offsets behind", "lakemirror_kafka_offsets_behind"),
    ("Event-time lag", "lakemirror_event_time_lag_seconds_bucket"),
    ("Event rows by operation", "lakemirror_event_rows_applied_total"),
    ("Dead letters", "lakemirror_dead_letters_total"),
    ("PostgreSQL flush time", "lakemirror_sink_flush_seconds_bucket"),
    ("Stream latency", "lakemirror_stream_latency_seconds"),
])
def test_the_required_panels(title: str, metric: str) -> None:
    [panel] = [p for p in panels(DASHBOARD) if p["title"] == title]
    exprs = [t["expr"] for t in panel["targets"]]
    assert any(metric in metric_names(e) for e in exprs), f"{title} does not query {metric}"
    if title == "Rows applied by operation":
        assert all(re.search(r"sum by \(op\) \(rate\(", e) for e in exprs)
    if title == "Batch duration":
        assert all(e.startswith("histogram_quantile(") and "by (le)" in e for e in exprs)
    if title in ("Event-time lag", "PostgreSQL flush time"):  # p50 and p99
        assert [e.split(",")[0] for e in exprs] == ["histogram_quantile(0.5", "histogram_quantile(0.99"]
    if title == "Kafka offsets behind":
        assert all("by (source, topic, partition)" in e for e in exprs)


# The daemon's event-source and latency series: each one is on the dashboard, and the alert rules
# watch dead letters, the Kafka backlog and the event-time lag.
EVENT_AND_LATENCY_METRICS = {
    "lakemirror_kafka_offsets_behind", "lakemirror_event_time_lag_seconds_bucket", "lakemirror_event_batch_lag_seconds",
    "lakemirror_event_rows_applied_total", "lakemirror_event_changes_stale_total", "lakemirror_dead_letters_total",
    "lakemirror_dead_letters_pending", "lakemirror_sink_flush_seconds_bucket", "lakemirror_stream_latency_seconds",
}


def test_every_event_source_and_latency_metric_is_on_the_dashboard_and_alerted_where_it_matters() -> None:
    exported = exported_sample_names()
    assert EVENT_AND_LATENCY_METRICS <= exported, EVENT_AND_LATENCY_METRICS - exported
    families = {n for n in exported if n.startswith(("lakemirror_event_", "lakemirror_kafka_", "lakemirror_dead_"))
                and not n.endswith(("_count", "_sum"))}
    assert families <= EVENT_AND_LATENCY_METRICS, f"new event metrics to put on the dashboard: {families - EVENT_AND_LATENCY_METRICS}"
    shown = {name for _, expr in dashboard_queries() for name in metric_names(expr)}
    assert not EVENT_AND_LATENCY_METRICS - shown, f"not on the dashboard: {EVENT_AND_LATENCY_METRICS - shown}"
    alerted = {name for path in sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))
               for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
               for rule in group["rules"] for name in metric_names(rule["expr"])}
    assert {"lakemirror_dead_letters_total", "lakemirror_kafka_offsets_behind",
            "lakemirror_event_time_lag_seconds_bucket"} <= alerted


def test_every_panel_uses_the_datasource_variable() -> None:
    [var] = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "datasource"]
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    ids = [p["id"] for p in panels(DASHBOARD)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(DASHBOARD):
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) == panel["datasource"]
            assert target["refId"]
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}"
    assert "${datasource}" not in json.dumps(DASHBOARD["templating"]["list"][0])


def test_the_provisioning_files() -> None:
    dashboards = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "lakemirror.yaml").read_text())
    assert dashboards["apiVersion"] == 1
    [provider] = dashboards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    assert DASHBOARD["uid"] == "lakemirror" and DASHBOARD["schemaVersion"] >= 36
