"""scripts/setup.sh and the system packages it may install: the README lists every one, and
LAKEMIRROR_SKIP_SYSTEM_PACKAGES=1 keeps setup.sh from running the installer at all."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup.sh"
INSTALLER = ROOT / "scripts" / "install-services.sh"


def installed_packages() -> list[str]:
    """The Debian packages install-services.sh installs: the keys of its package -> tool map."""
    match = re.search(r"declare -A tool_of=\((.*?)\)\n", INSTALLER.read_text(), re.DOTALL)
    assert match, "install-services.sh no longer declares its packages as `declare -A tool_of=(...)`"
    return re.findall(r"\[([\w.+-]+)\]=", match.group(1))


def test_the_readme_setup_paragraph_lists_every_system_package_and_the_skip() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## The two commands")
    section = readme[start:readme.index("\n## ", start + 1)]
    packages = installed_packages()
    assert packages
    for package in packages:
        assert f"`{package}`" in section, f"README's setup paragraph does not name the package {package}"
    assert "apt-get" in section and "LAKEMIRROR_SKIP_SYSTEM_PACKAGES=1" in section


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("java") is None,
                    reason="setup.sh needs bash and java on PATH")
@pytest.mark.parametrize("skip", [True, False])
def test_setup_runs_the_installer_unless_told_to_skip_it(tmp_path: Path, skip: bool) -> None:
    # A copy of the project's shape in which everything setup.sh checks is already done (the venv,
    # its stamp, the jars), so that the step under test is the only one that acts. The installer is
    # replaced by one that records that it ran: the real one calls apt-get as root.
    (tmp_path / "scripts").mkdir()
    shutil.copy2(SETUP, tmp_path / "scripts" / "setup.sh")
    marker = tmp_path / "installer-ran"
    (tmp_path / "scripts" / "install-services.sh").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (tmp_path / "scripts" / "install-services.sh").chmod(0o755)
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    (tmp_path / "pyproject.toml").write_bytes(pyproject)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    (bin_dir / "lakemirror").write_text("#!/bin/sh\nexit 0\n")  # `fetch-jars --check`: jars cached
    (bin_dir / "lakemirror").chmod(0o755)
    (tmp_path / ".venv" / ".lakemirror-installed").write_text(hashlib.sha256(pyproject).hexdigest()[:16] + "\n")
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("LAKEMIRROR_SKIP_SYSTEM_PACKAGES", None)
    if skip:
        env["LAKEMIRROR_SKIP_SYSTEM_PACKAGES"] = "1"
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert marker.exists() is not skip
    if skip:
        assert "LAKEMIRROR_SKIP_SYSTEM_PACKAGES=1: not installing" in proc.stderr
