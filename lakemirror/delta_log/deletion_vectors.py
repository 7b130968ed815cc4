"""Delta deletion vectors: their descriptors, their files and the bitmaps inside them.

Pure: no Spark, no delta-rs. A deletion vector marks rows of one data file as deleted by their
position in the file (0-based, across row groups). The Delta protocol's "Deletion Vectors" section
fixes the formats, which this module reads and writes:

- A descriptor (the ``deletionVector`` field of an ``add`` or ``remove`` action) says where the
  bitmap is: ``storageType`` ``u`` (a file beside the data, named by a UUID that
  ``pathOrInlineDv`` holds Z85-encoded after an optional prefix), ``p`` (an absolute path) or
  ``i`` (the bitmap itself, Z85-encoded, inline). ``offset`` is where in the file it starts,
  ``sizeInBytes`` its size and ``cardinality`` how many rows it deletes.
- A deletion-vector file is one version byte (1) and then, for each bitmap: its size (4 bytes,
  big-endian), the bitmap, and the CRC-32 of the bitmap (4 bytes, big-endian).
- A bitmap is a magic number (1681511377, 4 bytes little-endian) and then a "portable"
  64-bit Roaring bitmap: the count of 32-bit buckets (8 bytes little-endian) and, for each, its
  high 32 bits (4 bytes little-endian) followed by a portable 32-bit Roaring bitmap.

Positions are NumPy ``uint64`` arrays, sorted and unique.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pyroaring import BitMap

#: The bitmap's magic number in Delta's "portable" format (the one Delta writes).
PORTABLE_MAGIC = 1681511377
#: The magic number of Delta's older "native" format, which it still reads; so does this module not.
NATIVE_MAGIC = 1681511376
FILE_FORMAT_VERSION = 1
Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(Z85_ALPHABET)}
#: Characters of a Z85-encoded UUID (16 bytes).
UUID_Z85_CHARS = 20


class DeletionVectorError(ValueError):
    """A deletion vector this module cannot read: corrupt, or in a format it does not know."""


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ's Base85) of ``data``, whose length must be a multiple of 4."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes whole 4-byte words, not {len(data)} bytes")
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(Z85_ALPHABET[digit])
        out.append("".join(reversed(chars)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise DeletionVectorError(f"a Z85 text has a multiple of 5 characters, not {len(text)}")
    words = []
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i:i + 5]:
            try:
                value = value * 85 + _Z85_INDEX[c]
            except KeyError:
                raise DeletionVectorError(f"{c!r} is not a Z85 character") from None
        if value > 0xFFFFFFFF:
            raise DeletionVectorError(f"{text[i:i + 5]!r} is not a Z85 word")
        words.append(value)
    return struct.pack(f">{len(words)}I", *words)


def dv_file_name(file_id: uuid.UUID) -> str:
    return f"deletion_vector_{file_id}.bin"


@dataclass(frozen=True)
class DvDescriptor:
    storage_type: str
    path_or_inline: str
    offset: int | None
    size_in_bytes: int
    cardinality: int

    @classmethod
    def from_action(cls, dv: dict[str, Any]) -> "DvDescriptor":
        return cls(str(dv["storageType"]), str(dv["pathOrInlineDv"]),
                   None if dv.get("offset") is None else int(dv["offset"]),
                   int(dv["sizeInBytes"]), int(dv["cardinality"]))

    def to_action(self) -> dict[str, Any]:
        out: dict[str, Any] = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline}
        if self.offset is not None:
            out["offset"] = self.offset
        out.update(sizeInBytes=self.size_in_bytes, cardinality=self.cardinality)
        return out

    @property
    def unique_id(self) -> str:
        """What tells two deletion vectors of one data file apart (with the file's path, a file's
        identity in the log)."""
        base = self.storage_type + self.path_or_inline
        return base if self.offset is None else f"{base}@{self.offset}"

    def file_path(self, table_dir: Path) -> Path:
        """Where the bitmap's file is (``u`` and ``p`` descriptors)."""
        if self.storage_type == "u":
            prefix, encoded = (self.path_or_inline[:-UUID_Z85_CHARS], self.path_or_inline[-UUID_Z85_CHARS:])
            name = dv_file_name(uuid.UUID(bytes=z85_decode(encoded)))
            return table_dir / prefix / name if prefix else table_dir / name
        if self.storage_type == "p":
            from urllib.parse import unquote, urlparse

            parsed = urlparse(self.path_or_inline)
            if parsed.scheme not in ("", "file"):
                raise DeletionVectorError(f"a deletion vector at {self.path_or_inline} is not on this file system")
            return Path(unquote(parsed.path))
        raise DeletionVectorError(f"a {self.storage_type!r} deletion vector has no file")


def encode_positions(positions: np.ndarray) -> bytes:
    """The bitmap of ``positions`` (sorted, unique ``uint64``): magic number, then portable Roaring."""
    positions = np.asarray(positions, dtype=np.uint64)
    highs = (positions >> np.uint64(32)).astype(np.uint32)
    buckets = np.unique(highs)
    parts = [struct.pack("<iQ", PORTABLE_MAGIC, len(buckets))]
    for high in buckets:
        lows = (positions[highs == high] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        bitmap = BitMap(lows)
        bitmap.run_optimize()
        parts.append(struct.pack("<I", int(high)))
        parts.append(bitmap.serialize())
    return b"".join(parts)


def encode_bitmap(rows: BitMap) -> bytes:
    """The bitmap of a file's deleted rows below 2**32 (one bucket): magic number, then portable Roaring."""
    rows = BitMap(rows)
    rows.run_optimize()
    return struct.pack("<iQ", PORTABLE_MAGIC, 1 if rows else 0) + (struct.pack("<I", 0) + rows.serialize() if rows else b"")


def decode_positions(data: bytes) -> np.ndarray:
    """The positions a bitmap (magic number and Roaring data) marks, sorted ``uint64``."""
    if len(data) < 12:
        raise DeletionVectorError(f"a deletion vector of {len(data)} bytes is too short")
    (magic,) = struct.unpack_from("<i", data, 0)
    if magic == NATIVE_MAGIC:
        raise DeletionVectorError("a deletion vector in Delta's native format (not portable) is not read here")
    if magic != PORTABLE_MAGIC:
        raise DeletionVectorError(f"a deletion vector's magic number is {magic}, not {PORTABLE_MAGIC}")
    (count,) = struct.unpack_from("<Q", data, 4)
    at, out = 12, []
    for _ in range(count):
        (high,) = struct.unpack_from("<I", data, at)
        at += 4
        bitmap = BitMap.deserialize(data[at:])
        # The bitmap's size is not stored; deserialising keeps each container's kind, so serialising
        # it again gives the same bytes, and their length.
        at += len(bitmap.serialize())
        lows = np.asarray(bitmap.to_array(), dtype=np.uint64)
        out.append((np.uint64(high) << np.uint64(32)) | lows)
    if at != len(data):
        raise DeletionVectorError(f"a deletion vector has {len(data) - at} bytes after its last bitmap")
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def frame(bitmap: bytes) -> bytes:
    """One bitmap as a deletion-vector file holds it: size, bitmap, CRC-32 (both big-endian)."""
    return struct.pack(">i", len(bitmap)) + bitmap + struct.pack(">I", zlib.crc32(bitmap))


def read_positions(table_dir: Path, dv: DvDescriptor) -> np.ndarray:
    """The positions a descriptor's deletion vector marks, checked against its size, CRC and
    cardinality."""
    if dv.storage_type == "i":
        data = z85_decode(dv.path_or_inline)[:dv.size_in_bytes]
    else:
        with open(dv.file_path(table_dir), "rb") as f:
            f.seek(dv.offset or 0)
            head = f.read(4)
            if len(head) < 4:
                raise DeletionVectorError(f"{dv.file_path(table_dir)} ends before offset {dv.offset}")
            (size,) = struct.unpack(">i", head)
            if size != dv.size_in_bytes:
                raise DeletionVectorError(f"a deletion vector's stored size is {size}, its descriptor's "
                                          f"{dv.size_in_bytes}")
            data = f.read(size)
            (crc,) = struct.unpack(">I", f.read(4))
        if zlib.crc32(data) != crc:
            raise DeletionVectorError(f"a deletion vector in {dv.file_path(table_dir)} fails its CRC-32")
    positions = decode_positions(data)
    if len(positions) != dv.cardinality:
        raise DeletionVectorError(f"a deletion vector holds {len(positions)} rows, its descriptor says "
                                  f"{dv.cardinality}")
    return positions


class DvFileWriter:
    """The bitmaps of one commit, gathered into one new deletion-vector file beside the data."""

    def __init__(self, file_id: uuid.UUID | None = None) -> None:
        self.file_id = file_id or uuid.uuid4()
        self._parts: list[bytes] = [bytes([FILE_FORMAT_VERSION])]
        self._size = 1

    @property
    def name(self) -> str:
        return dv_file_name(self.file_id)

    @property
    def empty(self) -> bool:
        return self._size == 1

    def add(self, positions: "np.ndarray | BitMap") -> DvDescriptor:
        """Add the bitmap of ``positions`` (sorted, unique, or a 32-bit Roaring bitmap); its descriptor."""
        bitmap = encode_bitmap(positions) if isinstance(positions, BitMap) else encode_positions(positions)
        descriptor = DvDescriptor("u", z85_encode(self.file_id.bytes), self._size, len(bitmap), len(positions))
        framed = frame(bitmap)
        self._parts.append(framed)
        self._size += len(framed)
        return descriptor

    def content(self) -> bytes:
        return b"".join(self._parts)
