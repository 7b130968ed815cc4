"""The jar fetch: Ivy settings that name Maven Central alone, one line on failure, and a manifest
that goes stale when the package list changes. No JVM, no network."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lakemirror.daemon import jars


def test_ivy_settings_name_maven_central_over_https_and_nothing_else() -> None:
    root = ET.parse(jars.IVY_SETTINGS).getroot()
    resolvers = list(root.find("resolvers") or [])
    assert [(r.tag, r.get("root"), r.get("m2compatible")) for r in resolvers] == [
        ("ibiblio", "https://repo1.maven.org/maven2/", "true")]
    assert root.find("settings").get("defaultResolver") == resolvers[0].get("name")
    # No chain, no file system or URL resolver, no include of Ivy's defaults, no local repository.
    tags = {e.tag for e in root.iter()}
    assert not tags & {"chain", "filesystem", "url", "include", "settings-include"}
    text = jars.IVY_SETTINGS.read_text()
    body = text[text.index("<ivysettings>"):]  # the comment above may name what is avoided
    assert "user.home" not in body and ".m2" not in body and "file:" not in body
    # Downloads are kept under our own cache (a property resolve() sets), locked per artifact.
    cache = root.find("caches")
    assert cache.get("default") == "lakemirror"
    assert [(c.get("basedir"), c.get("lockStrategy")) for c in cache] == [
        ("${lakemirror.ivy.cache}", "artifact-lock")]


def test_the_settings_ship_with_the_package() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"lakemirror.daemon" = [' in pyproject and '"*.xml"' in pyproject
    assert jars.IVY_SETTINGS.parent == Path(jars.__file__).parent


# Recorded from real failures (`lakemirror fetch-jars`, Spark 4.2.0): a POM without its jar in
# ~/.m2 under Spark's default chain, and Maven Central unreachable (connection refused).
M2_POM_WITHOUT_JAR = """\
:: loading settings :: url = jar:file:/venv/pyspark/jars/ivy-2.5.3.jar!/org/apache/ivy/core/settings/ivysettings.xml
\tfound io.delta#delta-spark_4.2_2.13;4.4.0 in local-m2-cache
\tHost repos.spark-packages.org not found. url=https://repos.spark-packages.org/org/slf4j/slf4j-bom/2.0.13/slf4j-bom-2.0.13.jar
:: problems summary ::
:::: WARNINGS
\t\t[NOT FOUND  ] io.delta#delta-spark_4.2_2.13;4.4.0!delta-spark_4.2_2.13.jar (0ms)
\t==== local-m2-cache: tried
\t  file:/root/.m2/repository/io/delta/delta-spark_4.2_2.13/4.4.0/delta-spark_4.2_2.13-4.4.0.jar
\t\t::              FAILED DOWNLOADS            ::
:: USE VERBOSE OR DEBUG MESSAGE LEVEL FOR MORE DETAILS
Exception in thread "main" java.lang.RuntimeException: [download failed: io.delta#delta-spark_4.2_2.13;4.4.0!delta-spark_4.2_2.13.jar]
\tat org.apache.spark.util.MavenUtils$.resolveMavenCoordinates(MavenUtils.scala:539)
"""

CONNECTION_REFUSED = """\
:: problems summary ::
:::: WARNINGS
\t\tmodule not found: io.delta#delta-storage;4.4.0

\t==== maven-central: tried

\t  https://repo1.maven.org/maven2/io/delta/delta-storage/4.4.0/delta-storage-4.4.0.pom

\t  -- artifact io.delta#delta-storage;4.4.0!delta-storage.jar:

\t  https://repo1.maven.org/maven2/io/delta/delta-storage/4.4.0/delta-storage-4.4.0.jar

:::: ERRORS
\tServer access error at url https://repo1.maven.org/maven2/io/delta/delta-storage/4.4.0/delta-storage-4.4.0.pom (java.net.ConnectException: Connection refused)

Exception in thread "main" java.lang.RuntimeException: [unresolved dependency: io.delta#delta-storage;4.4.0: not found]
\tat org.apache.spark.util.MavenUtils$.resolveMavenCoordinates(MavenUtils.scala:539)
"""


def test_a_failed_download_is_one_line_with_the_artifact_and_the_url_tried() -> None:
    line = jars.failure_summary(M2_POM_WITHOUT_JAR)
    assert "\n" not in line
    assert line.startswith("could not fetch the jars from Maven Central: download failed: "
                           "io.delta#delta-spark_4.2_2.13;4.4.0!delta-spark_4.2_2.13.jar")
    assert "tried file:/root/.m2/repository/io/delta/delta-spark_4.2_2.13/4.4.0/" in line


def test_an_unreachable_repository_is_one_line_with_the_network_error() -> None:
    line = jars.failure_summary(CONNECTION_REFUSED)
    assert "\n" not in line
    assert "unresolved dependency: io.delta#delta-storage;4.4.0: not found" in line
    assert "tried https://repo1.maven.org/maven2/io/delta/delta-storage/4.4.0/delta-storage-4.4.0.pom" in line
    assert "java.net.ConnectException: Connection refused" in line


def test_output_without_an_exception_still_gives_its_last_line() -> None:
    assert jars.failure_summary("starting\nError: JAVA_HOME is not set\n\n").endswith(
        "Error: JAVA_HOME is not set")
    assert "without output" in jars.failure_summary("")


def _cache(folder: Path, packages: list[str]) -> None:
    (folder / "a.jar").write_bytes(b"PK")
    (folder / jars.MANIFEST).write_text(json.dumps({"packages": packages, "jars": ["a.jar"]}))


def test_jars_fetched_for_the_current_package_list_are_used(tmp_path: Path) -> None:
    _cache(tmp_path, list(reversed(jars.MAVEN_PACKAGES)))
    assert jars.jar_paths(tmp_path) == [str(tmp_path / "a.jar")]


def test_jars_fetched_for_another_package_list_are_stale(tmp_path: Path) -> None:
    # Adding a coordinate to MAVEN_PACKAGES must make `fetch-jars --check` (and so `make setup`) fetch again.
    _cache(tmp_path, list(jars.MAVEN_PACKAGES[:1]))
    with pytest.raises(jars.JarsMissing, match=r"another package list \(missing: .*spark-sql-kafka"):
        jars.jar_paths(tmp_path)
