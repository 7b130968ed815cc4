"""The ``lease:`` block of a pipeline's configuration: one daemon per pipeline.

A daemon takes its pipeline's lease when it starts and renews it while it runs
(:mod:`lakemirror.checkpoints.lease`); a second daemon of the same pipeline is refused.
"""

from __future__ import annotations

from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lakemirror.checkpoints.lease import LeasePolicy


class LeaseSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    ttl_seconds: float = Field(
        30.0, ge=2, le=3600, description="How long the pipeline's lease lasts without renewal. A daemon that stopped "
        "without releasing it (killed, its host lost) holds it this long; a daemon on the same host takes it over at "
        "once when the holder's process is gone. A holder that cannot renew within it stops replicating.")
    renew_seconds: float = Field(
        5.0, gt=0, le=600, description="How often the running daemon renews its lease (less than ttl_seconds; a "
        "third of it or less leaves room for a slow renewal).")

    object_store: str = Field(
        "auto", min_length=1, max_length=1024,
        description="Where a second copy of the lease lives, on S3: `auto` (default): at "
        "<runtime.warehouse>/.lakemirror/leases/<pipeline_id>/ when a local-mode warehouse is on s3a://, "
        "nowhere otherwise; `off`: the checkpoint folder's lease only; or an s3a:// (or s3://) bucket and "
        "prefix, in any runtime mode: set it when daemons of one pipeline could run with checkpoint volumes "
        "of their own (Spark Connect pods, Databricks jobs), so that they cannot both write the same replicas. "
        "Reached with boto3 and the spark.hadoop.fs.s3a.* settings of runtime.spark_conf, or boto3's default "
        "credentials (environment, web identity, instance profile); the store must honour If-None-Match.")

    @field_validator("object_store")
    @classmethod
    def _object_store_is_a_bucket(cls, value: str) -> str:
        if value in ("auto", "off"):
            return value
        parsed = urlparse(value)
        if parsed.scheme.lower() not in ("s3a", "s3") or not parsed.netloc:
            raise ValueError(f"lease.object_store must be auto, off or an s3a://bucket/prefix location, not "
                             f"{value!r}")
        return value

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> "LeaseSettings":
        if self.renew_seconds >= self.ttl_seconds:
            raise ValueError(f"lease.renew_seconds ({self.renew_seconds:g}) must be less than lease.ttl_seconds "
                             f"({self.ttl_seconds:g})")
        return self

    def policy(self) -> LeasePolicy:
        return LeasePolicy(self.ttl_seconds, self.renew_seconds)
