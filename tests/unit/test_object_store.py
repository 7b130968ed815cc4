"""Object storage without a server: which jars a session loads, the delta-rs options derived from
the s3a settings, and the config checks for locations on S3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lakemirror.daemon import jars
from lakemirror.daemon.settings import RuntimeSettings, load_settings
from lakemirror.daemon.spark import session_jars
from lakemirror.errors import ConfigError
from lakemirror.object_store import (conditional_writes, delta_rs_storage_options, delta_rs_unreachable, delta_rs_uri,
                                     needs_s3a)
from lakemirror.secrets import mask_secrets
from lakemirror.sources.catalog import LocalCatalog
from lakemirror.identifiers import TableName

MOTO_CONF = {"fs.s3a.endpoint": "127.0.0.1:9000", "fs.s3a.connection.ssl.enabled": "false",
             "fs.s3a.endpoint.region": "eu-west-1", "fs.s3a.path.style.access": "true",
             "fs.s3a.access.key": "AKIAEXAMPLE", "fs.s3a.secret.key": "wJalrXUtnFEMI-secret"}


def test_delta_rs_options_carry_the_s3a_endpoint_region_style_and_credentials() -> None:
    assert delta_rs_storage_options(MOTO_CONF) == {
        "AWS_CONDITIONAL_PUT": "etag", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-secret"}
    # https by default; no endpoint: the AWS default one
    assert delta_rs_storage_options({"fs.s3a.endpoint": "s3.example.com"})["AWS_ENDPOINT_URL"] == "https://s3.example.com"
    assert "AWS_ENDPOINT_URL" not in delta_rs_storage_options({})


def test_delta_rs_commits_by_conditional_put_and_never_by_an_unsafe_rename() -> None:
    """Every commit file is a put with If-None-Match (a store refuses a version another writer took);
    the old unsafe-rename switch, a single-writer promise, is never set."""
    opts = delta_rs_storage_options({})
    assert opts["AWS_CONDITIONAL_PUT"] == "etag" and "AWS_S3_ALLOW_UNSAFE_RENAME" not in opts


def test_delta_rs_reaches_local_paths_and_s3a_with_conditional_writes_only() -> None:
    assert delta_rs_unreachable("/data/lakehouse/t", {}) is None
    assert delta_rs_unreachable("s3a://b/t", MOTO_CONF) is None
    assert conditional_writes({}) and conditional_writes({"fs.s3a.create.conditional.enabled": "true"})
    reasons = {
        "managed by its catalog": delta_rs_unreachable(None, {}),
        "gs:// storage": delta_rs_unreachable("gs://b/t", {}),
        "Spark Connect": delta_rs_unreachable("s3a://b/t", MOTO_CONF, own_jvm=False),
        "fs.s3a.create.conditional.enabled=false": delta_rs_unreachable(
            "s3a://b/t", {**MOTO_CONF, "fs.s3a.create.conditional.enabled": " FALSE "}),
    }
    for words, reason in reasons.items():
        assert reason is not None and words in reason, (words, reason)


def test_delta_rs_options_are_masked_as_secrets() -> None:
    masked = json.dumps(mask_secrets(delta_rs_storage_options(MOTO_CONF)))
    assert "wJalrXUtnFEMI-secret" not in masked and "AKIAEXAMPLE" not in masked


def test_delta_rs_names_s3a_locations_s3() -> None:
    assert delta_rs_uri("s3a://bucket/lakehouse/t") == "s3://bucket/lakehouse/t"
    assert delta_rs_uri("/data/lakehouse/t") == "/data/lakehouse/t"


def test_hadoop_aws_is_needed_only_for_s3a_locations_or_confs() -> None:
    assert needs_s3a(["s3a://b/wh"], {})
    assert needs_s3a(["/wh"], {"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000"})
    assert not needs_s3a(["/wh", "file:/x"], {"spark.sql.shuffle.partitions": "2"})


def _cache(folder: Path, names: list[str], packages: tuple[str, ...] = jars.MAVEN_PACKAGES) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_bytes(b"")
    (folder / jars.MANIFEST).write_text(json.dumps({"packages": list(packages), "jars": names}))


def test_a_session_loads_the_s3_group_only_when_a_location_needs_it(tmp_path: Path) -> None:
    _cache(tmp_path, ["delta.jar"])
    local = RuntimeSettings(warehouse="/wh", jars_dir=str(tmp_path))
    on_s3 = RuntimeSettings(warehouse="s3a://b/wh", jars_dir=str(tmp_path))
    assert [Path(p).name for p in session_jars(local)] == ["delta.jar"]
    with pytest.raises(jars.JarsMissing, match="hadoop-aws.*lakemirror fetch-jars"):
        session_jars(on_s3)
    _cache(tmp_path / "s3", ["hadoop-aws.jar", "bundle.jar"], jars.OPTIONAL_PACKAGES["s3"])
    assert [Path(p).name for p in session_jars(on_s3)] == ["delta.jar", "hadoop-aws.jar", "bundle.jar"]
    assert [Path(p).name for p in session_jars(local)] == ["delta.jar"]


def test_hadoop_aws_matches_the_hadoop_of_pyspark() -> None:
    from importlib.metadata import files

    bundled = [f.name for f in files("pyspark") or [] if f.name.startswith("hadoop-client-api-")]
    assert bundled == [f"hadoop-client-api-{jars.HADOOP_VERSION}.jar"]
    assert jars.OPTIONAL_PACKAGES["s3"] == (f"org.apache.hadoop:hadoop-aws:{jars.HADOOP_VERSION}",)


def test_a_warehouse_on_s3a_is_located_by_uri() -> None:
    catalog = LocalCatalog("s3a://bucket/lakehouse/")
    assert catalog.locate(TableName("src", "sales", "orders")).path == "s3a://bucket/lakehouse/src/sales/orders"


BASE: dict[str, Any] = {"source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales"}


def test_the_warehouse_may_be_on_s3a(tmp_path: Path) -> None:
    s = load_settings(None, {**BASE, "checkpoint_volume": str(tmp_path), "runtime": {"warehouse": "s3a://b/wh"}})
    assert s.runtime.warehouse == "s3a://b/wh"


@pytest.mark.parametrize("changes, field, message", [
    ({"checkpoint_volume": "s3a://b/ck"}, "checkpoint_volume", "need a local (or mounted) file system"),
    ({"runtime": {"warehouse": "s3://b/wh"}}, "runtime.warehouse", "write s3a://b/wh"),
    ({"runtime": {"warehouse": "gs://b/wh"}}, "runtime.warehouse", "a local directory or s3a://bucket/path"),
])
def test_locations_local_mode_cannot_use_are_named_with_the_fix(tmp_path: Path, changes: dict[str, Any], field: str,
                                                               message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, {**BASE, "checkpoint_volume": str(tmp_path), **changes})
    assert f"{field}: " in str(err.value) and message in str(err.value), str(err.value)
