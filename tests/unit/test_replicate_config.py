"""The replicate config hierarchy: CLI > table > schema > catalog > top level > defaults."""

from __future__ import annotations

import pytest

from lakemirror.daemon.settings.runtime_spec import plan, task_settings
from lakemirror.daemon.settings.replicate import CliOverrides, cli_overrides, deep_merge, load_replicate_config
from lakemirror.errors import ConfigError
from lakemirror.sources.catalog import InMemoryDiscovery

CONFIG = {
    "max_workers": 3,
    "operations": ["clone", "reconcile"],
    "timeout_seconds": 100,
    "retry": {"max_attempts": 2, "base_delay_seconds": 1},
    "reconcile": {"buckets": 16, "exclude_columns": ["a", "b"]},
    "catalogs": [{
        "name": "prod", "target_catalog": "dr",
        "exclude_schemas": ["tmp*"],
        "timeout_seconds": 200,
        "retry": {"max_attempts": 4},
        "schemas": [{
            "name": "sales", "target_schema": "sales_copy", "exclude_tables": ["*_bak"],
            "reconcile": {"repair": True, "exclude_columns": ["c"]},
            "tables": [{"name": "orders", "keys": ["order_id"], "timeout_seconds": 300,
                        "retry": {"jitter": 0}}],
        }],
    }, {"name": "prod", "target_catalog": "dr2", "include_schemas": ["hr"]}],
}
TREE = InMemoryDiscovery({"prod": {"sales": ["orders", "items", "orders_bak"], "hr": ["people"],
                                   "tmp1": ["x"]}})


def _settings(cfg, table="orders", schema="sales", entry=0):
    return task_settings(cfg, cfg.catalogs[entry], schema, table)


def test_each_level_overrides_its_parent_and_mappings_merge():
    cfg = load_replicate_config(None, data=CONFIG)
    t = _settings(cfg)
    assert t.timeout_seconds == 300                       # table over catalog over top
    assert t.max_attempts == 4                            # catalog over top
    assert t.backoff.base_delay_seconds == 1              # top, merged under catalog's retry
    assert t.backoff.jitter == 0                          # table
    assert t.keys == ("order_id",)
    assert t.options["reconcile"]["buckets"] == 16        # top
    assert t.options["reconcile"]["repair"] is True       # schema
    assert t.options["reconcile"]["exclude_columns"] == ["c"]  # lists replace, never concatenate
    other = _settings(cfg, table="items")
    assert other.timeout_seconds == 200 and other.keys == ()
    hr = _settings(cfg, table="people", schema="hr", entry=1)
    assert (hr.timeout_seconds, hr.max_attempts, hr.options["reconcile"]["repair"]) == (100, 2, False)


def test_cli_flags_win_over_every_level():
    cli = cli_overrides(None, None, "metadata", "table_comment,column_comment")
    cfg = load_replicate_config(None, cli, data=CONFIG)
    t = _settings(cfg)
    assert t.operations == ("metadata",)
    assert t.options["metadata"]["object_types"] == ["table_comment", "column_comment"]
    assert t.timeout_seconds == 300                      # untouched by the CLI


def test_selection_include_exclude_and_target_names():
    cfg = load_replicate_config(None, data=CONFIG)
    jobs = [(str(j.source), str(j.target)) for j in plan(cfg, TREE)]
    assert jobs == [("prod.hr.people", "dr.hr.people"),
                    ("prod.sales.items", "dr.sales_copy.items"), ("prod.sales.orders", "dr.sales_copy.orders"),
                    ("prod.hr.people", "dr2.hr.people")]


def test_target_catalog_and_target_schemas_flags():
    cfg = load_replicate_config(None, CliOverrides(target_catalog="dr", target_schemas=["sales"]), data=CONFIG)
    assert [str(j.target) for j in plan(cfg, TREE)] == ["dr.sales_copy.items", "dr.sales_copy.orders"]
    with pytest.raises(ConfigError, match="no catalog entry targets"):
        load_replicate_config(None, CliOverrides(target_catalog="nope"), data=CONFIG)


def test_problems_are_reported_once_with_their_level():
    bad = deep_merge(CONFIG, {"retry": {"max_atempts": 3}})
    bad["catalogs"][0]["schemas"][0]["tables"][0]["timeout_seconds"] = 0
    with pytest.raises(ConfigError) as err:
        load_replicate_config(None, data=bad)
    assert err.value.problems == [
        ("settings: retry.max_atempts", "unknown setting (check the spelling)"),
        ("settings: catalogs[0].schemas[0].tables[0].timeout_seconds", "Input should be greater than 0")]


def test_bad_cli_values_and_names():
    with pytest.raises(ConfigError, match="command line"):
        cli_overrides(None, None, "copy", None)
    with pytest.raises(ConfigError, match="unknown object types"):
        cli_overrides(None, None, None, "table_tag,nope")
    with pytest.raises(ConfigError):
        load_replicate_config(None, data={"catalogs": [{"name": "a.b", "target_catalog": "x"}]})
    with pytest.raises(ConfigError):
        load_replicate_config(None, data={"catalogs": []})


def test_deep_merge():
    assert deep_merge({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2]}, "e": 2}) == \
        {"a": {"b": 1, "c": [2]}, "d": 1, "e": 2}


def test_audit_and_reconciliation_tables_default_to_the_first_target():
    cfg = load_replicate_config(None, data=CONFIG)
    assert cfg.effective_audit_table == "dr.continuous_sync.audit_log"
    assert cfg.effective_reconciliation_table == "dr.continuous_sync.reconciliation"


def test_the_documented_example_is_valid():
    import re
    from pathlib import Path

    import yaml

    doc = Path(__file__).resolve().parents[2] / "docs" / "batch-replication.md"
    section = doc.read_text().split("# Batch replication, reconciliation and metadata sync", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    cfg = load_replicate_config(None, data=yaml.safe_load(block))
    t = task_settings(cfg, cfg.catalogs[0], "sales", "order_items")
    assert t.keys == ("order_id", "line_no") and t.max_attempts == 5 and t.options["reconcile"]["repair"] is True


def test_cli_validate_only_exit_codes(tmp_path, capsys):
    import yaml

    from lakemirror.daemon.cli import main

    good = tmp_path / "r.yaml"
    good.write_text(yaml.safe_dump(CONFIG))
    assert main(["replicate", str(good), "--validate-only", "--target-catalog", "dr"]) == 0
    assert "valid (1 catalog(s)" in capsys.readouterr().out
    assert main(["replicate", str(good), "--validate-only", "--operation", "copy"]) == 2
    assert "command line: operations[0]" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("catalogs:\n  - name: prod\n    target_catalog: dr\n    retry: {max_attempts: 0}\n")
    assert main(["replicate", str(bad), "--validate-only"]) == 2
    assert f"{bad}: catalogs[0].retry.max_attempts" in capsys.readouterr().err
