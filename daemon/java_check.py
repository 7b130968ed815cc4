"""The Java the embedded Spark needs, checked without loading Spark or the settings: the command
line's light commands (``fetch-jars --check``, ``build-class-archive``) and a start's pre-flight both
check it, and neither should pay for importing PySpark first."""

from __future__ import annotations

import re
import shutil
import subprocess


class JavaMissing(RuntimeError):
    pass


def check_java(required_major: int = 17) -> str:
    """Return the Java version, or raise with what to install."""
    java = shutil.which("java")
    if java is None:
        raise JavaMissing(f"Java {required_major} is required and `java` is not on PATH. Install it "
                          f"(Debian: apt-get install openjdk-{required_major}-jre-headless) or set JAVA_HOME.")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise JavaMissing(f"could not read the Java version from: {out.strip()[:200]}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < required_major:
        raise JavaMissing(f"Java {major} found at {java}; Spark 4 needs Java {required_major} or newer.")
    return out.splitlines()[0] if out else str(major)
