"""Settings of the ``volume_files`` operation of ``lakemirror replicate``: incremental, verified copies
of a volume's files (or of any directory: a local path, ``s3a://bucket/prefix``).

``volume_files`` (the options) may be written at any level of the file like the other per-object
settings; ``volumes`` (top level) lists directories to copy beyond the Unity Catalog volumes found
in the catalogs::

    operations: [clone, volume_files]      # on Databricks: every volume of the selected schemas too
    volume_files: {workers: 16, mirror_deletes: false}
    volumes:
      - source: s3a://landing/raw
        target: /data/dr/raw
        name: dr.landing.raw               # catalog.schema.volume the audit rows name
        volume_files: {mirror_deletes: true}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lakemirror.daemon.settings import limits
from lakemirror.identifiers import TableName


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class VolumeFilesSettings(Strict):
    mirror_deletes: bool = Field(False, description="Delete the target's copy of a source file that is gone "
                                                    "(only a copy lakemirror wrote and nobody changed since).")
    compare: Literal["size_mtime", "checksum"] = Field(
        "size_mtime", description="How a file already copied is found unchanged: by size and modification "
                                  "time, or by reading it and comparing checksums (every run reads every file).")
    workers: int = Field(8, ge=1, le=256, description="Files copied at once.")
    file_attempts: int = Field(3, ge=1, le=20, description="Attempts per file before it is reported failed "
                                                           "(the volume's retry then copies only the failed files).")
    flush_every_files: int = Field(200, ge=1, description="Verified copies recorded per manifest segment.")
    flush_every_seconds: float = Field(2.0, gt=0, description="Longest wait before verified copies are recorded.")


def volume_name_of(path: str) -> TableName | None:
    """``catalog.schema.volume`` of a ``/Volumes/<catalog>/<schema>/<volume>[/...]`` path, else None."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 4 and parts[0] == "Volumes" and path.startswith("/"):
        return TableName(parts[1], parts[2], parts[3])
    return None


def _location(value: str, field: str) -> str:
    limits.path(value, field)
    v = value.strip()
    if not v or "\x00" in v:
        raise ValueError(f"{field} must name a directory")
    if "://" in v:
        scheme = v.split("://", 1)[0].lower()
        if scheme not in ("s3a", "s3", "file"):
            raise ValueError(f"{field} {v!r}: use a local path (a volume as /Volumes/<catalog>/<schema>/<volume>) "
                             f"or s3a://bucket/prefix, not {scheme}://")
    elif not v.startswith("/"):
        raise ValueError(f"{field} {v!r} must be an absolute path or an s3a:// URI")
    return v


class VolumeEntry(Strict):
    """One directory copied by ``volume_files``."""

    source: str = Field(description="The directory read: a local path, /Volumes/<catalog>/<schema>/<volume>, "
                                    "or s3a://bucket/prefix.")
    target: str = Field(description="The directory written (same forms).")
    name: str | None = Field(None, description="catalog.schema.volume naming the copy in the audit table and its "
                                               "manifest (default: the target's, when it is a /Volumes/ path).")
    volume_files: VolumeFilesSettings | None = Field(None, description="Overrides of the file-level options "
                                                                       "for this directory.")

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return _location(v, "source")

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        return _location(v, "target")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None:
            limits.table_name(v, "name")
        return v

    @model_validator(mode="after")
    def _check(self) -> "VolumeEntry":
        if self.name is None and volume_name_of(self.target) is None:
            raise ValueError("name is required when the target is not a /Volumes/<catalog>/<schema>/<volume> path "
                             "(catalog.schema.volume: how the audit table names this copy)")
        src, dst = self.source.rstrip("/"), self.target.rstrip("/")
        if src == dst or dst.startswith(src + "/") or src.startswith(dst + "/"):
            raise ValueError(f"source {self.source!r} and target {self.target!r} overlap; copy between "
                             f"separate directories")
        return self

    @property
    def target_name(self) -> TableName:
        found = TableName.parse(self.name) if self.name else volume_name_of(self.target)
        assert found is not None  # checked by _check
        return found

    @property
    def source_name(self) -> TableName:
        return volume_name_of(self.source) or self.target_name
