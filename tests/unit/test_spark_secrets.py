"""Which Spark confs stay off the JVM's command line, and the owner-only file that carries them.
The JVM side (the values reach Hadoop's configuration, none is in /proc/<pid>/cmdline) is
tests/integration/test_secret_confs.py."""

from __future__ import annotations

import os
import shlex
import stat

import pytest

from lakemirror.daemon.spark_secrets import (SUBMIT_ARGS, SecretConfError, java_properties,
                                             secret_properties_file, split_secret_confs)


def test_confs_whose_key_names_a_secret_are_split_off() -> None:
    confs = {
        "spark.hadoop.fs.s3a.secret.key": "s", "spark.hadoop.fs.s3a.access.key": "a",
        "spark.hadoop.fs.s3a.session.token": "t", "spark.sql.catalog.uc.token": "u",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "k",
        "spark.hadoop.javax.jdo.option.ConnectionPassword": "p",
        "spark.hadoop.fs.s3a.endpoint": "http://minio:9000", "spark.sql.shuffle.partitions": "4",
        "spark.hadoop.fs.s3.awsSecretAccessKey": "c", "spark.hadoop.fs.s3a.connection.maximum": "96",
    }
    public, secret = split_secret_confs(confs)
    assert set(public) == {"spark.hadoop.fs.s3a.endpoint", "spark.sql.shuffle.partitions",
                           "spark.hadoop.fs.s3a.connection.maximum"}
    assert set(secret) == set(confs) - set(public)


@pytest.mark.parametrize("value", [
    "jdbc:postgresql://admin:PW-1@db:5432/app", "user=bob password=PW-1", "host=db;pwd=PW-1",
    "Authorization: Bearer PW-1", "s3a://AKIA:PW-1@bucket/path"])
def test_a_value_carrying_a_credential_is_secret_whatever_its_key(value: str) -> None:
    public, secret = split_secret_confs({"spark.hadoop.javax.jdo.option.ConnectionURL": value,
                                         "spark.sql.warehouse.dir": "s3a://bucket/wh",
                                         "spark.app.name": "user=bob"})
    assert secret == {"spark.hadoop.javax.jdo.option.ConnectionURL": value}
    assert set(public) == {"spark.sql.warehouse.dir", "spark.app.name"}


def test_properties_are_escaped_for_java() -> None:
    text = java_properties({"a.key": " lead=x:y#z!\\w\nnext", "sp ace": "v"})
    assert text == "a.key=\\ lead\\=x\\:y\\#z\\!\\\\w\\nnext\n" "sp\\ ace=v\n"


def test_the_file_is_owner_only_and_named_in_the_submit_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SUBMIT_ARGS, "--driver-class-path /x.jar pyspark-shell")
    with secret_properties_file({"spark.hadoop.fs.s3a.secret.key": "s3cr3t"}) as path:
        assert path is not None
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert open(path, encoding="utf-8").read() == "spark.hadoop.fs.s3a.secret.key=s3cr3t\n"
        args = shlex.split(os.environ[SUBMIT_ARGS])
        assert args[:3] == ["--properties-file", path, "--load-spark-defaults"]
        assert args[3:] == ["--driver-class-path", "/x.jar", "pyspark-shell"]
        assert "s3cr3t" not in os.environ[SUBMIT_ARGS]
    assert not os.path.exists(os.path.dirname(path))
    assert os.environ[SUBMIT_ARGS] == "--driver-class-path /x.jar pyspark-shell"


def test_without_secrets_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SUBMIT_ARGS, raising=False)
    with secret_properties_file({}) as path:
        assert path is None and SUBMIT_ARGS not in os.environ
    with secret_properties_file({"x.password": "p"}):
        assert os.environ[SUBMIT_ARGS].endswith(" pyspark-shell")
    assert SUBMIT_ARGS not in os.environ


def test_a_properties_file_of_the_callers_own_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SUBMIT_ARGS, "--properties-file /etc/spark.conf pyspark-shell")
    with pytest.raises(SecretConfError, match="spark.hadoop.fs.s3a.secret.key.*move them into that file"):
        with secret_properties_file({"spark.hadoop.fs.s3a.secret.key": "s"}):
            pass
