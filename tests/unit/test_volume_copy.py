"""Volume file copies on the in-memory twins: the pure planner, the manifest, and the copier's
incremental, verified, resumable behaviour (thousands of files, a crash mid-run, changes between runs)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from lakemirror.checkpoints.file_manifest import CorruptManifest, FileManifest, InMemoryManifest, ManifestEntry
from lakemirror.file_store import FileInfo, InMemoryFileStore, SimulatedCrash
from lakemirror.sinks.batch.volume_plan import plan_copy
from lakemirror.sinks.batch.volumes import VolumeCopier, VolumeCopyIncomplete, VolumeCopyOptions


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def entry(path: str, size: int, mtime: int, target_mtime: int, checksum: str = "c") -> ManifestEntry:
    return ManifestEntry(path, size, mtime, checksum, target_mtime, 0.0)


# -- the planner --------------------------------------------------------------------------------

def test_plan_new_changed_unchanged_and_target_drift() -> None:
    source = [FileInfo("a", 1, 10), FileInfo("b", 2, 20), FileInfo("c", 3, 30), FileInfo("d", 4, 40),
              FileInfo("e", 5, 50), FileInfo("f", 6, 60)]
    target = [FileInfo("b", 2, 21), FileInfo("c", 3, 31), FileInfo("e", 5, 99), FileInfo("f", 6, 7)]
    manifest = {"b": entry("b", 2, 20, 21), "c": entry("c", 3, 29, 31), "d": entry("d", 4, 40, 41),
                "e": entry("e", 5, 50, 51)}
    plan = plan_copy(source, target, manifest)
    reasons = {t.source.path: t.reason for t in plan.tasks}
    assert reasons == {"a": "new", "c": "changed", "d": "target_missing", "e": "target_changed", "f": "verify"}
    assert plan.unchanged == 1  # b
    assert [t.source.path for t in plan.tasks] == ["f", "e", "d", "c", "a"]  # largest first


def test_plan_checksum_mode_verifies_every_known_file() -> None:
    plan = plan_copy([FileInfo("a", 1, 10)], [FileInfo("a", 1, 11)], {"a": entry("a", 1, 10, 11)},
                     compare="checksum")
    assert [(t.source.path, t.reason) for t in plan.tasks] == [("a", "verify")]


def test_plan_deletions_only_when_mirrored_and_only_our_own_copies() -> None:
    target = [FileInfo("gone", 1, 11), FileInfo("edited", 9, 99)]
    manifest = {"gone": entry("gone", 1, 10, 11), "edited": entry("edited", 1, 10, 11),
                "absent": entry("absent", 1, 10, 11)}
    kept = plan_copy([], target, manifest)
    assert kept.deletes == () and kept.forget == () and kept.kept_deleted == ("edited", "gone")
    mirrored = plan_copy([], target, manifest, mirror_deletes=True)
    assert mirrored.deletes == ("gone",)
    assert mirrored.forget == ("absent", "edited", "gone")
    assert mirrored.kept_deleted == ("edited",)  # changed in the target since the copy: never deleted


# -- the manifest -------------------------------------------------------------------------------

def test_file_manifest_segments_forget_and_compact(tmp_path: Path) -> None:
    m = FileManifest(tmp_path / "m")
    assert m.load() == {}
    m.record([entry("a", 1, 1, 1), entry("b", 2, 2, 2)])
    m.record([entry("a", 3, 3, 3)], forgotten=["b"])
    again = FileManifest(tmp_path / "m")
    assert again.load() == {"a": entry("a", 3, 3, 3)}
    again.compact()
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["snapshot.json"]
    again.record([entry("c", 1, 1, 1)])
    assert set(FileManifest(tmp_path / "m").load()) == {"a", "c"}


def test_file_manifest_refuses_a_damaged_file_naming_it(tmp_path: Path) -> None:
    m = FileManifest(tmp_path)
    m.record([entry("a", 1, 1, 1)])
    seg = next(tmp_path.glob("segment-*.jsonl"))
    seg.write_text("{not json\n")
    with pytest.raises(CorruptManifest, match="segment-000000000000.jsonl, line 1"):
        FileManifest(tmp_path).load()


# -- the copier ---------------------------------------------------------------------------------

def stores(n: int, clock: Clock) -> tuple[InMemoryFileStore, InMemoryFileStore]:
    source = InMemoryFileStore({f"d{i % 17}/f{i:05d}.bin": f"payload {i}".encode() * (1 + i % 5) for i in range(n)},
                               clock=clock, name="src")
    return source, InMemoryFileStore(clock=clock, name="dst")


def same(source: InMemoryFileStore, target: InMemoryFileStore) -> bool:
    return {p: d for p, (d, _) in source.files.items()} == {p: d for p, (d, _) in target.files.items()}


def copier(source: InMemoryFileStore, target: InMemoryFileStore, manifest: object, clock: Clock,
           **options: object) -> VolumeCopier:
    return VolumeCopier(source, target, manifest, VolumeCopyOptions(**{"workers": 4, **options}),  # type: ignore[arg-type]
                        clock=clock, sleep=lambda s: None)


def test_thousands_of_files_copied_once_then_nothing() -> None:
    clock = Clock()
    source, target = stores(3000, clock)
    manifest = InMemoryManifest()
    first = copier(source, target, manifest, clock).run()
    assert first.copied == 3000 and same(source, target)
    assert first.copied_bytes == sum(len(d) for d, _ in source.files.values())
    writes, reads = target.writes, source.reads
    second = copier(source, target, manifest, clock).run()
    assert second.copied == 0 and second.plan["unchanged"] == 3000
    assert target.writes == writes and source.reads == reads  # listings only: no file read or written


def test_files_changed_between_runs_are_copied_again_and_only_they() -> None:
    clock = Clock()
    source, target = stores(500, clock)
    manifest = InMemoryManifest()
    copier(source, target, manifest, clock).run()
    source.put("d1/f00001.bin", b"edited, longer than before")
    source.put("d2/f00002.bin", b"same len!")            # same size as... any: the mtime changed
    source.put("new/added.bin", b"a new file")
    target.delete("d3/f00003.bin")                      # lost in the target
    target.put("d4/f00004.bin", b"tampered")            # changed in the target
    writes = target.writes
    result = copier(source, target, manifest, clock).run()
    assert result.plan["changed"] == 2 and result.plan["new"] == 1
    assert result.plan["target_missing"] == 1 and result.plan["target_changed"] == 1
    assert result.copied == 5 and target.writes - writes == 5 and same(source, target)


def test_a_crash_mid_run_resumes_without_copying_finished_files_again(tmp_path: Path) -> None:
    clock = Clock()
    source, target = stores(2000, clock)
    manifest = FileManifest(tmp_path / "manifest")
    target.crash_after_writes = 1200
    with pytest.raises(SimulatedCrash):
        copier(source, target, manifest, clock, workers=1, flush_every_files=100, flush_every_seconds=1e9).run()
    recorded = FileManifest(tmp_path / "manifest").load()
    assert 1100 <= len(recorded) <= 1200 and len(target.files) == 1200  # some finished copies not yet recorded
    target.crash_after_writes = None
    writes = target.writes
    result = copier(source, target, FileManifest(tmp_path / "manifest"), clock).run()
    assert result.copied == 800 and target.writes - writes == 800  # no finished file written again
    assert result.adopted == 1200 - len(recorded)                  # verified by checksum, adopted
    assert same(source, target) and len(FileManifest(tmp_path / "manifest").load()) == 2000


def test_a_copy_that_does_not_verify_is_retried_and_a_failing_file_never_stops_the_others() -> None:
    clock = Clock()
    source, target = stores(50, clock)
    target.corrupt_writes["d1/f00001.bin"] = 1     # first copy stores other bytes: caught, retried
    target.fail_writes["d2/f00002.bin"] = 99       # never succeeds
    manifest = InMemoryManifest()
    with pytest.raises(VolumeCopyIncomplete) as caught:
        copier(source, target, manifest, clock, file_attempts=3).run()
    details = caught.value.details
    assert details["copied"] == 49 and details["failed"] == 1 and details["retried"] == 3
    assert details["failed_files"][0]["path"] == "d2/f00002.bin" and details["failed_files"][0]["attempts"] == 3
    assert target.data("d1/f00001.bin") == source.data("d1/f00001.bin")
    assert "d2/f00002.bin" not in manifest.load()
    target.fail_writes.clear()
    result = copier(source, target, manifest, clock).run()  # the runner's retry: only the missing file
    assert result.copied == 1 and same(source, target)


def test_deletions_are_mirrored_only_when_configured() -> None:
    clock = Clock()
    source, target = stores(20, clock)
    manifest = InMemoryManifest()
    copier(source, target, manifest, clock).run()
    source.delete("d1/f00001.bin")
    kept = copier(source, target, manifest, clock).run()
    assert kept.deleted == 0 and "d1/f00001.bin" in target.files and kept.plan["kept_deleted"] == 1
    mirrored = copier(source, target, manifest, clock, mirror_deletes=True).run()
    assert mirrored.deleted == 1 and same(source, target) and "d1/f00001.bin" not in manifest.load()


def test_checksum_mode_finds_a_change_that_kept_size_and_time() -> None:
    clock = Clock()
    source = InMemoryFileStore(clock=clock)
    source.put("a", b"12345", mtime_ns=7)
    target = InMemoryFileStore(clock=clock)
    manifest = InMemoryManifest()
    copier(source, target, manifest, clock).run()
    source.put("a", b"54321", mtime_ns=7)
    assert copier(source, target, manifest, clock).run().copied == 0  # size and time alone: unseen
    result = copier(source, target, manifest, clock, compare="checksum").run()
    assert result.copied == 1 and target.data("a") == b"54321"
    assert manifest.load()["a"].checksum == hashlib.sha256(b"54321").hexdigest()


def test_a_cancelled_run_starts_no_more_files_and_says_so() -> None:
    clock = Clock()
    source, target = stores(100, clock)
    calls = [0]

    def cancelled() -> bool:
        calls[0] += 1
        return calls[0] > 10

    run = VolumeCopier(source, target, InMemoryManifest(), VolumeCopyOptions(workers=1), clock=clock,
                       sleep=lambda s: None, cancelled=cancelled)
    with pytest.raises(VolumeCopyIncomplete, match="90 not started"):
        run.run()
    assert len(target.files) == 10
