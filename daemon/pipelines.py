"""The pipelines one daemon runs: the one of its configuration file, and those started over the API.

Each pipeline has its own :class:`~lakemirror.supervisor.control.loop.Supervisor` (and so its own
runners, state folder and checkpoints), and they all share the daemon's one Spark session. The
registry is the daemon layer's book of them; the supervisor layer knows nothing of it, nor of HTTP.

Threads: the daemon's main loop ticks every pipeline (:meth:`PipelineRegistry.tick_all`); the API
worker adds and stops pipelines; HTTP threads only read (views are plain data). A pipeline's own
lock makes a tick and a stop never overlap.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Literal

from lakemirror.bounded import all_within, call_within
from lakemirror.checkpoints import layout
from lakemirror.daemon.settings import Settings
from lakemirror.supervisor.control.halts import SLACK_SECONDS
from lakemirror.supervisor.control.loop import Supervisor, TableView

log = logging.getLogger(__name__)

Origin = Literal["config", "api"]


@dataclass
class PipelineHandle:
    """One running pipeline: its settings, supervisor and where its files live."""

    settings: Settings
    supervisor: Supervisor
    origin: Origin
    started_at: float = field(default_factory=time.time)
    state: Literal["running", "stopping", "stopped"] = "running"
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Called once the pipeline has stopped (a pipeline posted to the API releases its lease).
    on_stopped: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def pipeline_id(self) -> str:
        return self.settings.effective_pipeline_id

    @property
    def directory(self) -> Path:
        return Path(self.settings.checkpoint_volume) / self.pipeline_id

    def views(self) -> list[TableView]:
        return self.supervisor.views()

    def tick(self) -> None:
        with self.lock:
            if self.state == "running":
                self.supervisor.tick()

    def stop(self, drain_timeout_seconds: float) -> list[str]:
        """Drain and stop every table; waits for a tick in progress first. Idempotent. Returns the
        tables whose halt had not finished in time, each with what it was waiting for."""
        with self.lock:
            if self.state == "stopped":
                return []
            self.state = "stopping"
            try:
                return self.supervisor.shutdown(drain_timeout_seconds)
            finally:
                self.state = "stopped"
                if self.on_stopped is not None:
                    self.on_stopped()


class PipelineExists(Exception):
    pass


class FoldersOverlap(Exception):
    """A new pipeline's folder is, holds or lies inside the folder of one that runs."""

    def __init__(self, new: Path, other_id: str, other: Path) -> None:
        super().__init__(f"the checkpoint folder {new} overlaps {other}, the folder of pipeline {other_id!r} "
                         f"that runs in this daemon (same folder, or one inside the other, symbolic links "
                         f"resolved): give this pipeline another checkpoint_volume or pipeline_id")
        self.new, self.other_id, self.other = new, other_id, other


def overlaps(a: Path, b: Path) -> bool:
    """True when two folders are the same or one holds the other, symbolic links resolved."""
    ra, rb = a.expanduser().absolute().resolve(), b.expanduser().absolute().resolve()
    return ra == rb or ra in rb.parents or rb in ra.parents


class PipelineRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipelines: dict[str, PipelineHandle] = {}

    def add(self, handle: PipelineHandle) -> None:
        """Register a pipeline; :class:`PipelineExists` for a taken id, :class:`FoldersOverlap` when its
        folder overlaps a registered pipeline's (two supervisors would share state and checkpoints)."""
        with self._lock:
            if handle.pipeline_id in self._pipelines:
                raise PipelineExists(handle.pipeline_id)
            clash = self._overlapping(handle.directory)
            if clash is not None:
                raise FoldersOverlap(handle.directory, clash.pipeline_id, clash.directory)
            self._pipelines[handle.pipeline_id] = handle

    def _overlapping(self, directory: Path) -> PipelineHandle | None:
        return next((h for h in self._pipelines.values() if overlaps(directory, h.directory)), None)

    def overlapping(self, directory: Path) -> PipelineHandle | None:
        """The registered pipeline whose folder overlaps ``directory``, if any (a hint for a quick
        refusal: :meth:`add` is the authority)."""
        with self._lock:
            return self._overlapping(directory)

    def reserve_check(self, pipeline_id: str) -> bool:
        """True when no pipeline of that id runs (a hint: :meth:`add` is the authority)."""
        with self._lock:
            return pipeline_id not in self._pipelines

    def get(self, pipeline_id: str) -> PipelineHandle | None:
        with self._lock:
            return self._pipelines.get(pipeline_id)

    def remove(self, pipeline_id: str) -> PipelineHandle | None:
        with self._lock:
            return self._pipelines.pop(pipeline_id, None)

    def all(self) -> list[PipelineHandle]:
        with self._lock:
            return sorted(self._pipelines.values(), key=lambda h: (h.origin != "config", h.pipeline_id))

    def tick_all(self) -> None:
        """One supervisor tick per pipeline; a failing tick is logged and never stops the others."""
        for handle in self.all():
            try:
                handle.tick()
            except Exception:
                log.exception("pipeline %s: supervisor tick failed", handle.pipeline_id)

    def shutdown_all(self, drain_timeout_seconds: float) -> dict[str, list[str]]:
        """Drain every pipeline at once under one deadline; return, within it, the tables of each
        pipeline that had not stopped (see :func:`lakemirror.daemon.drain.drain`).

        A pipeline whose stop has not even begun by then (a tick in progress holds its lock, stuck
        in a call to a server that is gone) is reported with all its tables, and its ``on_stopped``
        is called here: a pipeline posted to the API gives its lease back all the same."""
        handles = {h.pipeline_id: h for h in self.all()}
        unfinished: dict[str, list[str]] = {}

        def stop(handle: PipelineHandle) -> None:
            late = handle.stop(drain_timeout_seconds)
            if late:
                unfinished[handle.pipeline_id] = late

        late = all_within({pid: partial(stop, h) for pid, h in handles.items()},
                          drain_timeout_seconds + 2 * SLACK_SECONDS, prefix="drain")
        for pid in late:
            handle = handles[pid]
            unfinished[pid] = ([f"{table} (its stop did not begin)" for table in _tables_of(handle)]
                               or ["its tables (its start had not ended)"])
            if handle.on_stopped is not None:
                handle.on_stopped()
        return {pid: unfinished[pid] for pid in handles if pid in unfinished}


def _tables_of(handle: PipelineHandle, seconds: float = 1.0) -> list[str]:
    """The tables of a pipeline whose stop did not begin, as its views list them (read within
    ``seconds``: a view reads the sources' positions again, and a drain must not wait on that)."""
    names: list[str] = []
    try:
        call_within(lambda: names.extend(v.table for v in handle.views()), seconds, f"views:{handle.pipeline_id}")
    except Exception as exc:  # noqa: BLE001 (the pipeline is then named without its tables)
        log.debug("pipeline %s: listing its tables: %s", handle.pipeline_id, exc)
    return list(names)


#: The file lakemirror writes into a pipeline folder it creates for a pipeline posted to the API:
#: only a folder holding it, naming that pipeline, is ever deleted through the API.
OWNER_MARKER = layout.OWNER_MARKER


def inside(path: str | Path, root: str | Path) -> bool:
    """Whether ``path`` is ``root`` or lies inside it, symbolic links resolved."""
    p, r = Path(path).expanduser().absolute().resolve(), Path(root).expanduser().absolute().resolve()
    return p == r or r in p.parents


def claim_folder(folder: Path, pipeline_id: str) -> bool:
    """Create ``folder`` (and its parents) with an :data:`OWNER_MARKER` naming ``pipeline_id``;
    False, creating and marking nothing, when it exists already (lakemirror did not make it now, so
    it is never lakemirror's to delete unless an earlier claim marked it)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir()
    except FileExistsError:
        return False
    marker = layout.owner_marker(folder)
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({"pipeline_id": pipeline_id, "created_by": "lakemirror", "created_at": time.time()}, out)
    return True


def release_folder(folder: Path) -> None:
    """Undo :func:`claim_folder` for a pipeline that did not start: remove the folder if it holds
    nothing but the marker."""
    try:
        if sorted(os.listdir(folder)) == [OWNER_MARKER]:
            layout.owner_marker(folder).unlink()
            folder.rmdir()
    except OSError as exc:
        log.warning("could not remove %s, made for a pipeline that did not start: %s", folder, exc)


def marked_for(folder: Path, pipeline_id: str) -> bool:
    """Whether ``folder`` holds lakemirror's :data:`OWNER_MARKER` (a regular file, not a link) naming
    ``pipeline_id``."""
    marker = layout.owner_marker(folder)
    try:
        if marker.is_symlink() or not marker.is_file() or marker.stat().st_size > 4096:
            return False
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("pipeline_id") == pipeline_id and data.get("created_by") == "lakemirror"


def checkpoint_dir_to_delete(checkpoint_volume: str, pipeline_id: str, protected: list[Path],
                             root: str | None = None) -> Path:
    """The directory ``DELETE …?cleanup_checkpoints=true`` may remove, or ValueError saying why not.

    Only ``<checkpoint_volume>/<pipeline_id>`` itself: a real directory (not a symlink) strictly
    inside the volume and inside the daemon's checkpoint ``root``, that lakemirror created for this
    pipeline (it holds :data:`OWNER_MARKER` naming it), holding no other running pipeline's
    directory and not inside one. Pure apart from reading the file system.
    """
    volume = Path(checkpoint_volume).expanduser().absolute()
    if not pipeline_id or pipeline_id in (".", "..") or "/" in pipeline_id or "\\" in pipeline_id:
        raise ValueError(f"refusing to delete checkpoints of a pipeline id like {pipeline_id!r}")
    target = volume / pipeline_id
    if target.is_symlink():
        raise ValueError(f"{target} is a symbolic link; delete it by hand if it is really this pipeline's")
    resolved, volume_root = target.resolve(), volume.resolve()
    if resolved == volume_root or volume_root not in resolved.parents:
        raise ValueError(f"{target} is not inside the checkpoint volume {volume}")
    if root is not None and (not inside(resolved, root) or resolved == Path(root).expanduser().absolute().resolve()):
        raise ValueError(f"{target} is not inside the daemon's checkpoint folder {root}")
    for other in protected:
        if overlaps(resolved, other):
            raise ValueError(f"{target} overlaps {other.expanduser().absolute().resolve()}, the directory of a "
                             f"pipeline that still runs")
    if not target.exists():
        return target  # nothing left to delete
    if not target.is_dir():
        raise ValueError(f"{target} is not a directory")
    if not marked_for(target, pipeline_id):
        raise ValueError(f"{target} was not created by lakemirror for pipeline {pipeline_id!r} (it has no "
                         f"{OWNER_MARKER} naming it); delete it by hand if it is really this pipeline's")
    return target
