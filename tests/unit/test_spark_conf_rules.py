"""runtime.spark_conf checked at validate the way Spark would read it, and combined with the confs
lakemirror's session depends on without silently replacing them."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from lakemirror.daemon import jars, spark_classes, spark_conf_rules, spark_values
from lakemirror.daemon.settings import RuntimeSettings, load_settings
from lakemirror.daemon.spark import DELTA_CONFS, LOG4J_CONFIG, session_confs
from lakemirror.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("LAKEMIRROR_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("key, value, message", [
    ("spark.sql.adaptive.enabled", "maybe", "spark.sql.adaptive.enabled 'maybe' must be true or false"),
    ("spark.hadoop.fs.s3a.path.style.access.enabled", "yes", "must be true or false"),
    ("spark.driver.maxresultsize", "1g", "names are case-sensitive and Spark would ignore this one; write "
                                         "'spark.driver.maxResultSize'"),
    ("spark.SQL.extensions", "a.B", "write 'spark.sql.extensions'"),
    ("spark.sql.extensions", "com.example.My Extension", "is not a Java class name"),
    ("spark.sql.catalog.spark_catalog", "org.example.Catalog",
     "must stay org.apache.spark.sql.delta.catalog.DeltaCatalog"),
    ("spark.sql.session.timeZone", "Europe/Paris", "must stay UTC"),
    ("spark.executor.memoryOverhead", "lots", "is not a size"),
    ("spark.sql.autoBroadcastJoinThreshold", "10 MB", "is not a size"),
    ("spark.executor.cores", "0", "from 1 to"),
    ("spark.app.name", "x" * 20_000, "at most 16384"),
])
def test_a_conf_spark_would_refuse_or_ignore_is_refused(key: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        spark_values.spark_conf_value(key, value)
    assert message in str(err.value), err.value


@pytest.mark.parametrize("key, value, normal", [
    ("spark.sql.adaptive.enabled", " TRUE ", "true"), ("spark.sql.autoBroadcastJoinThreshold", "-1", "-1"),
    ("spark.sql.session.timeZone", "UTC", "UTC"), ("spark.executor.memoryOverhead", "384", "384"),
    ("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension, com.example.Ext$Inner", None),
    ("spark.sql.catalog.uc", "io.unitycatalog.spark.UCSingleCatalog", None),
    ("spark.hadoop.fs.s3a.endpoint", "http://minio:9000", None),
])
def test_a_conf_spark_reads_passes(key: str, value: str, normal: str | None) -> None:
    assert spark_values.spark_conf_value(key, value) == (normal if normal is not None else value)


def test_every_problem_of_spark_conf_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as err:
        RuntimeSettings(spark_conf={"spark.sql.adaptive.enabled": "maybe", "spark.ui.enabled": "no",
                                    "spark.driver.maxresultsize": "1g"})
    text = str(err.value)
    assert "'maybe'" in text and "'no'" in text and "spark.driver.maxResultSize" in text


# -- combining the user's confs with lakemirror's ----------------------------------------------------------

def test_lists_are_joined_required_values_kept_and_other_confs_won_by_the_user() -> None:
    ours = {**DELTA_CONFS, "spark.jars": "/c/delta.jar,/c/kafka.jar", "spark.driver.extraJavaOptions": "-Dlog=x",
            "spark.sql.session.timeZone": "UTC", "spark.sql.shuffle.partitions": "4"}
    users = {"spark.sql.extensions": f"com.example.Ext,{spark_conf_rules.DELTA_EXTENSION}",
             "spark.jars": "/opt/mine.jar", "spark.driver.extraJavaOptions": "-Xss4m -Dlog=x",
             "spark.sql.shuffle.partitions": "16", "spark.sql.session.timeZone": "UTC"}
    out = spark_conf_rules.merge(ours, users)
    assert out["spark.sql.extensions"] == f"{spark_conf_rules.DELTA_EXTENSION},com.example.Ext"
    assert out["spark.jars"] == "/c/delta.jar,/c/kafka.jar,/opt/mine.jar"
    assert out["spark.driver.extraJavaOptions"] == "-Dlog=x -Xss4m"
    assert out["spark.sql.catalog.spark_catalog"] == spark_conf_rules.DELTA_CATALOG
    assert out["spark.sql.shuffle.partitions"] == "16"


def _cached_jars(folder: Path, classes: dict[str, list[str]]) -> Path:
    """A jars cache as `lakemirror fetch-jars` leaves it, with jars holding ``classes``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, held in classes.items():
        with zipfile.ZipFile(folder / name, "w") as jar:
            for cls in held:
                jar.writestr(cls.replace(".", "/") + ".class", b"\xca\xfe\xba\xbe")
    (folder / jars.MANIFEST).write_text(json.dumps({"packages": list(jars.MAVEN_PACKAGES), "jars": list(classes)}))
    return folder


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    yield _cached_jars(tmp_path / "jars", {"delta.jar": [spark_conf_rules.DELTA_EXTENSION,
                                                         spark_conf_rules.DELTA_CATALOG],
                                           "ext.jar": ["com.example.GoodExtension", "com.example.Outer$Inner"]})


def test_the_session_keeps_deltas_extension_catalog_and_jars_beside_the_users(cache: Path, tmp_path: Path) -> None:
    rt = RuntimeSettings(warehouse=str(tmp_path / "wh"), jars_dir=str(cache), spark_conf={
        "spark.sql.extensions": "com.example.GoodExtension", "spark.jars": "/opt/mine.jar",
        "spark.driver.extraJavaOptions": "-Xss4m", "spark.ui.enabled": "true"})
    confs = session_confs(rt)
    assert confs["spark.sql.extensions"] == f"{spark_conf_rules.DELTA_EXTENSION},com.example.GoodExtension"
    assert confs["spark.jars"] == f"{cache / 'delta.jar'},{cache / 'ext.jar'},/opt/mine.jar"
    assert confs["spark.driver.extraJavaOptions"] == f"-Dlog4j2.configurationFile={LOG4J_CONFIG} -Xss4m"
    assert confs["spark.sql.catalog.spark_catalog"] == spark_conf_rules.DELTA_CATALOG
    assert confs["spark.ui.enabled"] == "true"  # tuning: the user's value wins


# -- classes a conf names ----------------------------------------------------------------------------------

def _config(tmp_path: Path, cache: Path, conf: dict[str, str]) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(json.dumps({"source_catalog": "src", "destination_catalog": "dst", "schema_name": "sales",
                                "checkpoint_volume": str(tmp_path / "ck"),
                                "runtime": {"warehouse": str(tmp_path / "wh"), "jars_dir": str(cache),
                                            "spark_conf": conf}}))
    return path


@pytest.mark.skipif(spark_classes.spark_jars_folder() is None, reason="pyspark's jars are not installed")
def test_a_class_in_no_jar_of_the_session_is_refused_at_validate(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_config(tmp_path, cache, {"spark.sql.extensions": "com.example.MissingExtension",
                                                "spark.serializer": "org.apache.spark.serializer.KryoSerializer"}))
    assert err.value.problems == [(f"{tmp_path / 'pipeline.yaml'}: runtime.spark_conf",
                                   "spark.sql.extensions: the class com.example.MissingExtension is in no jar of the "
                                   "session (Spark's own, lakemirror's cached jars, spark.jars); check its spelling, "
                                   "or add its jar to spark.jars")]
    for good in ({"spark.sql.extensions": "com.example.GoodExtension,com.example.Outer$Inner"},
                 {"spark.sql.catalog.mine": "com.example.GoodExtension"},
                 {"spark.serializer": "org.apache.spark.serializer.KryoSerializer"},  # Spark's own jars
                 {"spark.sql.extensions": "com.example.Elsewhere", "spark.jars.packages": "com.example:x:1"}):
        load_settings(_config(tmp_path, cache, good))


def test_a_users_local_jar_is_on_the_class_path(tmp_path: Path, cache: Path) -> None:
    mine = _cached_jars(tmp_path / "mine", {"mine.jar": ["org.example.Plugin"]}) / "mine.jar"
    load_settings(_config(tmp_path, cache, {"spark.plugins": "org.example.Plugin", "spark.jars": str(mine)}))
    assert spark_classes.missing(["org.example.Plugin", "example.Plugin", "org.example.Plug"], [mine]) == [
        "example.Plugin", "org.example.Plug"]  # a name is matched whole, never as a suffix or prefix
