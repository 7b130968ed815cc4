"""Secret Spark confs stay off the JVM's command line: a real local session, started the way the
daemon starts it (``local_session``), in a child Python process so that it is the JVM's only
session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SECRET = "lm-S3CR3T=key:with#odd!chars\\and spaces"
ACCESS = "AKIALAKEMIRRORTEST01"
TOKEN = "lm-session-token-9f8e7d"
#: A conf whose name says nothing secret but whose value carries a password.
METASTORE = "jdbc:postgresql://admin:lm-Metastore-PW@db:5432/metastore"

CHILD = r"""
import json, os, sys
from lakemirror.daemon.settings import RuntimeSettings
from lakemirror.daemon.spark import local_session

confs = json.loads(sys.stdin.readline())  # not argv: the test reads every argv
spark = local_session(RuntimeSettings(master="local[1]", shuffle_partitions=1, driver_memory="512m",
                                      warehouse=sys.argv[1], spark_conf=confs))
jvm_pid = spark.sparkContext._gateway.proc.pid

def descendants(root):
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(pid))
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(children.get(pid, []))
    return seen

cmdlines = {}  # every process this one started (the JVM, and whatever the launch left running)
for pid in descendants(os.getpid())[1:]:
    try:
        cmdlines[pid] = open(f"/proc/{pid}/cmdline", "rb").read().decode("utf-8", "replace")
    except OSError:
        pass
hadoop = spark.sparkContext._jsc.hadoopConfiguration()
session_hadoop = spark._jsparkSession.sessionState().newHadoopConf()
keys = ["fs.s3a.secret.key", "fs.s3a.access.key", "fs.s3a.session.token", "fs.s3a.endpoint",
        "javax.jdo.option.ConnectionURL"]
print(json.dumps({
    "jvm_pid": jvm_pid,
    "jvm_exe": os.readlink(f"/proc/{jvm_pid}/exe"),
    "cmdlines": cmdlines,
    "hadoop": {k: hadoop.get(k) for k in keys},
    "session_hadoop": {k: session_hadoop.get(k) for k in keys},
    "submit_args": os.environ.get("PYSPARK_SUBMIT_ARGS"),
}))
spark.stop()
"""


def test_secret_confs_reach_hadoop_but_not_the_jvm_command_line(tmp_path: Path) -> None:
    confs = {
        "spark.hadoop.fs.s3a.secret.key": SECRET,
        "spark.hadoop.fs.s3a.access.key": ACCESS,
        "spark.hadoop.fs.s3a.session.token": TOKEN,
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9",  # not a secret: stays a --conf
        "spark.hadoop.javax.jdo.option.ConnectionURL": METASTORE,  # a secret by its value
    }
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "lakehouse")],
                          input=json.dumps(confs) + "\n", capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])

    jvm = seen["cmdlines"][str(seen["jvm_pid"])]
    assert os.path.basename(seen["jvm_exe"]) == "java"
    assert "org.apache.spark.deploy.SparkSubmit" in jvm
    assert "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9" in jvm  # the public conf is there
    for pid, cmdline in seen["cmdlines"].items():
        for value in (SECRET, ACCESS, TOKEN, "lm-Metastore-PW"):
            assert value not in cmdline, f"a secret is on the command line of process {pid}"
        assert "fs.s3a.secret.key" not in cmdline and "fs.s3a.session.token" not in cmdline

    expected = {"fs.s3a.secret.key": SECRET, "fs.s3a.access.key": ACCESS, "fs.s3a.session.token": TOKEN,
                "fs.s3a.endpoint": "http://127.0.0.1:9", "javax.jdo.option.ConnectionURL": METASTORE}
    assert seen["hadoop"] == expected  # the SparkContext's Hadoop configuration
    assert seen["session_hadoop"] == expected  # what a read or write of an s3a path is given
    assert seen["submit_args"] is None  # the environment is restored once the session runs
