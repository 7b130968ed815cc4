"""Volume file copies on real stores: local folders and the session's S3 server (s3a://).

Thousands of small files locally; a few hundred through the S3 server (moto answers a request in a
few milliseconds: each copied file is one PUT and one GET to verify it). A crash mid-run, changes
between runs, deletions mirrored only when asked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest

from lakemirror.checkpoints.file_manifest import FileManifest
from lakemirror.file_store import FileInfo, FileStore, SimulatedCrash, digest, open_file_store
from lakemirror.sinks.batch.volumes import VolumeCopier, VolumeCopyOptions

pytestmark = pytest.mark.integration


def make_tree(root: Path, n: int) -> None:
    for i in range(n):
        folder = root / f"day={i % 7}" / f"part-{i % 13}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:05d}.json").write_bytes((f'{{"id": {i}}}\n' * (1 + i % 9)).encode())


def contents(store: FileStore) -> dict[str, str]:
    return {f.path: digest(store, f.path)[1] for f in store.list_files()}


class CrashAfter:
    """A store whose ``n+1``-th write kills the run (as a killed process would stop it)."""

    def __init__(self, inner: FileStore, n: int) -> None:
        self.inner, self.left = inner, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def root(self) -> str:
        return self.inner.root

    @property
    def consistent_reads(self) -> bool:
        return self.inner.consistent_reads

    def list_files(self) -> Iterator[FileInfo]:
        return self.inner.list_files()

    def write(self, path: str, chunks: Iterable[bytes]) -> None:
        if self.left <= 0:
            raise SimulatedCrash(path)
        self.left -= 1
        self.inner.write(path, chunks)


def test_local_folders_thousands_of_files_crash_and_changes(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 2500)
    source, target = open_file_store(str(tmp_path / "src")), open_file_store(str(tmp_path / "dst"))
    manifest = tmp_path / "manifest"
    options = VolumeCopyOptions(workers=4, flush_every_files=250, flush_every_seconds=1e9)
    with pytest.raises(SimulatedCrash):
        VolumeCopier(source, CrashAfter(target, 1000), FileManifest(manifest), options).run()  # type: ignore[arg-type]
    done = {f.path: f.mtime_ns for f in target.list_files()}
    assert 900 <= len(done) <= 1000

    result = VolumeCopier(source, target, FileManifest(manifest), options).run()
    assert result.copied == 2500 - len(done)
    assert {p: m for p, m in ((f.path, f.mtime_ns) for f in target.list_files()) if p in done} == done  # not rewritten
    assert contents(target) == contents(source)

    edited = tmp_path / "src" / "day=1" / "part-1" / "f00001.json"
    edited.write_bytes(b'{"id": 1, "edited": true}\n')
    os.utime(edited, ns=(edited.stat().st_atime_ns, edited.stat().st_mtime_ns + 5_000_000_000))
    (tmp_path / "src" / "new.json").write_bytes(b"{}")
    (tmp_path / "src" / "day=2" / "part-2" / "f00002.json").unlink()
    again = VolumeCopier(source, target, FileManifest(manifest), options).run()
    assert (again.copied, again.deleted, again.plan["kept_deleted"]) == (2, 0, 1)
    mirrored = VolumeCopier(source, target, FileManifest(manifest), VolumeCopyOptions(mirror_deletes=True)).run()
    assert (mirrored.copied, mirrored.deleted) == (0, 1)
    assert contents(target) == contents(source)
    assert not [p for p in (tmp_path / "dst").rglob("*") if ".lakemirror-partial-" in p.name]


def test_to_and_from_the_s3_server(s3_bucket: Any, tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 300)
    prefix = s3_bucket.fresh("volume")
    source = open_file_store(str(tmp_path / "src"))
    remote = open_file_store(prefix, s3_bucket.hadoop_conf)
    options = VolumeCopyOptions(workers=8, flush_every_files=50, flush_every_seconds=1e9)
    with pytest.raises(SimulatedCrash):
        VolumeCopier(source, CrashAfter(remote, 120), FileManifest(tmp_path / "m-up"), options).run()  # type: ignore[arg-type]
    up = VolumeCopier(source, remote, FileManifest(tmp_path / "m-up"), options).run()
    assert up.copied == 180 and up.copied + up.adopted <= 300
    assert contents(remote) == contents(source)

    (tmp_path / "src" / "day=0" / "part-0" / "f00000.json").write_bytes(b"changed between runs, longer")
    assert VolumeCopier(source, remote, FileManifest(tmp_path / "m-up"), options).run().copied == 1

    back = open_file_store(str(tmp_path / "back"))
    down = VolumeCopier(remote, back, FileManifest(tmp_path / "m-down"), options).run()
    assert down.copied == 300 and contents(back) == contents(source)
    assert VolumeCopier(remote, back, FileManifest(tmp_path / "m-down"), options).run().copied == 0


def test_lakemirror_replicate_copies_a_volume_and_audits_it(spark: Any, tmp_path: Path) -> None:
    from lakemirror import tables
    from lakemirror.daemon.context import ReplicateContext
    from lakemirror.daemon.settings.replicate import load_replicate_config
    from lakemirror.identifiers import TableName

    make_tree(tmp_path / "landing", 200)
    config = load_replicate_config(None, data={
        "catalogs": [{"name": "prod", "target_catalog": "dr"}], "checkpoint_volume": str(tmp_path / "cp"),
        "runtime": {"mode": "local", "warehouse": str(tmp_path / "lakehouse")},
        "volumes": [{"source": str(tmp_path / "landing"), "target": str(tmp_path / "dr-landing"),
                     "name": "dr.files.landing"}]})
    context = ReplicateContext(config).replace(spark=spark)
    assert context.run().ok
    assert contents(open_file_store(str(tmp_path / "dr-landing"))) == contents(open_file_store(str(tmp_path / "landing")))
    assert (tmp_path / "cp" / "replicate" / "volumes").is_dir()
    audit = context.catalog.locate(TableName.parse(config.effective_audit_table))
    [row] = tables.read(spark, audit).collect()
    assert (row["object_type"], row["object_name"], row["status"]) == ("volume", "landing", "success")
    assert '"copied": 200' in row["details"]
