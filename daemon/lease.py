"""The daemon's side of the pipeline lease: who this process is, whether another one on this host
still runs, and where the lease lives for a configuration (:mod:`lakemirror.checkpoints.lease`).

The lease always lives in the pipeline's folder of the checkpoint volume (local or mounted):
``<checkpoint_volume>/<pipeline_id>/lease/``. A second copy lives on S3, so that two daemons on two
machines, each with a checkpoint volume of its own, still cannot both write the same replicas: at
``<lease.object_store>/.lakemirror/leases/<pipeline_id>/`` when that setting names a bucket (any
runtime mode), and by default beside the tables when they live on S3 (a local-mode warehouse at
``s3a://``), at ``<warehouse>/.lakemirror/leases/<pipeline_id>/``.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.lease import Holder, LeaseUnreachable
from lakemirror.checkpoints.lease_store import FileLeaseStore, LeaseStore
from lakemirror.checkpoints.pipeline_lease import PipelineLease
from lakemirror.object_store import boto3_client_options, is_s3a

#: The folder of the lease under a pipeline's folder.
LEASE_DIR = layout.LEASE_DIR
#: Where the object-store copy of the lease lives, under the warehouse.
OBJECT_STORE_LEASES = ".lakemirror/leases"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def boot_id() -> str | None:
    """This boot of the host (Linux), or None where it cannot be read."""
    return _read("/proc/sys/kernel/random/boot_id")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of /proc/<pid>/stat (Linux), or None where it cannot be read."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return stat.rpartition(")")[2].split()  # the command name, in parentheses, may hold spaces


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (Linux: field 22 of /proc/<pid>/stat),
    or None where it cannot be read (no such process, or no /proc)."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def this_process(config: str | None = None, clock: Callable[[], float] | None = None) -> Holder:
    """This daemon as a lease holder (its HTTP address is added once the port is bound)."""
    import time

    pid = os.getpid()
    return Holder(host=socket.gethostname(), pid=pid, token=uuid.uuid4().hex, since=(clock or time.time)(),
                  boot_id=boot_id(), process_start=process_start(pid), config=config)


def process_alive(holder: Holder) -> bool | None:
    """Whether the holder's process (on this host and boot) still runs: its pid exists and, where
    the start time can be read, it is the same process, not a later one that reused the pid."""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return None
    fields = _stat_fields(holder.pid)
    if fields and fields[0] in ("Z", "X"):
        return False  # killed, not yet reaped by its parent: it writes nothing any more
    started = fields[19] if fields is not None and len(fields) > 19 else None
    if started is not None and holder.process_start is not None and started != holder.process_start:
        return False
    return True


def object_store_lease(settings: Any) -> tuple[str, str] | None:
    """The bucket and key prefix of the pipeline's lease on S3, or None: ``lease.object_store``, or by
    default the warehouse's when a local-mode warehouse is on S3."""
    where = settings.lease.object_store
    if where == "off" or (where == "auto" and not (settings.runtime.mode == "local"
                                                   and is_s3a(str(settings.runtime.warehouse)))):
        return None
    parsed = urlparse(str(settings.runtime.warehouse) if where == "auto" else where)
    return parsed.netloc, "/".join(p for p in (parsed.path.strip("/"), OBJECT_STORE_LEASES,
                                               settings.effective_pipeline_id) if p)


def lease_stores(settings: Any, pipeline_dir: Path, s3_client: Callable[[dict[str, str]], Any] | None = None
                 ) -> list[LeaseStore]:
    """The pipeline's folder, plus the copy on S3 (:func:`object_store_lease`) where there is one."""
    stores: list[LeaseStore] = [FileLeaseStore(layout.lease_dir(pipeline_dir))]
    on_s3 = object_store_lease(settings)
    if on_s3 is not None:
        from lakemirror.checkpoints.lease_s3 import S3LeaseStore

        hadoop = {k[len("spark.hadoop."):]: str(v) for k, v in settings.runtime.spark_conf.items()
                  if k.startswith("spark.hadoop.")}
        client = (s3_client or _boto3_client)(boto3_client_options(hadoop))
        stores.append(S3LeaseStore(client, *on_s3))
    return stores


def unreachable_advice(err: LeaseUnreachable) -> str:
    """``err``'s message, with how the daemon reaches a lease on S3 when that is the store that failed."""
    if not err.where.startswith("s3://"):
        return str(err)
    return (f"{err} with the spark.hadoop.fs.s3a.* settings of runtime.spark_conf (endpoint, region, keys) or "
            f"boto3's default credentials, or set lease.object_store (off: the checkpoint folder's lease only, "
            f"which does not stop a daemon of this pipeline on another machine)")


def _boto3_client(options: dict[str, str]) -> Any:
    import boto3
    from botocore.config import Config

    style = options.pop("addressing_style", None)
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=10,
                    s3={"addressing_style": style} if style else None)
    return boto3.client("s3", config=config, **options)


def pipeline_lease(settings: Any, pipeline_dir: Path, *, config: str | None, on_lost: Callable[[str], None],
                   clock: Callable[[], float], stores: list[LeaseStore] | None = None) -> PipelineLease:
    """The lease of the configured pipeline, not yet taken."""
    return PipelineLease(settings.effective_pipeline_id,
                         stores if stores is not None else lease_stores(settings, pipeline_dir),
                         this_process(config, clock), settings.lease.policy(), process_alive, clock=clock,
                         on_lost=on_lost)
