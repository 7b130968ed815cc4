"""The driver JVM's class archive: named by what it was recorded against, mapped only where it
exists, never in the way of a JVM it does not match, and led by the user's own Java options."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lakemirror.daemon import class_archive
from lakemirror.daemon.class_archive import archive_key, archive_path, java_options
from lakemirror.daemon.settings.pipeline import warn_unknown_environment
from lakemirror.daemon.spark import with_class_archive


def test_the_archive_is_named_by_the_jvm_the_spark_build_and_deltas_jars(tmp_path: Path) -> None:
    jar = tmp_path / "delta-spark.jar"
    jar.write_bytes(b"x" * 10)
    key = archive_key('openjdk version "17.0.9"', "/usr/bin/java", "4.2.0", [str(jar)])
    assert key == archive_key('openjdk version "17.0.9"', "/usr/bin/java", "4.2.0", [str(jar)])
    assert len({key,
                archive_key('openjdk version "17.0.10"', "/usr/bin/java", "4.2.0", [str(jar)]),
                archive_key('openjdk version "17.0.9"', "/opt/jdk/bin/java", "4.2.0", [str(jar)]),
                archive_key('openjdk version "17.0.9"', "/usr/bin/java", "4.2.1", [str(jar)]),
                archive_key('openjdk version "17.0.9"', "/usr/bin/java", "4.2.0", [])}) == 5
    jar.write_bytes(b"x" * 11)  # a jar replaced in place
    assert archive_key('openjdk version "17.0.9"', "/usr/bin/java", "4.2.0", [str(jar)]) != key


def test_a_session_maps_the_archive_only_where_it_was_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEMIRROR_CLASS_ARCHIVE_DIR", str(tmp_path))
    confs = {"spark.jars": "/j/delta.jar", "spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=x -Xshare:off"}
    assert with_class_archive(confs, "java 17", ["/j/delta.jar"]) == confs  # nothing recorded: as before
    archive = archive_path("java 17", ["/j/delta.jar"])
    assert archive.parent == tmp_path and java_options(archive) == ""
    archive.write_bytes(b"recorded")
    options = with_class_archive(confs, "java 17", ["/j/delta.jar"])["spark.driver.extraJavaOptions"]
    assert options.startswith(f"-XX:SharedArchiveFile={archive} -Xshare:auto ")
    assert options.endswith("-Dlog4j2.configurationFile=x -Xshare:off"), "the user's options come last and win"
    assert with_class_archive(confs, "java 18", ["/j/delta.jar"]) == confs, "another JVM's archive is not this one's"


@pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM")
def test_a_jvm_the_archive_does_not_match_starts_as_without_it_and_says_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "session-0.jsa"
    archive.write_bytes(b"not an archive of this JVM" * 100)
    done = subprocess.run(["java", *java_options(archive).split(), "-version"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "cds" not in (done.stdout + done.stderr).lower() and "shared" not in done.stdout.lower()


def test_the_archive_folder_variable_is_no_setting() -> None:
    assert warn_unknown_environment({"LAKEMIRROR_CLASS_ARCHIVE_DIR": "/x"}) == []


def test_a_failed_recording_names_the_cause_and_leaves_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEMIRROR_CLASS_ARCHIVE_DIR", str(tmp_path))
    monkeypatch.setattr("lakemirror.daemon.java_check.check_java", lambda: "java 17")
    monkeypatch.setattr("lakemirror.daemon.jars.jar_paths", lambda *a, **k: [])

    class Done:
        returncode, stdout, stderr = 1, "", "Traceback …\nRuntimeError: the JVM could not start"

    monkeypatch.setattr(class_archive.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(RuntimeError, match="the JVM could not start"):
        class_archive.build()
    assert list(tmp_path.iterdir()) == []


def test_the_connect_servers_jvm_is_given_the_same_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/connect-server.sh asks for the options of the archive recorded for this machine."""
    monkeypatch.setenv("LAKEMIRROR_CLASS_ARCHIVE_DIR", str(tmp_path))
    monkeypatch.setattr("lakemirror.daemon.java_check.check_java", lambda: "java 17")
    monkeypatch.setattr("lakemirror.daemon.jars.jar_paths", lambda *a, **k: ["/j/delta.jar"])
    assert class_archive.recorded_java_options() == ""
    archive_path("java 17", ["/j/delta.jar"]).write_bytes(b"recorded")
    assert class_archive.recorded_java_options() == java_options(archive_path("java 17", ["/j/delta.jar"])) != ""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "connect-server.sh").read_text()
    assert "recorded_java_options()" in script and "spark.driver.extraJavaOptions=${sharing:+$sharing }" in script
