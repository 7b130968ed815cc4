"""What a volume copy must do, decided from listings and the manifest alone. Pure.

Inputs: the source's files, the target's files (path, size, modification time) and the manifest
of verified copies (:class:`~lakemirror.checkpoints.file_manifest.ManifestEntry`). Per source file:

- **new**: not in the manifest and not in the target: copy it;
- **verify**: not in the manifest, but the target has a file of the same size (a copy finished
  just before a crash, before its manifest entry was recorded; or a target seeded by other
  means): compare checksums on both sides; adopt it if equal, copy it otherwise. A finished copy
  is never written again;
- **changed**: in the manifest, but the source's size or modification time differs: copy it;
- **target_missing** / **target_changed**: in the manifest, but the target file is gone, or its
  size or modification time is not what the copy left: copy it again;
- with ``compare="checksum"``, a file otherwise unchanged is **verify** as well: its source
  checksum is compared with the manifest's (for stores whose modification times cannot be trusted);
- otherwise **unchanged**: nothing to do.

A manifest entry whose source file is gone is a deletion: with ``mirror_deletes`` the target file
is deleted if it is still the copy this run's predecessors wrote (same size and modification time
as the manifest says; a file changed in the target since is kept) and the entry forgotten; without
it the target file is kept and counted. Files are planned largest first, so a parallel
copy does not end on one big file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

from lakemirror.checkpoints.file_manifest import ManifestEntry
from lakemirror.file_store import FileInfo

Reason = Literal["new", "verify", "changed", "target_missing", "target_changed"]
Compare = Literal["size_mtime", "checksum"]


@dataclass(frozen=True)
class FileTask:
    """One source file to copy or to verify, and why."""

    source: FileInfo
    reason: Reason

    @property
    def verify_first(self) -> bool:
        """Checksums are compared before anything is written (a copy follows only if they differ)."""
        return self.reason == "verify"


@dataclass(frozen=True)
class CopyPlan:
    tasks: tuple[FileTask, ...]
    deletes: tuple[str, ...]        # target files to delete (mirrored deletions)
    forget: tuple[str, ...]         # manifest entries dropped once those deletions are done
    kept_deleted: tuple[str, ...]   # source files gone whose copies are kept (mirror_deletes off)
    unchanged: int
    source_files: int
    source_bytes: int

    def count(self, reason: Reason) -> int:
        return sum(1 for t in self.tasks if t.reason == reason)

    def summary(self) -> dict[str, int]:
        out = {r: self.count(r) for r in ("new", "verify", "changed", "target_missing", "target_changed")}
        return {**out, "unchanged": self.unchanged, "deletes": len(self.deletes),
                "kept_deleted": len(self.kept_deleted), "source_files": self.source_files,
                "source_bytes": self.source_bytes}


def plan_copy(source: Iterable[FileInfo], target: Iterable[FileInfo], manifest: Mapping[str, ManifestEntry],
              *, mirror_deletes: bool = False, compare: Compare = "size_mtime") -> CopyPlan:
    """The plan for one run (see the module docstring)."""
    sources = {f.path: f for f in source}
    targets = {f.path: f for f in target}
    tasks: list[FileTask] = []
    unchanged = 0
    for path, src in sources.items():
        entry = manifest.get(path)
        tgt = targets.get(path)
        reason: Reason | None
        if entry is None:
            reason = "verify" if tgt is not None and tgt.size == src.size else "new"
        elif (src.size, src.mtime_ns) != (entry.size, entry.mtime_ns):
            reason = "changed"
        elif tgt is None:
            reason = "target_missing"
        elif (tgt.size, tgt.mtime_ns) != (entry.size, entry.target_mtime_ns):
            reason = "target_changed"
        elif compare == "checksum":
            reason = "verify"
        else:
            reason = None
        if reason is None:
            unchanged += 1
        else:
            tasks.append(FileTask(src, reason))
    gone = sorted(p for p in manifest if p not in sources)
    ours = [p for p in gone if (t := targets.get(p)) is not None
            and (t.size, t.mtime_ns) == (manifest[p].size, manifest[p].target_mtime_ns)]
    tasks.sort(key=lambda t: (-t.source.size, t.source.path))
    return CopyPlan(tasks=tuple(tasks),
                    deletes=tuple(ours) if mirror_deletes else (),
                    forget=tuple(gone) if mirror_deletes else (),
                    kept_deleted=tuple(p for p in gone if p in targets and (not mirror_deletes or p not in ours)),
                    unchanged=unchanged,
                    source_files=len(sources), source_bytes=sum(f.size for f in sources.values()))
