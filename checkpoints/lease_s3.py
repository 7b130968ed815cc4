"""A pipeline's lease on S3 (:mod:`lakemirror.checkpoints.lease_store`): one object per generation.

S3 creates an object only if absent when the ``PUT`` carries ``If-None-Match: *`` (conditional
writes, on AWS since 2024 and on S3-compatible servers that implement them): of two daemons putting
the same generation, one gets ``412 Precondition Failed`` (or ``409 ConditionalRequestConflict``
while the other's put is in flight). Listing is strongly consistent, so the newest generation is
seen by every daemon as soon as it is created. A server that ignores the header would let two
daemons both believe they created a generation: :func:`check_conditional_put` proves the server
honours it before the store is used.
"""

from __future__ import annotations

import uuid
from typing import Any

from lakemirror.checkpoints.lease import LeaseRecord, Stored
from lakemirror.checkpoints.lease_store import generation_of, lease_name

#: The error codes of a conditional put refused because the object exists (or is being created).
_REFUSED = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}


class ConditionalPutUnsupported(RuntimeError):
    """The S3 server ignores ``If-None-Match`` on PUT: it cannot hold a lease."""


class S3LeaseStore:
    """Generations as objects ``<prefix>/lease-<generation>.json`` in ``bucket``, through a boto3
    S3 client (any object with ``put_object``, ``get_object``, ``list_objects_v2`` and
    ``delete_objects``)."""

    def __init__(self, client: Any, bucket: str, prefix: str, *, verify: bool = True) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        #: Whether the server's support of conditional puts is still to be proven (before the first create).
        self._verify = verify

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, generation: int) -> str:
        return f"{self.prefix}/{lease_name(generation)}"

    def _generations(self) -> list[int]:
        found: list[int] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{self.prefix}/lease-"}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.client.list_objects_v2(**kwargs)
            for item in page.get("Contents", ()):
                generation = generation_of(str(item["Key"]).rsplit("/", 1)[-1])
                if generation is not None:
                    found.append(generation)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return sorted(found)

    def newest(self) -> Stored | None:
        for _ in range(5):  # pruned between the listing and the read: list again
            generations = self._generations()
            if not generations:
                return None
            try:
                got = self.client.get_object(Bucket=self.bucket, Key=self._key(generations[-1]))
            except Exception as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    continue
                raise
            body = got["Body"].read()
            modified = got["LastModified"].timestamp()
            return Stored(generations[-1], LeaseRecord.decode(generations[-1], body), modified)
        return None

    def create(self, record: LeaseRecord) -> bool:
        if self._verify:
            check_conditional_put(self.client, self.bucket, self.prefix)
            self._verify = False
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(record.generation), Body=record.encode(),
                                   IfNoneMatch="*", ContentType="application/json")
        except Exception as exc:
            if _code(exc) in _REFUSED:
                return False
            raise
        return True

    def write(self, record: LeaseRecord) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(record.generation), Body=record.encode(),
                               ContentType="application/json")

    def prune(self, below: int) -> None:
        old = [{"Key": self._key(g)} for g in self._generations() if g < below]
        for start in range(0, len(old), 1000):
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": old[start:start + 1000], "Quiet": True})


def check_conditional_put(client: Any, bucket: str, prefix: str) -> None:
    """Raise :class:`ConditionalPutUnsupported` unless a second ``If-None-Match: *`` put of one key is
    refused (a probe object of its own under ``prefix``, removed afterwards)."""
    key = f"{prefix.strip('/')}/.conditional-put-probe-{uuid.uuid4().hex}"
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"2", IfNoneMatch="*")
        except Exception as exc:
            if _code(exc) in _REFUSED:
                return
            raise
        raise ConditionalPutUnsupported(
            f"the S3 server at s3://{bucket} accepted a second If-None-Match put of one object: it does not "
            f"support conditional writes, so it cannot hold the pipeline's lease")
    finally:
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key}], "Quiet": True})


def _code(exc: Exception) -> str:
    """The S3 error code of a botocore ``ClientError`` (or the HTTP status), else ''."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    error = response.get("Error") or {}
    code = str(error.get("Code") or "")
    return code or str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "")
