"""The ``lease:`` block of a pipeline's configuration: one daemon per pipeline.

A daemon takes its pipeline's lease when it starts and renews it while it runs
(:mod:`lakemirror.checkpoints.lease`); a second daemon of the same pipeline is refused.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

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

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> "LeaseSettings":
        if self.renew_seconds >= self.ttl_seconds:
            raise ValueError(f"lease.renew_seconds ({self.renew_seconds:g}) must be less than lease.ttl_seconds "
                             f"({self.ttl_seconds:g})")
        return self

    def policy(self) -> LeasePolicy:
        return LeasePolicy(self.ttl_seconds, self.renew_seconds)
