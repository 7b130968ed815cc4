"""The jar fetch against the real Maven Central (or the Ivy cache ``make setup`` filled), with a
home directory whose ~/.m2 holds Delta's POM without its jar: the state that made Spark's default
Ivy chain fail ``make setup``. No Spark session; each test runs one short spark-submit."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lakemirror.daemon import jars

pytestmark = pytest.mark.integration

DELTA = jars.MAVEN_PACKAGES[0]
GROUP, ARTIFACT, VERSION = DELTA.split(":")

POM = f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>{GROUP}</groupId>
  <artifactId>{ARTIFACT}</artifactId>
  <version>{VERSION}</version>
  <packaging>jar</packaging>
</project>
"""


def poisoned_home(tmp_path: Path) -> dict[str, str]:
    """An environment whose home (for Python and for Java's user.home) has ~/.m2 holding Delta's
    POM and no jar."""
    home = tmp_path / "home"
    entry = home / ".m2" / "repository" / Path(*GROUP.split(".")) / ARTIFACT / VERSION
    entry.mkdir(parents=True)
    (entry / f"{ARTIFACT}-{VERSION}.pom").write_text(POM)
    return dict(os.environ, HOME=str(home), SPARK_SUBMIT_OPTS=f"-Duser.home={home}")


def test_a_pom_without_its_jar_in_m2_is_never_consulted(tmp_path: Path) -> None:
    # The Ivy cache is the one `make setup` filled (the first run of this test fills it from Maven
    # Central); what the poisoned home could change is where Ivy looks, and that is what is checked.
    resolution = jars.resolve([DELTA], jars.default_ivy_cache(), tmp_path / "work",
                              env=poisoned_home(tmp_path))
    names = {j.name for j in resolution.jars}
    delta_jar = tmp_path / "work" / "jars" / f"{GROUP}_{ARTIFACT}-{VERSION}.jar"
    assert delta_jar.name in names and zipfile.is_zipfile(delta_jar)
    assert any(n.startswith("io.delta_delta-storage-") for n in names)
    # Ivy's resolution messages: Delta and every dependency were found by Maven Central's resolver,
    # and the local Maven repository is not a resolver at all.
    assert f"found {GROUP}#{ARTIFACT};{VERSION} in maven-central" in resolution.log
    found = [ln.split(" in ")[-1] for ln in resolution.log.splitlines() if ln.strip().startswith("found ")]
    assert found and set(found) == {"maven-central"}
    assert "local-m2-cache" not in resolution.log and ".m2" not in resolution.log
    assert "spark-packages" not in resolution.log


def test_an_artifact_that_cannot_be_fetched_fails_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(jars.FetchFailed) as failure:
        jars.resolve([f"{GROUP}:lakemirror-no-such-artifact:0.0.1"], tmp_path / "ivy", tmp_path / "work",
                     env=poisoned_home(tmp_path))
    line = str(failure.value)
    assert "\n" not in line
    assert "io.delta#lakemirror-no-such-artifact;0.0.1" in line
    assert ("tried https://repo1.maven.org/maven2/io/delta/lakemirror-no-such-artifact/0.0.1/"
            "lakemirror-no-such-artifact-0.0.1.pom") in line
    log = Path(line.rsplit("full log: ", 1)[1].rstrip(")"))
    assert log.is_file() and "Exception in thread" in log.read_text()


def test_fetch_jars_without_a_reachable_repository_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    # Maven Central made unreachable for the resolving JVM only: its https proxy is a closed port.
    env = dict(poisoned_home(tmp_path), LAKEMIRROR_IVY_CACHE=str(tmp_path / "ivy"),
               SPARK_SUBMIT_OPTS=f"-Duser.home={tmp_path / 'home'} -Dhttps.proxyHost=127.0.0.1 "
                                 f"-Dhttps.proxyPort=9")
    cli = Path(sys.executable).with_name("lakemirror")
    proc = subprocess.run([str(cli), "fetch-jars", "--dest", str(tmp_path / "jars")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fetch-jars: could not fetch the jars from Maven Central: unresolved dependency: "
                               f"{GROUP}#{ARTIFACT};{VERSION}: not found")
    assert "tried https://repo1.maven.org/maven2/io/delta/" in lines[0]
    assert "java.net.ConnectException: Connection refused" in lines[0]
    assert not (tmp_path / "jars").exists()
