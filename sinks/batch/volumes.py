"""Incremental copy of a volume's files (or any directory tree) to its target, verified and resumable.

:class:`VolumeCopier` runs one copy: it lists the source and the target, asks the pure planner
(:mod:`lakemirror.sinks.batch.volume_plan`) what to do against the durable manifest
(:mod:`lakemirror.checkpoints.file_manifest`), and then, on ``workers`` threads:

- copies each new or changed file, hashing its bytes (SHA-256) as they stream through, then
  checks the target file's size and reads it back to compare checksums; a copy that does not
  verify, or a source file that changed while it was read, is retried with exponential backoff
  (``file_attempts`` in all). Writes are atomic (:mod:`lakemirror.file_store`);
- compares checksums on both sides for a file the target already holds but the manifest does not
  know (a copy finished before a crash could record it): equal, it is adopted without a write;
- records every verified copy in the manifest in small durable segments (every
  ``flush_every_files`` files or ``flush_every_seconds``), so a killed run resumes with only the
  files it had not finished, and a file finished but not yet recorded is verified, not rewritten;
- then, with ``mirror_deletes``, deletes the target copies of source files that are gone.

One file that fails never stops the others: the run goes on and ends with
:class:`VolumeCopyIncomplete` naming the files that failed (a transient error: the batch runner
retries the volume, and the retry copies only what is still missing). A file that vanished from
the source between the listing and its copy is skipped and counted.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.file_manifest import Manifest, ManifestEntry
from lakemirror.errors import TransientError
from lakemirror.file_store import FileInfo, FileStore, digest
from lakemirror.sinks.batch.volume_plan import Compare, CopyPlan, FileTask, plan_copy

log = logging.getLogger(__name__)

#: Failed files named in a result's details (the count is always complete).
MAX_FAILURES_REPORTED = 100


@dataclass(frozen=True)
class VolumeCopyOptions:
    mirror_deletes: bool = False
    compare: Compare = "size_mtime"
    workers: int = 8
    file_attempts: int = 3
    retry_base_seconds: float = 0.5
    retry_max_seconds: float = 30.0
    flush_every_files: int = 200
    flush_every_seconds: float = 2.0

    def delay(self, attempt: int) -> float:
        """Pause after failed attempt ``attempt`` (1-based): exponential, capped."""
        return float(min(self.retry_max_seconds, self.retry_base_seconds * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class FileFailure:
    path: str
    error: str
    attempts: int


@dataclass
class VolumeCopyResult:
    """What one copy did: counted as it runs (by the copier's threads, under its lock), then returned."""

    source: str
    target: str
    plan: Mapping[str, int]
    copied: int = 0
    copied_bytes: int = 0
    adopted: int = 0
    verified: int = 0
    vanished: int = 0
    deleted: int = 0
    retried: int = 0
    partials_removed: int = 0
    not_started: int = 0
    failed: tuple[FileFailure, ...] = ()
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.not_started

    def details(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "plan": dict(self.plan), "copied": self.copied,
                "copied_bytes": self.copied_bytes, "adopted": self.adopted, "verified": self.verified,
                "vanished": self.vanished, "deleted": self.deleted, "retried": self.retried,
                "partials_removed": self.partials_removed, "not_started": self.not_started,
                "failed": len(self.failed), "seconds": round(self.seconds, 3),
                "failed_files": [{"path": f.path, "error": f.error, "attempts": f.attempts}
                                 for f in self.failed[:MAX_FAILURES_REPORTED]]}


class VolumeCopyIncomplete(TransientError):
    """Some files were not copied; a retry copies only those (the others are in the manifest)."""

    code = "volume_incomplete"

    def __init__(self, message: str, *, table: str | None, details: Mapping[str, Any]) -> None:
        super().__init__(message, table=table)
        self.details = dict(details)


class NotVerified(TransientError):
    code = "not_verified"


class SourceChanging(TransientError):
    code = "source_changing"


class _Vanished(Exception):
    pass


class _Recorder:
    """Verified entries, recorded durably in batches (see the module docstring)."""

    def __init__(self, manifest: Manifest, every_files: int, every_seconds: float,
                 clock: Callable[[], float]) -> None:
        self.manifest = manifest
        self.every_files = max(1, every_files)
        self.every_seconds = every_seconds
        self.clock = clock
        self.pending: list[ManifestEntry] = []
        self.last = clock()
        self.lock = threading.Lock()

    def add(self, entry: ManifestEntry) -> None:
        with self.lock:
            self.pending.append(entry)
            if len(self.pending) >= self.every_files or self.clock() - self.last >= self.every_seconds:
                self._flush()

    def flush(self, forgotten: tuple[str, ...] = ()) -> None:
        with self.lock:
            self._flush(forgotten)

    def _flush(self, forgotten: tuple[str, ...] = ()) -> None:
        if self.pending or forgotten:
            self.manifest.record(self.pending, forgotten)
        self.pending = []
        self.last = self.clock()


class VolumeCopier:
    """One copy of ``source`` to ``target`` (see the module docstring). ``cancelled`` is polled
    before each file: a timed-out attempt stops starting files (those in flight finish)."""

    def __init__(self, source: FileStore, target: FileStore, manifest: Manifest,
                 options: VolumeCopyOptions = VolumeCopyOptions(), *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, cancelled: Callable[[], bool] = lambda: False,
                 label: str | None = None) -> None:
        self.source = source
        self.target = target
        self.manifest = manifest
        self.options = options
        self.clock = clock
        self.sleep = sleep
        self.cancelled = cancelled
        self.label = label or target.root

    def plan(self) -> tuple[CopyPlan, dict[str, ManifestEntry]]:
        known = self.manifest.load()
        plan = plan_copy(self.source.list_files(), self.target.list_files(), known,
                         mirror_deletes=self.options.mirror_deletes, compare=self.options.compare)
        return plan, known

    def run(self) -> VolumeCopyResult:
        started = self.clock()
        partials = self.target.remove_partials()
        plan, known = self.plan()
        log.info("volume %s: %s", self.label, plan.summary())
        tally = VolumeCopyResult(source=self.source.root, target=self.target.root, plan=plan.summary(),
                                 partials_removed=partials)
        failures: list[FileFailure] = []
        lock = threading.Lock()
        recorder = _Recorder(self.manifest, self.options.flush_every_files, self.options.flush_every_seconds,
                             self.clock)

        def one(task: FileTask) -> None:
            if self.cancelled():
                with lock:
                    tally.not_started += 1
                return
            self._task(task, known.get(task.source.path), recorder, tally, failures, lock)

        try:
            if plan.tasks:
                with ThreadPoolExecutor(max_workers=max(1, self.options.workers),
                                        thread_name_prefix="lakemirror-volume") as pool:
                    list(pool.map(one, plan.tasks))
        except Exception:
            recorder.flush()  # what was verified stays recorded (a killed process records nothing more)
            raise
        recorder.flush()
        deleted, delete_failures = self._deletes(plan)
        recorder.flush(tuple(p for p in plan.forget if p not in {f.path for f in delete_failures}))
        self.manifest.compact()
        result = tally
        result.deleted, result.seconds = deleted, self.clock() - started
        result.failed = tuple(sorted(failures + delete_failures, key=lambda f: f.path))
        log.info("volume %s: %d copied (%d bytes), %d adopted, %d deleted, %d failed", self.label,
                 result.copied, result.copied_bytes, result.adopted, result.deleted, len(result.failed))
        if not result.ok:
            first = result.failed[0] if result.failed else None
            raise VolumeCopyIncomplete(
                f"{self.label}: {len(result.failed)} file(s) failed"
                + (f", {result.not_started} not started (cancelled)" if result.not_started else "")
                + (f"; first: {first.path}: {first.error}" if first else "")
                + "; the files copied are recorded, a retry copies only the rest",
                table=self.label, details=result.details())
        return result

    # -- one file -------------------------------------------------------------------------------

    def _task(self, task: FileTask, known: ManifestEntry | None, recorder: _Recorder, tally: VolumeCopyResult,
              failures: list[FileFailure], lock: threading.Lock) -> None:
        path = task.source.path
        attempts = self.options.file_attempts
        for attempt in range(1, attempts + 1):
            try:
                outcome, entry = self._attempt(task, known)
            except _Vanished:
                with lock:
                    tally.vanished += 1
                return
            except Exception as exc:  # noqa: BLE001 — recorded per file; the others go on
                if attempt < attempts:
                    with lock:
                        tally.retried += 1
                    log.info("volume %s: %s: attempt %d failed (%s); retrying", self.label, path, attempt, exc)
                    self.sleep(self.options.delay(attempt))
                    continue
                with lock:
                    failures.append(FileFailure(path, f"{type(exc).__name__}: {exc}", attempt))
                log.warning("volume %s: %s failed after %d attempt(s): %s", self.label, path, attempt, exc)
                return
            if entry is not None and entry != known:
                recorder.add(entry)
            with lock:
                if outcome == "copied":
                    tally.copied += 1
                    tally.copied_bytes += entry.size if entry else 0
                elif outcome == "adopted":
                    tally.adopted += 1
                else:
                    tally.verified += 1
            return

    def _attempt(self, task: FileTask, known: ManifestEntry | None) -> tuple[str, ManifestEntry | None]:
        path = task.source.path
        if task.verify_first:
            try:
                src, checksum = digest(self.source, path)
            except FileNotFoundError:
                raise _Vanished(path) from None
            self._settled(path, src)
            try:
                tgt, target_sum = digest(self.target, path)
            except FileNotFoundError:
                tgt, target_sum = None, ""
            if tgt is not None and tgt.size == src.size and target_sum == checksum:
                entry = ManifestEntry(path, src.size, src.mtime_ns, checksum, tgt.mtime_ns, self.clock())
                if known is not None and (known.size, known.mtime_ns, known.checksum, known.target_mtime_ns) == (
                        entry.size, entry.mtime_ns, entry.checksum, entry.target_mtime_ns):
                    return "verified", known
                return "adopted", entry
        return "copied", self._copy(path)

    def _copy(self, path: str) -> ManifestEntry:
        try:
            info, chunks = self.source.open_read(path)
        except FileNotFoundError:
            raise _Vanished(path) from None
        hasher = hashlib.sha256()
        counted = [0]

        def hashed() -> Iterator[bytes]:
            for chunk in chunks:
                hasher.update(chunk)
                counted[0] += len(chunk)
                yield chunk

        self.target.write(path, hashed())
        size, checksum = counted[0], hasher.hexdigest()
        if size != info.size:
            raise SourceChanging(f"{path}: {size} bytes read where the source file had {info.size} (a writer "
                                 f"is still writing it)")
        self._settled(path, info)
        try:
            written, target_sum = digest(self.target, path)
        except FileNotFoundError:
            raise NotVerified(f"{path}: the target file is missing right after the copy") from None
        if written.size != size:
            raise NotVerified(f"{path}: the target holds {written.size} bytes after copying {size}")
        if target_sum != checksum:
            raise NotVerified(f"{path}: the target's checksum differs from the source's after the copy")
        return ManifestEntry(path, size, info.mtime_ns, checksum, written.mtime_ns, self.clock())

    def _settled(self, path: str, read: FileInfo) -> None:
        """Refuse a read of a file that a writer changed meanwhile (where a store's reads can see that)."""
        if self.source.consistent_reads:
            return
        after = self.source.stat(path)
        if after is None:
            raise _Vanished(path)
        if (after.size, after.mtime_ns) != (read.size, read.mtime_ns):
            raise SourceChanging(f"{path}: the source file changed while it was read (a writer is still "
                                 f"writing it)")

    # -- deletions ------------------------------------------------------------------------------

    def _deletes(self, plan: CopyPlan) -> tuple[int, list[FileFailure]]:
        failures: list[FileFailure] = []
        deleted = 0
        for path in plan.deletes:
            try:
                self.target.delete(path)
                deleted += 1
            except Exception as exc:  # noqa: BLE001 — recorded; the entry stays for the next run
                failures.append(FileFailure(path, f"delete failed: {type(exc).__name__}: {exc}", 1))
        return deleted, failures


# -- the batch runner's operation ---------------------------------------------------------------

class VolumeOperations:
    """The ``volume_files`` operation of the batch runner (an
    :class:`~lakemirror.sinks.batch.operations.Operations`): one copy per job, its directories and
    options in ``job.settings.options["volume_files"]``, its manifest under ``manifest_root`` by the
    target's name. ``s3a_conf`` gives the S3 settings (endpoint, credentials) for ``s3a://`` paths."""

    def __init__(self, manifest_root: str, s3a_conf: Callable[[], Mapping[str, str]], *,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 open_store: Callable[[str, Mapping[str, str]], FileStore] | None = None) -> None:
        from lakemirror.file_store import open_file_store

        self.manifest_root = manifest_root
        self.s3a_conf = s3a_conf
        self.clock = clock
        self.sleep = sleep
        self.open_store = open_store or open_file_store
        self._cancelled: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def manifest_of(self, job: Any) -> Manifest:
        from lakemirror.checkpoints.file_manifest import FileManifest

        return FileManifest(layout.volume_manifest_dir(self.manifest_root, job.target.slug))

    def run(self, operation: str, job: Any, tag: str) -> Mapping[str, Any]:
        opts = dict(job.settings.options.get("volume_files", {}))
        event = threading.Event()
        with self._lock:
            self._cancelled[tag] = event
        try:
            conf = self.s3a_conf() if any(str(opts[k]).startswith(("s3a://", "s3://"))
                                          for k in ("source_path", "target_path")) else {}
            source = self.open_store(str(opts["source_path"]), conf)
            target = self.open_store(str(opts["target_path"]), conf)
            options = VolumeCopyOptions(
                mirror_deletes=bool(opts.get("mirror_deletes", False)), compare=opts.get("compare", "size_mtime"),
                workers=int(opts.get("workers", 8)), file_attempts=int(opts.get("file_attempts", 3)),
                flush_every_files=int(opts.get("flush_every_files", 200)),
                flush_every_seconds=float(opts.get("flush_every_seconds", 2.0)))
            copier = VolumeCopier(source, target, self.manifest_of(job), options, clock=self.clock, sleep=self.sleep,
                                  cancelled=event.is_set, label=str(job.target))
            return copier.run().details()
        finally:
            with self._lock:
                self._cancelled.pop(tag, None)

    def cancel(self, tag: str) -> None:
        with self._lock:
            event = self._cancelled.get(tag)
        if event is not None:
            event.set()
