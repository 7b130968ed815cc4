"""``volume_files`` in ``lakemirror replicate``: configuration refusals, planning of volume jobs, and
the batch runner copying volumes through the real operation on in-memory stores (retries with
backoff, one failing volume never stopping the others, every attempt in the audit table)."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.checkpoints.audit import FAILED, SUCCESS, InMemoryAuditLog
from lakemirror.checkpoints.file_manifest import InMemoryManifest
from lakemirror.daemon.settings.replicate import cli_overrides, load_replicate_config
from lakemirror.daemon.settings.runtime_spec import plan
from lakemirror.errors import ConfigError
from lakemirror.file_store import InMemoryFileStore
from lakemirror.sinks.batch.volumes import VolumeOperations
from lakemirror.sources.catalog import InMemoryDiscovery
from lakemirror.supervisor.subtasks.batch_runner import BatchRunner

BASE: dict[str, Any] = {"catalogs": [{"name": "prod", "target_catalog": "dr"}], "checkpoint_volume": "/cp"}


def problems(data: dict[str, Any], cli: Any = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_replicate_config(None, cli, data=data)
    return caught.value.problems


@pytest.mark.parametrize("entry, where, says", [
    ({"source": "rel/dir", "target": "/t", "name": "a.b.c"}, "volumes[0].source", "absolute path"),
    ({"source": "/s", "target": "gs://b/x", "name": "a.b.c"}, "volumes[0].target", "not gs://"),
    ({"source": "/s", "target": "/data/t"}, "volumes[0]", "name is required"),
    ({"source": "/s", "target": "/s/sub", "name": "a.b.c"}, "volumes[0]", "overlap"),
    ({"source": "/s", "target": "/t", "name": "two.parts"}, "volumes[0].name", "three-part"),
    ({"source": "/s", "target": "/t", "name": "a.b.c", "volume_files": {"workers": 0}},
     "volumes[0].volume_files.workers", "greater than or equal to 1"),
    ({"source": "/s", "target": "/t", "name": "a.b.c", "volume_files": {"compare": "md5"}},
     "volumes[0].volume_files.compare", "size_mtime"),
])
def test_bad_volume_entries_are_refused_naming_the_field(entry: dict[str, Any], where: str, says: str) -> None:
    found = problems({**BASE, "volumes": [entry]})
    assert any(loc.endswith(where) and says in msg for loc, msg in found), found


def test_repeated_names_and_a_missing_checkpoint_volume_are_refused() -> None:
    twice = [{"source": "/a", "target": "/Volumes/dr/s/v"}, {"source": "/b", "target": "/x", "name": "dr.s.v"}]
    assert any("repeat" in msg for _, msg in problems({**BASE, "volumes": twice}))
    no_cp = {"catalogs": BASE["catalogs"], "volumes": [{"source": "/a", "target": "/Volumes/dr/s/v"}]}
    assert any(loc.endswith("checkpoint_volume") and "volume_files" in msg for loc, msg in problems(no_cp))


def test_volume_jobs_planned_from_catalogs_and_entries() -> None:
    cfg = load_replicate_config(None, data={
        **BASE, "operations": ["clone"],
        "catalogs": [{"name": "prod", "target_catalog": "dr",
                      "schemas": [{"name": "files", "operations": ["clone", "volume_files"],
                                   "volume_files": {"workers": 3}}]}],
        "volumes": [{"source": "s3a://landing/raw", "target": "/data/raw", "name": "dr.landing.raw",
                     "volume_files": {"mirror_deletes": True}}]})
    discovery = InMemoryDiscovery({"prod": {"files": ["t1"], "sales": ["t2"]}},
                                  volumes={"prod": {"files": ["images"], "sales": ["exports"]}})
    jobs = plan(cfg, discovery)
    summary = [(str(j.source), str(j.target), j.object_type, j.settings.operations) for j in jobs]
    assert summary == [
        ("prod.files.t1", "dr.files.t1", "table", ("clone",)),            # volume_files is not a table's
        ("prod.files.images", "dr.files.images", "volume", ("volume_files",)),
        ("prod.sales.t2", "dr.sales.t2", "table", ("clone",)),            # sales does not copy its volumes
        ("dr.landing.raw", "dr.landing.raw", "volume", ("volume_files",)),
    ]
    images = jobs[1].settings.options["volume_files"]
    assert (images["source_path"], images["target_path"], images["workers"]) == (
        "/Volumes/prod/files/images", "/Volumes/dr/files/images", 3)
    raw = jobs[3].settings.options["volume_files"]
    assert (raw["source_path"], raw["mirror_deletes"], raw["workers"]) == ("s3a://landing/raw", True, 8)
    only_clone = load_replicate_config(None, cli_overrides(None, None, "clone", None), data={
        **BASE, "volumes": [{"source": "/a", "target": "/Volumes/dr/s/v"}]})
    assert [j.object_type for j in plan(only_clone, discovery)] == ["table", "table"]


class Stores:
    """``open_store`` for the operation: named in-memory stores."""

    def __init__(self, **stores: InMemoryFileStore) -> None:
        self.stores = stores
        self.confs: list[dict[str, str]] = []

    def __call__(self, location: str, conf: Any) -> InMemoryFileStore:
        self.confs.append(dict(conf))
        return self.stores[location]


def test_the_runner_copies_volumes_retrying_only_what_failed_and_audits_each_attempt() -> None:
    good_src = InMemoryFileStore({f"f{i}": b"x" * i for i in range(30)})
    bad_src = InMemoryFileStore({"a": b"1", "b": b"2"})
    stores = Stores(**{"/good": good_src, "/good-dst": InMemoryFileStore(), "/bad": bad_src,
                       "s3a://bucket/bad-dst": InMemoryFileStore()})
    stores.stores["s3a://bucket/bad-dst"].fail_writes["b"] = 4  # 2 attempts x 2 file attempts: fails, then works
    cfg = load_replicate_config(None, data={
        **BASE, "retry": {"max_attempts": 3, "base_delay_seconds": 1, "jitter": 0},
        "volume_files": {"file_attempts": 2},
        "volumes": [{"source": "/good", "target": "/good-dst", "name": "dr.v.good"},
                    {"source": "/bad", "target": "s3a://bucket/bad-dst", "name": "dr.v.bad"}]})
    manifests: dict[str, InMemoryManifest] = {}
    ops = VolumeOperations("/cp", lambda: {"fs.s3a.endpoint": "http://x"}, sleep=lambda s: None, open_store=stores)
    ops.manifest_of = lambda job: manifests.setdefault(str(job.target), InMemoryManifest())  # type: ignore[method-assign]
    audit, sleeps = InMemoryAuditLog(), []
    summary = BatchRunner(ops, audit, run_id="r", execution_user="me", sleep=sleeps.append,
                          rand=lambda: 0.0).run(plan(cfg, InMemoryDiscovery({})))
    assert summary.ok
    rows = [(r.object_name, r.object_type, r.status, r.attempt_number) for r in audit.records]
    assert sorted(rows) == [("bad", "volume", FAILED, 1), ("bad", "volume", FAILED, 2),
                            ("bad", "volume", SUCCESS, 3), ("good", "volume", SUCCESS, 1)]
    assert sleeps == [1.0, 2.0]  # the volume's backoff, between its attempts
    assert stores.stores["s3a://bucket/bad-dst"].data("b") == b"2"
    assert len(manifests["dr.v.good"].load()) == 30
    assert stores.stores["s3a://bucket/bad-dst"].writes == 1 + 4 + 1  # "a" once; "b" 4 failures, then once
    assert {"fs.s3a.endpoint": "http://x"} in stores.confs and {} in stores.confs  # S3 settings only for s3a://
    first_bad = next(r for r in audit.records if r.object_name == "bad")
    assert "b" in (first_bad.error_message or "") and '"failed_files"' in (first_bad.details or "")
