"""Secret Spark confs reach the local JVM through a file only its owner can read, never its
command line.

PySpark starts the JVM with every builder conf as ``--conf key=value`` arguments, and a process's
arguments are readable by every local user (``/proc/<pid>/cmdline``, ``ps``). A conf whose key
names a secret (:func:`lakemirror.secrets.is_secret_key`, also on camelCase words:
``fs.s3a.secret.key``, ``…password``, ``…ConnectionPassword``, ``…token``…), or whose value
carries a credential whatever its key (``jdbc:postgresql://admin:pw@db/app``,
``user=bob password=…``: what :func:`lakemirror.secrets.redact` masks), is written instead to
a Java properties file of mode 0600 in a private temporary directory, which spark-submit reads with
``--properties-file`` (``--load-spark-defaults`` keeps ``spark-defaults.conf`` loaded as before).
The JVM holds the values as a ``--conf`` would (``spark.hadoop.*`` ones land in the SparkContext's
Hadoop configuration), except that Spark trims spaces at either end of a value read from a file.
The file is deleted once the session has started.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator, Mapping

from lakemirror.secrets import is_secret_key, redact

SUBMIT_ARGS = "PYSPARK_SUBMIT_ARGS"


class SecretConfError(ValueError):
    pass


def is_secret_conf(key: str) -> bool:
    """The masking's rule, also on the camelCase words of Hadoop and JDBC keys
    (``javax.jdo.option.ConnectionPassword``, ``…SecretAccessKey``)."""
    return is_secret_key(key) or is_secret_key(re.sub(r"(?<=[a-z0-9])(?=[A-Z])", ".", key))


def carries_credentials(value: str) -> bool:
    """Whether a value holds a credential whatever its key: a URL with a password
    (``jdbc:postgresql://admin:pw@db/app``), ``password=…`` / ``token: …`` pairs, a bearer token
    (what :func:`lakemirror.secrets.redact` masks)."""
    return redact(value) != value


def split_secret_confs(confs: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(public, secret)``: the confs that may go on the command line, and those that may not (a
    key that names a secret, or a value that carries a credential)."""
    secret = {k: v for k, v in confs.items() if is_secret_conf(k) or carries_credentials(v)}
    public = {k: v for k, v in confs.items() if k not in secret}
    return public, secret


def _escape(text: str, key: bool) -> str:
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\f":
            out.append("\\f")
        elif ch in "=:#!" or (ch == " " and (key or i == 0)):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def java_properties(confs: Mapping[str, str]) -> str:
    """``confs`` in the format of ``java.util.Properties.load`` (read by Spark as UTF-8)."""
    return "".join(f"{_escape(k, key=True)}={_escape(v, key=False)}\n" for k, v in confs.items())


@contextmanager
def secret_properties_file(secret: Mapping[str, str]) -> Iterator[str | None]:
    """While open, a JVM that PySpark launches reads ``secret`` from a 0600 properties file (its
    path is yielded; None when there is nothing secret). The file and the environment change are
    undone on exit; call ``getOrCreate()`` inside."""
    if not secret:
        yield None
        return
    previous = os.environ.get(SUBMIT_ARGS)
    if previous is not None and "--properties-file" in shlex.split(previous):
        raise SecretConfError(
            f"{SUBMIT_ARGS} already names a --properties-file, and secret confs in runtime.spark_conf "
            f"({', '.join(sorted(secret))}) need one of their own: move them into that file or drop "
            f"--properties-file from {SUBMIT_ARGS}")
    folder = tempfile.mkdtemp(prefix="lakemirror-conf-")  # mode 0700
    path = os.path.join(folder, "secret.properties")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(java_properties(secret))
        os.environ[SUBMIT_ARGS] = " ".join(
            ["--properties-file", shlex.quote(path), "--load-spark-defaults", previous or "pyspark-shell"])
        yield path
    finally:
        if previous is None:
            os.environ.pop(SUBMIT_ARGS, None)
        else:
            os.environ[SUBMIT_ARGS] = previous
        shutil.rmtree(folder, ignore_errors=True)
