"""File stores: the directories whose files a volume copy reads and writes, behind one small interface.

A :class:`FileStore` is one directory tree (a local folder, a Unity Catalog volume as its
``/Volumes/<catalog>/<schema>/<volume>`` path, or a prefix of an S3 bucket). Paths handed to and
returned by a store are relative to its root, ``/``-separated. Two implementations:

- :class:`ArrowFileStore`, the real one, on pyarrow's file systems: the local file system (a
  ``/Volumes/...`` path included: Databricks compute mounts volumes there) and S3 (``s3a://`` or
  ``s3://``) with the endpoint, region and credentials of the Spark session's ``fs.s3a.*``
  settings, so an operator configures object storage once (:func:`open_file_store`).
- :class:`InMemoryFileStore`, its twin for unit tests, with faults that can be armed (a write
  that fails part-way, a write that stores other bytes than it was given, a crash after a number of
  writes).

A write is atomic: the file appears complete or not at all. Locally it goes to a hidden temporary
file beside the target, renamed over it when complete; on S3 an object is only visible once its
upload completes (a killed process leaves none), and a write that fails part-way deletes what
it left. Temporary files a killed process left locally are named by :data:`TEMP_MARKER` and are
never listed as files of the store.
"""

from __future__ import annotations

import hashlib
import posixpath
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Iterator, Mapping, Protocol

from lakemirror.errors import TerminalError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

#: Part of the name of every temporary file a local write makes (never listed as a store's file).
TEMP_MARKER = ".lakemirror-partial-"
#: Bytes read or written at a time.
CHUNK_BYTES = 4 * 1024 * 1024
#: The checksum every copy is verified with.
CHECKSUM_ALGORITHM = "sha256"


@dataclass(frozen=True, order=True)
class FileInfo:
    """One file of a store: its path relative to the store's root, size and modification time."""

    path: str
    size: int
    mtime_ns: int


class FileStore(Protocol):
    """A directory tree of files (see the module docstring). Every method may raise ``OSError``."""

    @property
    def root(self) -> str:
        """Where the store is, for messages (never holds a credential)."""
        ...

    def list_files(self) -> Iterator[FileInfo]:
        """Every file under the root, recursively (no directories, no temporary files)."""
        ...

    def stat(self, path: str) -> FileInfo | None:
        """The file at ``path``, or None if there is none."""
        ...

    @property
    def consistent_reads(self) -> bool:
        """A read sees one version of a file whole, even if it is replaced meanwhile (an object
        store's GET); False where a writer can change a file while it is read (a local file)."""
        ...

    def open_read(self, path: str) -> tuple[FileInfo, Iterator[bytes]]:
        """The file as the read sees it (size, modification time) and its bytes, in chunks of at
        most :data:`CHUNK_BYTES`. Raises ``FileNotFoundError`` if there is no such file."""
        ...

    def write(self, path: str, chunks: Iterable[bytes]) -> None:
        """Write ``chunks`` as the file ``path`` (parents created), atomically: complete or absent."""
        ...

    def delete(self, path: str) -> None:
        """Delete the file ``path``; nothing if it does not exist."""
        ...

    def remove_partials(self) -> int:
        """Delete temporary files an interrupted write left; how many there were."""
        ...


def digest(store: FileStore, path: str) -> tuple[FileInfo, str]:
    """The file ``path`` as read (its size: the bytes read) and the SHA-256 of its bytes, read
    through once."""
    h = hashlib.sha256()
    size = 0
    info, chunks = store.open_read(path)
    for chunk in chunks:
        h.update(chunk)
        size += len(chunk)
    return FileInfo(info.path, size, info.mtime_ns), h.hexdigest()


def _header_time_ns(value: bytes | str | None) -> int | None:
    """An HTTP ``Last-Modified`` value (RFC 1123, or ISO 8601 as some S3 servers send) in ns."""
    if not value:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    from datetime import datetime, timezone
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp()) * 1_000_000_000


def _clean(path: str) -> str:
    """A relative path, normalised; refuses one that leaves the root."""
    norm = posixpath.normpath(path.replace("\\", "/")).lstrip("/")
    if norm in ("", ".") or norm == ".." or norm.startswith("../"):
        raise ValueError(f"file path {path!r} is not inside the store")
    return norm


class ArrowFileStore:
    """A directory tree on a pyarrow file system (local or S3); see the module docstring."""

    def __init__(self, fs: "pafs.FileSystem", base: str, *, display: str | None = None, local: bool) -> None:
        self.fs = fs
        self.base = base.rstrip("/")
        self.local = local
        self._display = display or base

    @property
    def root(self) -> str:
        return self._display

    def _full(self, path: str) -> str:
        return f"{self.base}/{_clean(path)}"

    def _relative(self, full: str) -> str:
        return full[len(self.base) + 1:]

    def list_files(self) -> Iterator[FileInfo]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.base, recursive=True, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.type != pafs.FileType.File or TEMP_MARKER in info.base_name:
                continue
            yield FileInfo(self._relative(info.path), int(info.size or 0), int(info.mtime_ns or 0))

    def stat(self, path: str) -> FileInfo | None:
        import pyarrow.fs as pafs

        info = self.fs.get_file_info(self._full(path))
        if info.type != pafs.FileType.File:
            return None
        return FileInfo(_clean(path), int(info.size or 0), int(info.mtime_ns or 0))

    @property
    def consistent_reads(self) -> bool:
        return not self.local

    def open_read(self, path: str) -> tuple[FileInfo, Iterator[bytes]]:
        full = self._full(path)
        if self.local:
            info = self.stat(path)
            if info is None:
                raise FileNotFoundError(full)
            stream = self.fs.open_input_stream(full)
        else:
            # One GET: the object's size and time come from its headers (no HEAD request).
            stream = self.fs.open_input_stream(full)
            meta = stream.metadata()
            mtime = _header_time_ns(meta.get("Last-Modified") or meta.get(b"Last-Modified"))
            length = meta.get("Content-Length") or meta.get(b"Content-Length")
            found = self.stat(path) if mtime is None or length is None else None
            info = found or FileInfo(_clean(path), int(length or 0), int(mtime or 0))

        def chunks() -> Iterator[bytes]:
            with stream:
                while True:
                    chunk = stream.read(CHUNK_BYTES)
                    if not chunk:
                        return
                    yield bytes(chunk)
        return info, chunks()

    def write(self, path: str, chunks: Iterable[bytes]) -> None:
        full = self._full(path)
        parent = posixpath.dirname(full)
        if self.local:
            self.fs.create_dir(parent, recursive=True)
            temp = f"{parent}/{TEMP_MARKER}{uuid.uuid4().hex}"
            try:
                with self.fs.open_output_stream(temp) as out:
                    for chunk in chunks:
                        out.write(chunk)
                self.fs.move(temp, full)
            except BaseException:
                self._quiet_delete(temp)
                raise
            return
        # An object store publishes an object when its upload completes; a failure part-way would
        # complete it on close, so what was written is deleted.
        try:
            with self.fs.open_output_stream(full) as out:
                for chunk in chunks:
                    out.write(chunk)
        except BaseException:
            self._quiet_delete(full)
            raise

    def _quiet_delete(self, full: str) -> None:
        try:
            self.fs.delete_file(full)
        except OSError:
            pass

    def delete(self, path: str) -> None:
        try:
            self.fs.delete_file(self._full(path))
        except FileNotFoundError:
            pass

    def remove_partials(self) -> int:
        if not self.local:
            return 0
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.base, recursive=True, allow_not_found=True)
        found = [i.path for i in self.fs.get_file_info(selector)
                 if i.type == pafs.FileType.File and TEMP_MARKER in i.base_name]
        for full in found:
            self._quiet_delete(full)
        return len(found)


class UnsupportedLocation(TerminalError):
    code = "unsupported_location"


def split_location(location: str) -> tuple[str, str]:
    """``(scheme, rest)``: ``("", "/abs/path")`` for a local path, ``("s3", "bucket/prefix")``
    for ``s3a://`` and ``s3://``. Pure."""
    if "://" not in location:
        return "", location
    scheme, _, rest = location.partition("://")
    scheme = scheme.lower()
    if scheme == "file":
        return "", "/" + rest.lstrip("/")
    if scheme in ("s3a", "s3"):
        return "s3", rest.strip("/")
    return scheme, rest


def s3_options(hadoop: Mapping[str, str]) -> dict[str, Any]:
    """pyarrow ``S3FileSystem`` arguments equivalent to the ``fs.s3a.*`` entries of ``hadoop``
    (credentials included: never log them). Pure."""
    ssl = hadoop.get("fs.s3a.connection.ssl.enabled", "true").strip().lower() != "false"
    out: dict[str, Any] = {}
    endpoint = hadoop.get("fs.s3a.endpoint", "").strip()
    if endpoint:
        scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("https" if ssl else "http", "", endpoint)
        out["endpoint_override"] = host.rstrip("/")
        out["scheme"] = scheme
    region = hadoop.get("fs.s3a.endpoint.region") or hadoop.get("fs.s3a.region")
    if region:
        out["region"] = region
    if hadoop.get("fs.s3a.path.style.access", "false").strip().lower() != "true" and not endpoint:
        out["force_virtual_addressing"] = True
    for key, arg in (("fs.s3a.access.key", "access_key"), ("fs.s3a.secret.key", "secret_key"),
                     ("fs.s3a.session.token", "session_token")):
        if hadoop.get(key):
            out[arg] = hadoop[key]
    return out


def open_file_store(location: str, s3a_conf: Mapping[str, str] | None = None) -> FileStore:
    """The store rooted at ``location``: a local (or ``/Volumes/...``) path, or ``s3a://bucket/prefix``
    with the S3 settings ``s3a_conf`` (the session's ``fs.s3a.*``). Raises :class:`UnsupportedLocation`
    for another scheme, naming the ones supported."""
    import pyarrow.fs as pafs

    scheme, rest = split_location(location)
    if scheme == "":
        import os

        base = os.path.abspath(rest)
        return ArrowFileStore(pafs.LocalFileSystem(), base, display=base, local=True)
    if scheme == "s3":
        if not rest:
            raise UnsupportedLocation(f"{location}: name a bucket (s3a://bucket/prefix)")
        fs = pafs.S3FileSystem(**s3_options(s3a_conf or {}))
        return ArrowFileStore(fs, rest, display=f"s3a://{rest}", local=False)
    raise UnsupportedLocation(f"{location}: file copies read and write local paths (a Unity Catalog volume "
                              f"as /Volumes/<catalog>/<schema>/<volume>) and s3a:// locations, not {scheme}://")


# -- the twin -----------------------------------------------------------------------------------

class InjectedFault(OSError):
    """A fault an :class:`InMemoryFileStore` was armed to raise."""


class SimulatedCrash(BaseException):
    """Raised by an :class:`InMemoryFileStore` armed to crash: like a killed process, it is not an
    ``Exception``, so nothing handles it on the way out."""


class InMemoryFileStore:
    """The twin: files in a dict, modification times from an injected clock, faults to arm.

    - ``fail_writes[path] = n``: the next ``n`` writes of ``path`` fail part-way (nothing stored);
    - ``corrupt_writes[path] = n``: the next ``n`` writes of ``path`` store other bytes;
    - ``crash_after_writes = n``: the ``n+1``-th write raises :class:`SimulatedCrash`.
    """

    def __init__(self, files: Mapping[str, bytes] | None = None, *, clock: Callable[[], float] = time.time,
                 name: str = "memory") -> None:
        self.clock = clock
        self.name = name
        self.files: dict[str, tuple[bytes, int]] = {}
        self.fail_writes: dict[str, int] = {}
        self.corrupt_writes: dict[str, int] = {}
        self.crash_after_writes: int | None = None
        self.writes = 0
        self.reads = 0
        self._lock = threading.Lock()
        for path, data in (files or {}).items():
            self.put(path, data)

    @property
    def root(self) -> str:
        return f"memory://{self.name}"

    def put(self, path: str, data: bytes, mtime_ns: int | None = None) -> None:
        """Set a file directly (a test's own change), with its modification time."""
        with self._lock:
            self.files[_clean(path)] = (bytes(data), int(self.clock() * 1e9) if mtime_ns is None else mtime_ns)

    def data(self, path: str) -> bytes:
        return self.files[_clean(path)][0]

    def list_files(self) -> Iterator[FileInfo]:
        with self._lock:
            snapshot = sorted(self.files.items())
        for path, (data, mtime) in snapshot:
            yield FileInfo(path, len(data), mtime)

    def stat(self, path: str) -> FileInfo | None:
        with self._lock:
            found = self.files.get(_clean(path))
        return None if found is None else FileInfo(_clean(path), len(found[0]), found[1])

    @property
    def consistent_reads(self) -> bool:
        return False

    def open_read(self, path: str) -> tuple[FileInfo, Iterator[bytes]]:
        with self._lock:
            found = self.files.get(_clean(path))
            self.reads += 1
        if found is None:
            raise FileNotFoundError(f"{self.root}/{path}")
        data, mtime = found

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(data), 1024):
                yield data[i:i + 1024]
        return FileInfo(_clean(path), len(data), mtime), chunks()

    def write(self, path: str, chunks: Iterable[bytes]) -> None:
        path = _clean(path)
        with self._lock:
            if self.crash_after_writes is not None and self.writes >= self.crash_after_writes:
                raise SimulatedCrash(f"crash before writing {path}")
            self.writes += 1
            failing = self.fail_writes.get(path, 0)
            if failing:
                self.fail_writes[path] = failing - 1
            corrupt = self.corrupt_writes.get(path, 0)
            if corrupt:
                self.corrupt_writes[path] = corrupt - 1
        data = b"".join(chunks)
        if failing:
            raise InjectedFault(f"injected write failure of {path}")
        if corrupt:
            data = data[:-1] + bytes([(data[-1] + 1) % 256]) if data else b"\x00"
        self.put(path, data)

    def delete(self, path: str) -> None:
        with self._lock:
            self.files.pop(_clean(path), None)

    def remove_partials(self) -> int:
        return 0
