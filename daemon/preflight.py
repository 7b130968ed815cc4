"""What a runtime mode needs, checked before the daemon binds a port, writes a file or starts Spark.

A daemon that cannot run should say so in one line, with what to do, and leave nothing behind.
The checks here are cheap and side-effect free (imports, a version lookup, one TCP connect), and
every dependency is injected so unit tests can play a machine without pandas or a server that is
down. :func:`bind_failure` turns the ``OSError`` of binding the HTTP port into the same kind of line.
"""

from __future__ import annotations

import errno
import importlib
import importlib.metadata
import socket
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from lakemirror.errors import TerminalError
from lakemirror.secrets import redact


class StartupError(TerminalError):
    """The daemon cannot start; the message is one line naming the cause and the fix."""

    code = "startup"


@dataclass(frozen=True)
class Requirement:
    """A Python distribution a mode imports: the module it provides and the versions that work."""

    module: str
    distribution: str
    minimum: str | None = None
    below: str | None = None  # first version that does not work

    def spec(self) -> str:
        bounds = ",".join(b for b in (f">={self.minimum}" if self.minimum else "",
                                      f"<{self.below}" if self.below else "") if b)
        return f"{self.distribution}{bounds}"


#: What PySpark 4.2's Spark Connect client checks (``pyspark.sql.connect.utils.check_dependencies``).
CONNECT_REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("pandas", "pandas", "2.2.0", "3.0.0"),
    Requirement("pyarrow", "pyarrow", "18.0.0"),
    Requirement("grpc", "grpcio", "1.48.1"),
    Requirement("grpc_status", "grpcio-status", "1.48.1"),
    Requirement("google.rpc", "googleapis-common-protos", "1.56.4"),
    Requirement("zstandard", "zstandard", "0.25.0"),
)


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_requirements(requirements: Sequence[Requirement],
                         import_module: Callable[[str], Any] = importlib.import_module,
                         version_of: Callable[[str], str | None] = _version) -> list[str]:
    """Each requirement that does not import or has a version outside its range, as
    ``"pandas>=2.2.0,<3.0.0 (not installed)"``."""
    out = []
    for req in requirements:
        try:
            import_module(req.module)
        except ImportError as exc:
            out.append(f"{req.spec()} (not importable: {exc})" if version_of(req.distribution) else
                       f"{req.spec()} (not installed)")
            continue
        found = version_of(req.distribution)
        if found is None:
            continue  # importable from somewhere without metadata: let it be
        if req.minimum and _release(found) < _release(req.minimum) or req.below and _release(found) >= _release(req.below):
            out.append(f"{req.spec()} (found {found})")
    return out


def remote_address(spark_remote: str) -> tuple[str, int]:
    """``sc://host:port/;token=…`` -> (host, port); Spark Connect's default port is 15002."""
    parts = urlsplit(spark_remote.split(";", 1)[0])
    if parts.scheme != "sc" or not parts.hostname:
        raise StartupError(f"runtime.spark_remote {redact(spark_remote)!r} is not sc://host:port")
    try:
        port = parts.port or 15002
    except ValueError:
        raise StartupError(f"runtime.spark_remote {redact(spark_remote)!r}: the port is not a number "
                           f"from 1 to 65535") from None
    return parts.hostname, port


def _connect(address: tuple[str, int], timeout: float) -> None:
    socket.create_connection(address, timeout=timeout).close()


def check_connect(spark_remote: str, import_module: Callable[[str], Any] = importlib.import_module,
                  version_of: Callable[[str], str | None] = _version,
                  connect: Callable[[tuple[str, int], float], None] = _connect, timeout: float = 3.0) -> None:
    """Connect mode: the client packages import, and the server accepts a TCP connection."""
    missing = missing_requirements(CONNECT_REQUIREMENTS, import_module, version_of)
    if missing:
        specs = " ".join(f"'{m.split(' ', 1)[0]}'" for m in missing)
        raise StartupError(f"runtime.mode connect needs Spark Connect's client packages: {'; '.join(missing)}; "
                           f"install them (pip install {specs}) or use runtime.mode local")
    host, port = remote_address(spark_remote)
    try:
        connect((host, port), timeout)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__ if not isinstance(exc, socket.timeout) else \
            f"no answer within {timeout:g}s"
        raise StartupError(f"the Spark Connect server at {host}:{port} (runtime.spark_remote) is not reachable "
                           f"({reason}): start it, or point runtime.spark_remote at a running one") from None


#: How a daemon's HTTP port is chosen (a bind failure names it).
PORT_SETTING = "http.port (or --http-port)"
#: How the demo's is.
DEMO_PORT_SETTING = "the demo's port (`make demo PORT=…` or `lakemirror demo --port …`; 0: any free port)"


def bind_failure(host: str, port: int, exc: OSError, setting: str = PORT_SETTING) -> StartupError:
    """One line for an HTTP port that cannot be bound, naming how to choose another (``setting``)."""
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"port {port} on {host} is in use: set {setting} to a free port, "
                            f"or stop the other process")
    if exc.errno == errno.EACCES:
        return StartupError(f"port {port} on {host} needs privileges this user lacks: set {setting} "
                            f"to a port above 1023")
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return StartupError(f"cannot listen on {host!r}: it is not an address of this machine "
                            f"({exc.strerror or exc}); set http.host, e.g. 127.0.0.1 or 0.0.0.0")
    return StartupError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): check http.host and http.port")


def check_mode(runtime: Any) -> None:
    """The prerequisites of ``runtime.mode`` (a :class:`~lakemirror.daemon.settings.RuntimeSettings`):
    local: Java and Delta's jars; connect: the client packages and a reachable server; databricks:
    the job's own session, nothing to check. Raises :class:`StartupError`, ``JavaMissing`` or
    ``JarsMissing``, each one line."""
    if runtime.mode == "local":
        from lakemirror.daemon.jars import jar_paths
        from lakemirror.daemon.java_check import check_java

        check_java()
        jar_paths(runtime.jars_dir)
    elif runtime.mode == "connect":
        check_connect(runtime.spark_remote or "")
