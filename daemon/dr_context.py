"""The disaster-recovery parts of ``lakemirror replicate``, built for the composition root
(:mod:`lakemirror.daemon.context`) from its parts: kept apart so that the root only names them."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, ContextManager

from lakemirror.daemon.settings.runtime_spec import REPLICATE_NAMESPACE
from lakemirror.object_store import S3A_CONF_PREFIX, session_s3a_conf
from lakemirror.sinks.batch.operations import Operations
from lakemirror.sinks.batch.routing import ByOperation
from lakemirror.sinks.batch.volumes import VolumeOperations
from lakemirror.supervisor.replicate import VOLUME_FILES


def s3a_settings(context: Any) -> dict[str, str]:
    """The ``fs.s3a.*`` settings the run's Spark confs give (``runtime.spark_conf``'s
    ``spark.hadoop.fs.s3a.*``), overlaid with the session's own where it has a JVM."""
    prefix = "spark.hadoop."
    found = {k[len(prefix):]: v for k, v in context.runtime.spark_conf.items()
             if k.startswith(prefix + S3A_CONF_PREFIX)}
    return {**found, **session_s3a_conf(context.spark)}


def logged_run(settings: Any, run_id: str) -> ContextManager[Any]:
    """The run's execution log files when ``settings`` (``execution_log``) is set; nothing otherwise."""
    if settings is None:
        return nullcontext()
    from lakemirror.daemon.execution_log import execution_log

    return execution_log(run_id, settings.folder, list(settings.formats), settings.level)


def disaster_recovery_operations(context: Any, base: Operations, checkpoint_volume: str) -> Operations:
    """``base`` plus the operations of disaster recovery (volume files), their state kept under
    ``<checkpoint_volume>/replicate``."""
    root = str(Path(checkpoint_volume) / REPLICATE_NAMESPACE)
    volumes = VolumeOperations(root, lambda: s3a_settings(context), clock=context.clock, sleep=context.sleep)
    return ByOperation(base, {VOLUME_FILES: volumes})
