"""``lakemirror replicate`` copying a volume of thousands of files, SIGKILLed in the middle (a real
process, killed from outside once part of the copy is recorded), then run again: the second run copies
only the files the first did not finish, writes no finished file again, and the target equals the
source file for file."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FILES = 4000


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_killed_copy_resumes_without_writing_a_finished_file_again(tmp_path: Path) -> None:
    src, dst = tmp_path / "landing", tmp_path / "dr-landing"
    for i in range(FILES):
        folder = src / f"d{i % 20}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:05d}.json").write_bytes(f'{{"id": {i}, "pad": "{"x" * (i % 300)}"}}\n'.encode())
    config = tmp_path / "replicate.yaml"
    config.write_text(yaml.safe_dump({
        "catalogs": [{"name": "prod", "target_catalog": "dr"}], "checkpoint_volume": str(tmp_path / "cp"),
        "runtime": {"mode": "local", "warehouse": str(tmp_path / "lakehouse"), "shuffle_partitions": 2},
        "volumes": [{"source": str(src), "target": str(dst), "name": "dr.files.landing",
                     "volume_files": {"workers": 2, "flush_every_files": 100, "flush_every_seconds": 60}}]}))
    manifest = tmp_path / "cp" / "replicate" / "volumes"
    log = (tmp_path / "run.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "lakemirror.daemon.cli", "replicate", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 600
    while time.time() < deadline and len(list(manifest.rglob("segment-*.jsonl"))) < 3:
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    done_before = {p: p.stat().st_mtime_ns for p in dst.rglob("*.json")}
    assert 300 <= len(done_before) < FILES, len(done_before)  # killed in the middle

    again = subprocess.run([sys.executable, "-m", "lakemirror.daemon.cli", "replicate", str(config)],
                           stdout=log, stderr=subprocess.STDOUT, timeout=900)
    assert again.returncode == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert tree(dst) == tree(src)
    rewritten = [p for p, mtime in done_before.items() if p.stat().st_mtime_ns != mtime]
    assert rewritten == [], f"{len(rewritten)} finished files written again"
    assert not [p for p in dst.rglob("*") if ".lakemirror-partial-" in p.name]
