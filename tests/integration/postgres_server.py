"""A real PostgreSQL for the Postgres sink's tests, started once per test session.

testcontainers' ``PostgresContainer`` when a Docker engine answers; otherwise the project's own
``scripts/postgres.sh`` (PostgreSQL 15 from Debian, installed by scripts/install-services.sh) on a
free loopback port. Skips, saying why, only when neither can run.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "postgres.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """Where the server listens, and (script-managed only) stop/start to restart it mid-stream."""

    def __init__(self, host: str, port: int, user: str, password: str | None, database: str,
                 data_dir: Path | None = None) -> None:
        self.host, self.port, self.user, self.password, self.database = host, port, user, password, database
        self.data_dir = data_dir

    @property
    def restartable(self) -> bool:
        return self.data_dir is not None

    def _script(self, action: str) -> None:
        assert self.data_dir is not None
        subprocess.run([str(SCRIPT), action, str(self.port), str(self.data_dir)], check=True,
                       capture_output=True, timeout=120)

    def stop(self) -> None:
        self._script("stop")

    def start(self) -> None:
        self._script("start")

    def destination(self, schema: str, **extra: Any) -> dict[str, Any]:
        """The ``destination:`` setting of a pipeline writing to this server."""
        out: dict[str, Any] = {"kind": "postgres", "host": self.host, "port": self.port, "database": self.database,
                               "schema": schema, "user": self.user, **extra}
        if self.password:
            out["password"] = self.password
        return out

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                               dbname=self.database, autocommit=True, options="-c TimeZone=UTC")

    def execute(self, statement: Any) -> None:
        with self.connect() as conn:
            conn.execute(statement)

    def query(self, statement: Any, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return conn.execute(statement, params).fetchall()


def _docker_running() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001 (no client, no engine: use the script)
        return False


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    if _docker_running():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15", driver=None) as pg:
            yield PostgresServer(pg.get_container_host_ip(), int(pg.get_exposed_port(5432)), pg.username,
                                 pg.password, pg.dbname)
        return
    if shutil.which("bash") is None or not SCRIPT.exists():
        pytest.skip("no Docker engine and no bash to run scripts/postgres.sh")
    root = Path(tempfile.mkdtemp(prefix="lakemirror-pg-"))
    root.chmod(0o755)
    server = PostgresServer("127.0.0.1", _free_port(), "postgres", None, "postgres", root / "data")
    try:
        server.start()
    except subprocess.CalledProcessError as exc:
        pytest.skip("no Docker engine, and scripts/postgres.sh could not start PostgreSQL "
                    f"(run scripts/install-services.sh): {exc.stderr.decode(errors='replace').strip()[-300:]}")
    try:
        yield server
    finally:
        subprocess.run([str(SCRIPT), "stop", str(server.port), str(server.data_dir)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
