"""Our own parsing of the configuration values that Spark, the JVM or Delta would otherwise parse
later, at run time, far from the file: sizes, durations, booleans, master URLs, Spark confs and
Delta table properties. Pure; each function returns the normalised value or raises ``ValueError``
with the accepted forms, so ``lakemirror validate`` refuses what Spark or Delta would refuse.
"""

from __future__ import annotations

import difflib
import re
from typing import Callable

from lakemirror.daemon import spark_conf_rules

JAVA_LONG_MAX = 2**63 - 1
JAVA_INT_MAX = 2**31 - 1

#: Units of Spark's ``JavaUtils.byteStringAsBytes`` (what Delta's ``maxBytesPerTrigger`` uses).
_BYTE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30,
               "t": 2**40, "tb": 2**40, "p": 2**50, "pb": 2**50}
_BYTES = re.compile(r"^([0-9]+)([a-z]*)$")


def byte_size(value: object, what: str) -> tuple[str, int]:
    """``512m`` / ``1g`` / ``1048576`` (bytes) -> (the string Spark gets, bytes); positive, fits a Java long."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{what} must be a size such as 512m, 1g or a number of bytes")
    text = str(value).strip().lower()
    match = _BYTES.match(text)
    if not match or match.group(2) not in _BYTE_UNITS:
        raise ValueError(f"{what} {value!r} is not a size: write a whole number with an optional unit "
                         f"b, k, m, g, t or p (e.g. 512m, 1g, 1048576)")
    size = int(match.group(1)) * _BYTE_UNITS[match.group(2)]
    if size <= 0:
        raise ValueError(f"{what} must be larger than 0")
    if size > JAVA_LONG_MAX:
        raise ValueError(f"{what} {value!r} is too large (at most 8 EiB)")
    return text, size


_HEAP = re.compile(r"^([0-9]+)([kmgt])$")
#: Spark refuses a driver heap under 1.5 x its 300 MiB reserve (``UnifiedMemoryManager``); the JVM's
#: usable heap is a little under -Xmx, so the smallest heap that starts is above 450m.
MIN_DRIVER_HEAP_MIB = 512


def jvm_heap(value: object, what: str) -> str:
    """A heap size the JVM's ``-Xmx`` and Spark both read: digits and one of k, m, g, t (``2g``)."""
    text = str(value).strip().lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    match = _HEAP.match(text)
    if not match:
        raise ValueError(f"{what} {value!r} is not a heap size: write a whole number with the unit k, m, g "
                         f"or t, e.g. 2g or 512m (the JVM reads a bare number as bytes)")
    mib = int(match.group(1)) * {"k": 2**-10, "m": 1, "g": 2**10, "t": 2**20}[match.group(2)]
    if mib < MIN_DRIVER_HEAP_MIB:
        raise ValueError(f"{what} {value!r} is too small: Spark needs a heap of at least {MIN_DRIVER_HEAP_MIB}m")
    return text


_MASTER = re.compile(r"^(local(\[(?P<n>[0-9]+|\*)(\s*,\s*[0-9]+)?\])?|local-cluster\[[0-9]+\s*,\s*[0-9]+\s*,\s*[0-9]+\]"
                     r"|spark://\S+|yarn|k8s://\S+)$")


def master_url(value: str) -> str:
    """A master URL Spark's ``SparkContext`` accepts: local, local[N], local[*], local[N,F], spark://…,
    yarn, k8s://…; local[0] is refused (no threads)."""
    match = _MASTER.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a Spark master URL: use local[N] (N threads), local[*], "
                         f"spark://host:port, yarn or k8s://…")
    if match.group("n") is not None and match.group("n") != "*" and int(match.group("n")) < 1:
        raise ValueError(f"{value!r} runs no threads: use local[1] or more")
    return value.strip()


def boolean(value: str, what: str) -> str:
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"{what} {value!r} must be true or false")
    return text


def integer(value: str, what: str, low: int, high: int = JAVA_INT_MAX) -> str:
    text = value.strip()
    if not re.fullmatch(r"-?[0-9]+", text) or not low <= int(text) <= high:
        raise ValueError(f"{what} {value!r} must be a whole number from {low} to {high}")
    return text


_TIME_UNITS = ("us", "ms", "s", "m", "min", "h", "d")


def spark_duration(value: str, what: str) -> str:
    """Spark's ``JavaUtils.timeStringAs`` form: a whole number and a unit, e.g. ``120s``, ``5min``."""
    text = value.strip().lower()
    match = re.fullmatch(r"([0-9]+)([a-z]+)", text)
    if not match or match.group(2) not in _TIME_UNITS:
        raise ValueError(f"{what} {value!r} is not a duration: a whole number and one of "
                         f"{', '.join(_TIME_UNITS)}, e.g. 120s")
    return text


_INTERVAL_UNITS = ("microsecond", "millisecond", "second", "minute", "hour", "day", "week")


def delta_interval(value: str, what: str) -> str:
    """A Delta retention interval, e.g. ``interval 7 days`` or ``30 days``: whole numbers of weeks,
    days, hours, minutes, seconds, milliseconds or microseconds (Delta refuses months and years)."""
    words = value.strip().lower().split()
    if words[:1] == ["interval"]:
        words = words[1:]
    pairs = list(zip(words[::2], words[1::2]))
    if not words or len(words) % 2 or any(not n.isdigit() or u.removesuffix("s") not in _INTERVAL_UNITS
                                          for n, u in pairs):
        raise ValueError(f"{what} {value!r} is not an interval: write e.g. 'interval 7 days' "
                         f"(units: {', '.join(u + 's' for u in _INTERVAL_UNITS)}; no months or years)")
    return value.strip()


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def check(value: str, what: str) -> str:
        if value.strip().lower() not in {a.lower() for a in allowed}:
            raise ValueError(f"{what} {value!r} must be one of {', '.join(allowed)}")
        return value.strip()
    return check


def _off_with_hadoop_3_5(value: str, what: str) -> str:
    """Delta's fast S3A listing calls S3A internals that Hadoop 3.5 (Spark 4.2's) no longer has."""
    text = boolean(value, what)
    if text == "true":
        raise ValueError(f"{what}: Delta's fast S3A listing calls an S3A method that hadoop-aws 3.5 (Spark 4.2's "
                         "Hadoop) no longer has, so every read of a table on s3a:// would fail with NoSuchMethodError; "
                         "remove the setting (docs/deployment.md, \"Object storage\")")
    return text


def _int(low: int) -> Callable[[str, str], str]:
    return lambda value, what: integer(value, what, low)


def _bytes(value: str, what: str) -> str:
    return byte_size(value, what)[0]


def _bytes_or_off(value: str, what: str) -> str:
    """A size, or -1 (off), as ``spark.sql.autoBroadcastJoinThreshold`` takes."""
    return "-1" if value.strip() == "-1" else byte_size(value, what)[0]


_MIB = re.compile(r"^([0-9]+)([kmgt]?)$")


def _mib_size(value: str, what: str) -> str:
    """A memory overhead: a whole number of MiB, or one with the unit k, m, g or t (``384m``)."""
    text = value.strip().lower()
    if not _MIB.match(text) or int(_MIB.match(text).group(1)) <= 0:  # type: ignore[union-attr]
        raise ValueError(f"{what} {value!r} is not a size: a whole number of MiB, or with the unit k, m, g or t "
                         f"(e.g. 384m)")
    return text


#: Spark confs the daemon sets itself (``daemon/spark.py``) or whose format is fixed; a value in
#: ``runtime.spark_conf`` for one of these is checked like the field it overrides.
SPARK_CONFS: dict[str, Callable[[str, str], str]] = {
    "spark.sql.shuffle.partitions": _int(1),
    "spark.default.parallelism": _int(1),
    "spark.driver.memory": jvm_heap,
    "spark.executor.memory": jvm_heap,
    "spark.driver.maxResultSize": _bytes,
    "spark.sql.streaming.stopTimeout": spark_duration,
    "spark.network.timeout": spark_duration,
    "spark.scheduler.mode": _choice("FAIR", "FIFO"),
    "spark.ui.enabled": boolean,
    "spark.ui.showConsoleProgress": boolean,
    "spark.log.structuredLogging.enabled": boolean,
    "spark.databricks.delta.snapshotPartitions": _int(1),
    "spark.master": lambda value, what: master_url(value),
    "spark.hadoop.delta.enableFastS3AListFrom": _off_with_hadoop_3_5,
    "spark.driver.cores": _int(1),
    "spark.executor.cores": _int(1),
    "spark.executor.instances": _int(0),
    "spark.driver.memoryOverhead": _mib_size,
    "spark.executor.memoryOverhead": _mib_size,
    "spark.buffer.size": _int(1),
    "spark.sql.files.maxPartitionBytes": _bytes,
    "spark.sql.adaptive.advisoryPartitionSizeInBytes": _bytes,
    "spark.sql.autoBroadcastJoinThreshold": _bytes_or_off,
    "spark.sql.caseSensitive": boolean,
    "spark.speculation": boolean,
    "spark.sql.streaming.minBatchesToRetain": _int(1),
}
#: The longest conf name and value accepted.
MAX_CONF_KEY_CHARS, MAX_CONF_VALUE_CHARS = 1024, 16384

#: Delta table properties (Delta 4.4's ``DeltaConfigs``) whose values Delta parses, with their form.
DELTA_PROPERTIES: dict[str, Callable[[str, str], str]] = {
    **{f"delta.{k}": boolean for k in (
        "appendOnly", "enableChangeDataFeed", "enableDeletionVectors", "enableRowTracking",
        "enableTypeWidening", "enableInCommitTimestamps", "enableExpiredLogCleanup", "randomizeFilePrefixes",
        "checkpoint.writeStatsAsJson", "checkpoint.writeStatsAsStruct", "autoOptimize.autoCompact",
        "autoOptimize.optimizeWrite", "enableIcebergCompatV1", "enableIcebergCompatV2", "enableIcebergCompatV3",
        "enableVariantShredding", "enableFullRetentionRollback", "tuneFileSizesForRewrites")},
    **{f"delta.{k}": delta_interval for k in (
        "logRetentionDuration", "deletedFileRetentionDuration", "setTransactionRetentionDuration",
        "checkpointRetentionDuration", "sampleRetentionDuration")},
    "delta.checkpointInterval": _int(1),
    "delta.dataSkippingNumIndexedCols": _int(-1),
    "delta.dataSkippingStringPrefixLength": _int(0),
    "delta.randomPrefixLength": _int(1),
    "delta.minReaderVersion": _int(1),
    "delta.minWriterVersion": _int(1),
    "delta.targetFileSize": _bytes,
    "delta.columnMapping.mode": _choice("none", "name", "id"),
    "delta.checkpointPolicy": _choice("classic", "v2"),
    "delta.isolationLevel": _choice("Serializable", "WriteSerializable"),
}
_DELTA_BY_LOWER = {k.lower(): k for k in DELTA_PROPERTIES}


def _known_confs() -> dict[str, str]:
    names = [*SPARK_CONFS, *spark_conf_rules.REQUIRED, *spark_conf_rules.MERGED, *spark_conf_rules.CLASS_LISTS,
             "spark.sql.adaptive.enabled", "spark.sql.adaptive.coalescePartitions.enabled",
             "spark.sql.adaptive.skewJoin.enabled", "spark.sql.ansi.enabled", "spark.dynamicAllocation.enabled",
             "spark.eventLog.enabled", "spark.sql.shuffle.partitions", "spark.jars.packages",
             "spark.sql.warehouse.dir", "spark.driver.extraClassPath", "spark.executor.extraJavaOptions"]
    return {k.lower(): k for k in names}


def spark_conf_value(key: str, value: str) -> str:
    """Check one conf of ``runtime.spark_conf``: the format of a value Spark parses (those of
    :data:`SPARK_CONFS`, and every ``*.enabled`` conf, a boolean in Spark, Hadoop and Delta), the
    confs lakemirror's session depends on (:func:`lakemirror.daemon.spark_conf_rules.check`), and a
    name that differs from a known one only in case (Spark's names are case-sensitive: it would
    ignore the conf)."""
    if not key.strip() or len(key) > MAX_CONF_KEY_CHARS:
        raise ValueError(f"a Spark conf name must have 1 to {MAX_CONF_KEY_CHARS} characters")
    if len(value) > MAX_CONF_VALUE_CHARS:
        raise ValueError(f"{key[:100]}: the value is {len(value)} characters long; at most {MAX_CONF_VALUE_CHARS}")
    check = SPARK_CONFS.get(key)
    if check is not None:
        return check(value, key)
    known = _KNOWN_BY_LOWER.get(key.lower())
    if known is not None and known != key:
        raise ValueError(f"{key!r}: Spark conf names are case-sensitive and Spark would ignore this one; write "
                         f"{known!r}")
    if key.endswith(".enabled"):
        return boolean(value, key)
    return spark_conf_rules.check(key, value)


_KNOWN_BY_LOWER = _known_confs()


def delta_property(key: str, value: str) -> str:
    """Check one ``delta.*`` table property. Keys are case-insensitive, as in Delta; a key a letter or
    two from a known one is refused with the known one (Delta would refuse it at bootstrap)."""
    if key.lower().startswith("delta.feature."):
        return _choice("supported", "enabled")(value, key)
    known = _DELTA_BY_LOWER.get(key.lower())
    if known is not None:
        return DELTA_PROPERTIES[known](value, key)
    close = difflib.get_close_matches(key.lower(), list(_DELTA_BY_LOWER), n=1, cutoff=0.85)
    if close:
        raise ValueError(f"{key!r} is not a Delta table property; did you mean {_DELTA_BY_LOWER[close[0]]!r}?")
    return value
