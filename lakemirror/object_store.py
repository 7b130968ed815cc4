"""Tables on object storage (S3 and S3-compatible servers): one set of settings, two engines.

Spark reaches S3 through Hadoop's ``s3a://`` file system (hadoop-aws, loaded into the session
only when a location needs it: :func:`needs_s3a`); delta-rs reaches the same objects as
``s3://`` with its own storage options. :func:`delta_rs_storage_options` derives those options
from the ``fs.s3a.*`` Hadoop settings the Spark session already has, so that an operator sets
the endpoint and credentials once (``runtime.spark_conf``: ``spark.hadoop.fs.s3a.…``). The
options hold credentials: callers pass them to delta-rs and never log them (their keys are
masked by :func:`lakemirror.secrets.mask_secrets`).

delta-rs commits on S3 by a conditional put: the commit file of version ``n`` is written with
``If-None-Match: *``, so the store refuses it when another writer created that version first, and
delta-rs checks the winner's changes for conflicts and retries at the next version or fails. AWS
S3 honours the header since 2024, as do MinIO, Cloudflare R2 and moto's server (tests). A store that
rejects it is declared with Hadoop's own switch for the same header,
``fs.s3a.create.conditional.enabled=false``: delta-rs cannot commit there at all, so nothing is
written by delta-rs on such a store (:func:`delta_rs_unreachable`). A store that silently ignores
the header makes a concurrent commit of the same version replace the other: there, as with Delta's
S3 single-driver log store, one writer per table is the only safe set-up (docs/deployment.md,
"Object storage").
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
#: Hadoop's switch (hadoop-aws 3.5, default true) for stores that honour ``If-None-Match`` on PUT.
CONDITIONAL_CREATE = "fs.s3a.create.conditional.enabled"
#: What delta-rs's S3 store is told about conditional puts: ``If-None-Match`` / ``If-Match`` headers.
CONDITIONAL_PUT_OPTION, CONDITIONAL_PUT_ETAG = "AWS_CONDITIONAL_PUT", "etag"


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


def conditional_writes(hadoop: Mapping[str, str]) -> bool:
    """Whether the store of ``hadoop``'s s3a settings honours ``If-None-Match`` on PUT (unless
    :data:`CONDITIONAL_CREATE` says it does not). Pure."""
    return hadoop.get(CONDITIONAL_CREATE, "true").strip().lower() != "false"


def delta_rs_storage_options(hadoop: Mapping[str, str]) -> dict[str, str]:
    """delta-rs storage options equivalent to the ``fs.s3a.*`` entries of ``hadoop`` (keys
    without the ``spark.hadoop.`` prefix). Pure.

    Endpoint (with ``http://`` when ``fs.s3a.connection.ssl.enabled`` is false and none is
    given), region, path-style addressing and static credentials carry over. Commits are
    conditional puts (``AWS_CONDITIONAL_PUT=etag``: each commit file is written with
    ``If-None-Match: *``), set explicitly so that no change of delta-rs's default can turn them off.
    """
    opts: dict[str, str] = {CONDITIONAL_PUT_OPTION: CONDITIONAL_PUT_ETAG}
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
                "fs.s3a.session.token", CONDITIONAL_CREATE):
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


def delta_rs_unreachable(location: str | None, hadoop: Mapping[str, str], *, own_jvm: bool = True) -> str | None:
    """Why delta-rs on the driver cannot write the Delta table at ``location`` (None: it can). Pure.

    It can write a path on the driver's file system, and an ``s3a://`` location through the
    session's s3a settings (``hadoop``) on a store with conditional writes. A table known only by
    name (``location`` None: managed by a catalog such as Unity Catalog, which hands credentials to
    its own engines), another store, or a session without a JVM of its own (Spark Connect, whose s3a
    settings are the server's) stays with Spark."""
    from lakemirror.tables import is_local_path

    if location is None:
        return "the table is managed by its catalog (known by name, as Unity Catalog's tables are), whose " \
               "credentials the driver's delta-rs is not given"
    if is_local_path(location):
        return None
    if not is_s3a(location):
        return f"the table is on {scheme(location)}:// storage, which the driver's delta-rs is not configured for"
    if not own_jvm:
        return "the session is remote (Spark Connect): the s3a settings are the server's"
    if not conditional_writes(hadoop):
        return f"the store has no conditional writes ({CONDITIONAL_CREATE}=false), without which a delta-rs " \
               "commit could replace another writer's"
    return None


def delta_rs_target(spark: "SparkSession", path: str) -> "tuple[str, dict[str, str]] | None":
    """How delta-rs reaches the path-based table at ``path``: the URI and storage options (with
    credentials: never log them), from the session's s3a settings for an ``s3a://`` table; None
    where it cannot (:func:`delta_rs_unreachable` says why)."""
    from lakemirror.tables import has_own_jvm, is_local_path

    if is_local_path(path):
        return path, {}
    hadoop = session_s3a_conf(spark) if is_s3a(path) else {}
    if delta_rs_unreachable(path, hadoop, own_jvm=has_own_jvm(spark)) is not None:
        return None
    return delta_rs_uri(path), delta_rs_storage_options(hadoop)


def delta_rs_reader(spark: "SparkSession", path: str | None) -> "tuple[str, dict[str, str]] | None":
    """How delta-rs reads the path-based table at ``path`` (it writes nothing there, so the store's
    conditional writes do not matter): a local path, or ``s3a://`` through the session's s3a
    settings; None elsewhere (a table known by name, another store, Spark Connect)."""
    from lakemirror.tables import has_own_jvm, is_local_path

    if path is None:
        return None
    if is_local_path(path):
        return path, {}
    if not is_s3a(path) or not has_own_jvm(spark):
        return None
    return delta_rs_uri(path), delta_rs_storage_options(session_s3a_conf(spark))
