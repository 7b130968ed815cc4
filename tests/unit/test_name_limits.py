"""Every name and string a user gives has a bound, as the pipeline's catalog, schema and table names
do: ``lakemirror replicate``'s configuration and flags, the pipeline's other blocks (destination,
event source, schedules, http, databricks), the control API's bodies and queries, and the command
line's arguments. A value past its bound exits 2 (or answers 404/422) naming the field, its length
and the bound, at once and without quoting it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lakemirror.daemon.cli import main
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.settings.replicate import cli_overrides, load_replicate_config
from lakemirror.errors import ConfigError

LONG = "n" * 300          # past the 255 characters of a name
LONGER = "/p" * 2100      # past the 4096 of a path


def replicate_config(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {"runtime": {"warehouse": str(tmp_path / "wh")},
                            "catalogs": [{"name": "prod", "target_catalog": "dr"}]}
    data.update(changes)
    path = tmp_path / "replicate.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def validate_replicate(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str, **changes: Any) -> str:
    code = main(["replicate", str(replicate_config(tmp_path, **changes)), "--validate-only", *flags])
    printed = capsys.readouterr()
    out = printed.out + printed.err
    assert code == 2, out
    assert "Traceback" not in out and len(out) < 4000, out
    return out


# -- lakemirror replicate ----------------------------------------------------------------------------

@pytest.mark.parametrize("changes, where, said", [
    ({"catalogs": [{"name": "c" * 40_000, "target_catalog": "dr"}]}, "catalogs[0].name",
     "catalog name is 40000 characters long; a name has at most 255"),
    ({"catalogs": [{"name": "prod", "target_catalog": LONG}]}, "catalogs[0].target_catalog",
     "catalog name is 300 characters long; a name has at most 255"),
    ({"catalogs": [{"name": "prod", "target_catalog": "dr", "schemas": [{"name": LONG}]}]},
     "catalogs[0].schemas[0].name", "schema name is 300 characters long"),
    ({"catalogs": [{"name": "prod", "target_catalog": "dr", "schemas": [{"name": "s", "target_schema": LONG}]}]},
     "catalogs[0].schemas[0].target_schema", "schema name is 300 characters long"),
    ({"catalogs": [{"name": "prod", "target_catalog": "dr", "schemas": [{"name": "s", "tables": [{"name": LONG}]}]}]},
     "catalogs[0].schemas[0].tables[0].name", "table name is 300 characters long"),
    ({"catalogs": [{"name": "prod", "target_catalog": "dr", "exclude_schemas": ["tmp*", LONG]}]},
     "catalogs[0].exclude_schemas", "a name or pattern is 300 characters long"),
    ({"catalogs": [{"name": "prod", "target_catalog": "dr", "schemas": [{"name": "s", "include_tables": [LONG]}]}]},
     "catalogs[0].schemas[0].include_tables", "a name or pattern is 300 characters long"),
    ({"keys": [LONG]}, "keys", "a key column name is 300 characters long"),
    ({"reconcile": {"exclude_columns": ["ok", LONG]}}, "reconcile.exclude_columns", "a column name is 300 characters"),
    ({"metadata": {"object_types": [LONG]}}, "metadata.object_types", "an object type is 300 characters long"),
    ({"audit_catalog": LONG}, "audit_catalog", "audit_catalog is 300 characters long"),
    ({"audit_table": f"a.{LONG}.t"}, "audit_table", "the schema name of audit_table is 300 characters long"),
    ({"reconciliation_table": "a." * 2000 + "t"}, "reconciliation_table",
     "reconciliation_table is 4001 characters long; a full table name has at most 773"),
    ({"checkpoint_volume": LONGER}, "checkpoint_volume", "checkpoint_volume is 4200 characters long; a path has at "
                                                         "most 4096"),
    ({"execution_log": {"folder": LONGER}}, "execution_log.folder", "is 4200 characters long; a path has at most 4096"),
    ({"volumes": [{"source": LONGER, "target": "/Volumes/c/s/v"}]}, "volumes[0].source",
     "source is 4200 characters long; a path has at most 4096"),
    ({"volumes": [{"source": "/data/in", "target": "/data/out", "name": f"c.s.{LONG}"}]}, "volumes[0].name",
     "the table name of name is 300 characters long"),
    ({"workspaces": {"source": {"host": "https://" + "h" * 5000}}}, "workspaces.source.host",
     "host is 5008 characters long; a path has at most 4096"),
    ({"workspaces": {"target": {"profile": LONG}}}, "workspaces.target.profile", "profile is 300 characters long"),
    ({"workspaces": {"target": {"host": "https://w", "token_env": "T" * 300}}}, "workspaces.target.token_env",
     "token_env is 300 characters long"),
    ({"workspaces": {"target": {"host": "https://w", "token": "x" * 20_000}}}, "workspaces.target.token",
     "token is 20000 characters long; a secret has at most 16384"),
    ({"runtime": {"mode": "databricks"}, "delta_sharing": {"recipient": LONG}}, "delta_sharing.recipient",
     "recipient is 300 characters long"),
    ({"runtime": {"mode": "databricks"}, "delta_sharing": {"share": "{catalog}" + LONG}}, "delta_sharing.share",
     "share is 309 characters long"),
    ({"backup": {"catalog": LONG}}, "backup.catalog", "catalog is 300 characters long"),
    ({"uc_objects": {"external_locations": [LONG]}}, "uc_objects.external_locations",
     "an external location's name is 300 characters long"),
    ({"uc_objects": {"principals": {"alice": LONG}}}, "uc_objects.principals", "a principal is 300 characters long"),
    ({"uc_objects": {"storage_credentials": {LONG: "cred"}}}, "uc_objects.storage_credentials",
     "a storage credential's name is 300 characters long"),
    ({"uc_objects": {"location_urls": {"s3://a": "s3://" + "b" * 5000}}}, "uc_objects.location_urls",
     "a storage URL is 5005 characters long; a path has at most 4096"),
])
def test_a_replicate_configuration_past_a_bound_exits_2_naming_the_field_and_the_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], where: str, said: str) -> None:
    if "runtime" in changes:
        changes = {**changes, "runtime": {"warehouse": str(tmp_path / "wh"), **changes["runtime"]}}
    out = validate_replicate(tmp_path, capsys, **changes)
    assert f"{where}: " in out and said in out, out
    assert "n" * 256 not in out and "/p" * 200 not in out and "x" * 300 not in out, "the value is not quoted"


def test_the_bounds_admit_names_of_the_longest_length(tmp_path: Path) -> None:
    name = "n" * 255
    config = load_replicate_config(None, data={
        "runtime": {"warehouse": str(tmp_path)}, "keys": [name], "audit_table": f"{name}.{name}.{name}",
        "catalogs": [{"name": name, "target_catalog": name, "schemas": [{"name": name, "include_tables": [name]}]}]})
    assert config.catalogs[0].name == name and config.effective_audit_table.count(name) == 3


@pytest.mark.parametrize("flags, said", [
    (["--target-catalog", "d" * 40_000], "--target-catalog is 40000 characters long; a name has at most 255"),
    (["--target-schemas", f"sales,{LONG}"], "a schema of --target-schemas is 300 characters long"),
    (["--uc-object-types", LONG], "an object type is 300 characters long"),
])
def test_replicates_flags_past_a_bound_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                              said: str) -> None:
    out = validate_replicate(tmp_path, capsys, *flags)
    assert "command line" in out and said in out, out


def test_cli_overrides_are_bounded_without_a_file() -> None:
    with pytest.raises(ConfigError) as err:
        cli_overrides("d" * 300, None, None, None)
    assert err.value.problems == [("command line: target_catalog",
                                   "Value error, --target-catalog is 300 characters long; a name has at most 255")]


# -- the pipeline's other blocks ---------------------------------------------------------------------

PIPELINE = {"source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales"}


@pytest.mark.parametrize("changes, where, said", [
    ({"checkpoint_table": f"a.b.{LONG}"}, "checkpoint_table", "the table name of checkpoint_table is 300 characters"),
    ({"http": {"host": "h" * 300}}, "http.host", "at most 255 characters"),
    ({"http": {"auth_token": "x" * 20_000}}, "http.auth_token", "auth_token is 20000 characters long; a secret has at "
                                                                "most 16384"),
    ({"databricks": {"wheel": LONGER}}, "databricks.wheel", "at most 4096 characters"),
    ({"databricks": {"node_type_id": LONG}}, "databricks.node_type_id", "at most 255 characters"),
    ({"runtime": {"master": "local[" + "9" * 5000 + "]"}}, "runtime.master", "at most 4096 characters"),
    ({"runtime": {"mode": "connect", "spark_remote": "sc://" + "h" * 5000}}, "runtime.spark_remote",
     "at most 4096 characters"),
    ({"destination": {"kind": "postgres", "host": LONG, "database": "d", "user": "u"}}, "destination.postgres.host",
     "at most 255 characters"),
    ({"destination": {"kind": "postgres", "host": "h", "database": "d" * 64, "user": "u"}},
     "destination.postgres.database", "at most 63 characters"),
    ({"destination": {"kind": "postgres", "host": "h", "database": "d", "user": "u" * 64}},
     "destination.postgres.user", "at most 63 characters"),
    ({"destination": {"kind": "postgres", "host": "h", "database": "d", "user": "u", "password": "p" * 20_000}},
     "destination.postgres.password", "password is 20000 characters long; a secret has at most 16384"),
    ({"destination": {"kind": "postgres", "host": "h", "database": "d", "user": "u", "table_modes": {LONG: "snapshot"},
                      "every_seconds": 60}}, "destination.postgres.table_modes", "a table name is 300 characters long"),
    ({"source": {"kind": "kafka", "bootstrap_servers": "k:9092", "topics": [LONG]}}, "source.topics",
     "a topic name is 300 characters long"),
    ({"source": {"kind": "kafka", "bootstrap_servers": "k:9092", "topic_pattern": "t" * 5000}}, "source.topic_pattern",
     "at most 4096 characters"),
    ({"source": {"kind": "kafka", "bootstrap_servers": "k" * 5000, "topics": ["t"]}}, "source.bootstrap_servers",
     "at most 4096 characters"),
    ({"source": {"kind": "kafka", "bootstrap_servers": "k:9092", "topics": ["t"], "tables": [LONG]}}, "source.tables",
     "a table name is 300 characters long"),
    ({"source": {"kind": "kafka", "bootstrap_servers": "k:9092", "topics": ["t"], "key_columns": {"t": [LONG]}}},
     "source.key_columns", "a column name is 300 characters long"),
    ({"schedules": [{"name": "nightly", "operations": ["clone"], "every_seconds": 60, "tables": [LONG]}]},
     "schedules[0].tables", "a table name is 300 characters long"),
])
def test_the_pipelines_other_names_are_bounded(tmp_path: Path, changes: dict[str, Any], where: str,
                                               said: str) -> None:
    data = {**PIPELINE, "checkpoint_volume": str(tmp_path / "ck"), **changes}
    data["runtime"] = {"warehouse": str(tmp_path / "wh"), **changes.get("runtime", {})}
    with pytest.raises(ConfigError) as err:
        load_settings(None, data)
    found = [(w, m) for w, m in err.value.problems if where in w]
    assert found and said in found[0][1], err.value.problems
    assert all("n" * 256 not in m and "p" * 300 not in m and "x" * 300 not in m for _, m in err.value.problems)


def test_the_configuration_reference_shows_the_new_bounds() -> None:
    reference = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text().splitlines()

    def row(field: str) -> str:
        return next(line for line in reference if line.startswith(f"| `{field}`"))

    assert "at most 255 characters" in row("http.host") and "at most 63 characters" in row("destination.database")
    assert "string or unset (at most 4096 characters)" in row("source.path")


# -- the control API and the command line ------------------------------------------------------------

def test_control_routes_bound_a_table_name_without_quoting_it() -> None:
    from prometheus_client import CollectorRegistry

    from lakemirror.daemon.http import ControlServer
    from tests.unit.test_control import post
    from tests.unit.test_supervisor import started

    w = started(["orders"])
    srv = ControlServer("127.0.0.1", 0, CollectorRegistry(), w.sup.views, {"pipeline_id": "p"}, commands=w.sup.command)
    srv.start()
    try:
        code, answer = post(f"{srv.url}/tables/{'t' * 5000}/pause")
        assert code == 404 and "5000 characters long" in answer["error"] and "at most 255" in answer["error"], answer
        assert "t" * 300 not in answer["error"]
    finally:
        srv.close()


def test_the_pause_command_refuses_an_overlong_table_before_asking_the_daemon(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(json.dumps({**PIPELINE, "checkpoint_volume": str(tmp_path / "ck")}))
    assert main(["pause", str(config), "t" * 40_000]) == 2
    err = capsys.readouterr().err
    assert "TABLE is 40000 characters long; a table name has at most 255" in err and len(err) < 300, err


def test_dead_letter_requests_bound_their_ids_table_and_source() -> None:
    from lakemirror.daemon import routes
    from lakemirror.daemon.dead_letter_api import MAX_IDS, DeadLetterApi

    class Source:
        keeps_dead_letters_in_delta = True
        letters_elsewhere = ""
        asked: list[Any] = []

        def dead_letters(self, *args: Any) -> list[dict[str, Any]]:
            self.asked.append(args)
            return []

        def resolve_dead_letters(self, *args: Any) -> Any:
            raise AssertionError("a refused request resolves nothing")

    source = Source()
    api = DeadLetterApi(lambda name: source if name == "shop" else None)

    def answer(method: str, target: str, body: Any = None) -> tuple[int, Any]:
        m = routes.match(method, target)
        assert isinstance(m, routes.Match)
        return api.handle(m, body)

    code, out = answer("POST", "/api/events/shop/dead-letters/skip", {"ids": ["x" * 300]})
    assert code == 422 and "at most 255 characters each" in out["problems"][0]["message"], out
    code, out = answer("POST", "/api/events/shop/dead-letters/skip", {"ids": ["a"] * (MAX_IDS + 1)})
    assert code == 422 and f"at most {MAX_IDS} ids" in out["problems"][0]["message"], out
    code, out = answer("POST", "/api/events/shop/dead-letters/replay", {"all_pending": True, "table": LONG})
    assert code == 422 and out["problems"][0]["field"] == "table", out
    code, out = answer("GET", f"/api/events/shop/dead-letters?table={LONG}")
    assert code == 422 and out["problems"][0]["field"] == "table", out
    code, out = answer("GET", "/api/events/shop/dead-letters?limit=" + "9" * 5000)
    assert code == 422 and out["problems"][0]["field"] == "limit", out
    code, out = answer("GET", f"/api/events/{'s' * 5000}/dead-letters")
    assert code == 404 and "5000 characters long" in out["error"] and "s" * 300 not in out["error"], out
    assert source.asked == []


def test_recovery_point_inputs_are_bounded() -> None:
    from lakemirror.daemon.recovery import MAX_INSTANT_CHARS, check_name, parse_instant, parse_tables

    with pytest.raises(ConfigError, match="a table name is 300 characters long"):
        parse_tables(f"orders,{LONG}")
    with pytest.raises(ConfigError, match=f"one has at most {MAX_INSTANT_CHARS}"):
        parse_instant("1" * 5000)
    with pytest.raises(ConfigError, match="--anchor is 300 characters long"):
        check_name(LONG, "--anchor")
    assert parse_instant("2026-05-01T12:00:00.000000+00:00") == 1777636800.0


def test_the_recovery_point_endpoint_bounds_its_query_without_quoting_it() -> None:
    from tests.unit.test_recovery_api import api, get

    def fn(*args: Any) -> dict[str, Any]:
        raise AssertionError("a refused query computes nothing")

    code, body = get(api(fn), f"/api/recovery-point?anchor={LONG}&tables=a,{LONG}&at={'1' * 5000}")
    assert code == 422, body
    assert sorted(p["field"] for p in body["problems"]) == ["anchor", "at", "tables"]
    assert all("n" * 256 not in p["message"] and "1" * 100 not in p["message"] for p in body["problems"])
