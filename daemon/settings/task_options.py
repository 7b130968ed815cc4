"""The per-object options shared by ``lakemirror replicate`` and the daemon's ``schedules``:
retries, and the options of the clone, reconcile and metadata operations (pydantic, validated at
load like the rest of the configuration)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lakemirror.daemon.settings import limits
from lakemirror.sinks.batch.metadata_sync import DEFAULT_OBJECT_TYPES, OBJECT_TYPES


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RetrySettings(Strict):
    max_attempts: int = Field(3, ge=1, le=100, description="Attempts per object, the first included.")
    base_delay_seconds: float = Field(2.0, ge=0, le=limits.DAY, description="Delay before the second attempt.")
    max_delay_seconds: float = Field(120.0, gt=0, le=limits.DAY, description="Cap of the exponential backoff.")
    multiplier: float = Field(2.0, ge=1, le=100, description="Growth of the delay per attempt.")
    jitter: float = Field(0.2, ge=0, le=1, description="Fraction by which a delay is randomly shortened.")


class CloneOptions(Strict):
    force_full: bool = Field(False, description="Always copy in full (never apply the change feed).")


class ReconcileSettings(Strict):
    buckets: int = Field(1024, ge=1, le=65536, description="Key buckets compared before keys.")
    repair: bool = Field(False, description="Re-apply the source rows of mismatched keys through MERGE.")
    max_keys_reported: int = Field(1000, ge=0, description="Mismatched keys kept per kind in the results.")
    exclude_columns: list[str] = Field(default_factory=list, description="Columns not compared.")

    @field_validator("exclude_columns")
    @classmethod
    def _columns(cls, v: list[str]) -> list[str]:
        limits.names(v, "a column name")
        return v


class MetadataSettings(Strict):
    object_types: list[str] = Field(default_factory=lambda: list(DEFAULT_OBJECT_TYPES),
                                    description=f"What to sync: {', '.join(OBJECT_TYPES)}.")
    overwrite_comments: bool = Field(True, description="Replace comments the replica has; false: only fill "
                                                       "missing ones.")
    overwrite_properties: bool = Field(True, description="Replace table properties the replica has; false: only "
                                                         "add missing ones.")
    overwrite_tags: bool = Field(True, description="Replace tag values the replica has; false: only add missing "
                                                   "tags.")

    @field_validator("object_types")
    @classmethod
    def _types(cls, v: list[str]) -> list[str]:
        limits.names(v, "an object type")
        unknown = [t for t in v if t not in OBJECT_TYPES]
        if unknown:
            raise ValueError(f"unknown object types {unknown}; choose from {', '.join(OBJECT_TYPES)}")
        return v
