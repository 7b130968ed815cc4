"""Tables on object storage (S3 and S3-compatible servers): one set of settings, two engines.

Spark reaches S3 through Hadoop's ``s3a://`` file system (hadoop-aws, loaded into the session
only when a location needs it: :func:`needs_s3a`); delta-rs reaches the same objects as
``s3://`` with its own storage options. :func:`delta_rs_storage_options` derives those options
from the ``fs.s3a.*`` Hadoop settings the Spark session already has, so that an operator sets
the endpoint and credentials once (``runtime.spark_conf``: ``spark.hadoop.fs.s3a.…``). The
options hold credentials: callers pass them to delta-rs and never log them (their keys are
masked by :func:`lakemirror.secrets.mask_secrets`).

S3 has no atomic put-if-absent in Hadoop's default log store: Delta's S3 single-driver log store
and delta-rs with ``AWS_S3_ALLOW_UNSAFE_RENAME`` are safe only with one writer per table
(docs/deployment.md, "Object storage").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping
from urllib.parse import urlparse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The URI schemes Spark reads through hadoop-aws.
S3A_SCHEMES = ("s3a",)
#: Hadoop settings a session built by lakemirror carries when it talks to S3.
S3A_CONF_PREFIX = "fs.s3a."


def scheme(location: str) -> str:
    return urlparse(location).scheme.lower()


def is_s3a(location: str) -> bool:
    return scheme(location) in S3A_SCHEMES


def needs_s3a(locations: Iterable[str], spark_conf: Mapping[str, str]) -> bool:
    """Whether a Spark session needs hadoop-aws: a location is ``s3a://`` or a conf sets
    ``spark.hadoop.fs.s3a.*`` (the tables are then named elsewhere, e.g. by a later API call)."""
    return any(is_s3a(loc) for loc in locations) or any(
        k.startswith("spark.hadoop." + S3A_CONF_PREFIX) for k in spark_conf)


def delta_rs_uri(location: str) -> str:
    """``location`` as delta-rs names it: ``s3a://b/p`` becomes ``s3://b/p``; others unchanged."""
    return "s3" + location[len("s3a"):] if is_s3a(location) else location


def delta_rs_storage_options(hadoop: Mapping[str, str]) -> dict[str, str]:
    """delta-rs storage options equivalent to the ``fs.s3a.*`` entries of ``hadoop`` (keys
    without the ``spark.hadoop.`` prefix). Pure.

    Endpoint (with ``http://`` when ``fs.s3a.connection.ssl.enabled`` is false and none is
    given), region, path-style addressing and static credentials carry over. Renames are
    allowed unsafely (``AWS_S3_ALLOW_UNSAFE_RENAME``): delta-rs has no other way to commit on
    plain S3, and it is safe only with a single writer per table, as is Delta's own S3 log store.
    """
    opts: dict[str, str] = {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
    ssl = hadoop.get("fs.s3a.connection.ssl.enabled", "true").strip().lower() != "false"
    endpoint = hadoop.get("fs.s3a.endpoint", "").strip()
    if endpoint:
        if "://" not in endpoint:
            endpoint = f"{'https' if ssl else 'http'}://{endpoint}"
        opts["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    region = hadoop.get("fs.s3a.endpoint.region") or hadoop.get("fs.s3a.region")
    if region:
        opts["AWS_REGION"] = region
    if hadoop.get("fs.s3a.path.style.access", "false").strip().lower() == "true":
        opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    for hadoop_key, option in (("fs.s3a.access.key", "AWS_ACCESS_KEY_ID"),
                               ("fs.s3a.secret.key", "AWS_SECRET_ACCESS_KEY"),
                               ("fs.s3a.session.token", "AWS_SESSION_TOKEN")):
        if hadoop.get(hadoop_key):
            opts[option] = hadoop[hadoop_key]
    return opts


def boto3_client_options(hadoop: Mapping[str, str]) -> dict[str, str]:
    """The keyword arguments of a boto3 S3 client equivalent to the ``fs.s3a.*`` entries of
    ``hadoop`` (keys without the ``spark.hadoop.`` prefix), plus ``addressing_style``
    (``path`` for ``fs.s3a.path.style.access``) for the client's config. Pure.

    Without static keys, boto3's default chain applies (environment, profile, instance role), as
    hadoop-aws's does."""
    opts: dict[str, str] = {}
    ssl = hadoop.get("fs.s3a.connection.ssl.enabled", "true").strip().lower() != "false"
    endpoint = hadoop.get("fs.s3a.endpoint", "").strip()
    if endpoint:
        opts["endpoint_url"] = endpoint if "://" in endpoint else f"{'https' if ssl else 'http'}://{endpoint}"
    region = hadoop.get("fs.s3a.endpoint.region") or hadoop.get("fs.s3a.region")
    if region:
        opts["region_name"] = region
    for hadoop_key, option in (("fs.s3a.access.key", "aws_access_key_id"),
                               ("fs.s3a.secret.key", "aws_secret_access_key"),
                               ("fs.s3a.session.token", "aws_session_token")):
        if hadoop.get(hadoop_key):
            opts[option] = hadoop[hadoop_key]
    if hadoop.get("fs.s3a.path.style.access", "false").strip().lower() == "true":
        opts["addressing_style"] = "path"
    return opts


def session_s3a_conf(spark: "SparkSession") -> dict[str, str]:
    """The ``fs.s3a.*`` Hadoop settings of ``spark`` (its SparkContext's, plus the session's
    ``spark.hadoop.*`` SQL confs); empty without a JVM (Spark Connect)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return {}
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    found: dict[str, str] = {}
    for key in ("fs.s3a.endpoint", "fs.s3a.endpoint.region", "fs.s3a.region", "fs.s3a.path.style.access",
                "fs.s3a.connection.ssl.enabled", "fs.s3a.access.key", "fs.s3a.secret.key",
                "fs.s3a.session.token"):
        value = conf.get(key)
        if value is not None:
            found[key] = str(value)
    return found


def list_folders(spark: "SparkSession", location: str) -> list[str]:
    """Names of the folders directly under ``location``, through Hadoop's FileSystem (an object
    store's common prefixes); empty when there is none."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(location)
    fs = path.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    if not fs.exists(path):
        return []
    return sorted(str(s.getPath().getName()) for s in fs.listStatus(path) if s.isDirectory())


def delta_rs_target(spark: "SparkSession", path: str) -> "tuple[str, dict[str, str]] | None":
    """How delta-rs reaches the path-based table at ``path``: the URI and storage options (with
    credentials: never log them), from the session's s3a settings for an ``s3a://`` table; None
    for a table on another remote file system."""
    from lakemirror.tables import is_local_path

    if is_local_path(path):
        return path, {}
    if is_s3a(path):
        return delta_rs_uri(path), delta_rs_storage_options(session_s3a_conf(spark))
    return None
