"""A real PostgreSQL → Debezium → Kafka stack on loopback, started by the project's own scripts.

``scripts/postgres.sh start … --logical`` (PostgreSQL 15, ``wal_level=logical``),
``scripts/kafka.sh`` (a single-node KRaft broker) and ``scripts/debezium.sh`` (Kafka Connect
standalone with Debezium's Postgres connector, JSON converter with schemas). Used by
``lakemirror demo --source debezium`` and the end-to-end test; every part listens on 127.0.0.1 and
keeps its files under one folder. Jars come from the local cache that ``scripts/setup.sh`` fills
(``scripts/kafka.sh fetch``, ``scripts/debezium.sh fetch``), so nothing is downloaded here once
set up.
"""

from __future__ import annotations

import json
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


class StackError(RuntimeError):
    """A part of the stack could not start; the message names the part and its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(args: Sequence[str], what: str, timeout: float = 600, env: dict[str, str] | None = None) -> None:
    import os

    if not Path(args[0]).is_file():
        raise StackError(f"{what}: {args[0]} is missing; the Debezium stack runs the scripts of a lakemirror "
                         f"source checkout: run it from one (`make demo`, `.venv/bin/lakemirror demo --source "
                         f"debezium`)")
    try:
        subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise StackError(f"{what} failed: {detail[-1] if detail else f'exit {exc.returncode}'}") from None
    except subprocess.TimeoutExpired:
        raise StackError(f"{what} did not finish in {timeout:.0f} s") from None


@dataclass
class DebeziumStack:
    """PostgreSQL, a Kafka broker and Kafka Connect with Debezium, under ``folder``."""

    folder: Path
    topic_prefix: str = "shop"
    database: str = "postgres"
    pg_port: int = field(default_factory=free_port)
    kafka_port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    connect_port: int = field(default_factory=free_port)
    started: list[str] = field(default_factory=list)
    #: The checkout's scripts/ folder the parts are started with.
    scripts: Path = SCRIPTS

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def topic_pattern(self) -> str:
        """Every topic of the connector: its tables' and its transaction markers'."""
        return self.topic_prefix.replace(".", "\\.") + "\\..*"

    def fetch(self) -> None:
        """Resolve the broker's and Connect's jars into the cache (a no-op once done)."""
        _run([str(self.scripts / "kafka.sh"), "fetch"], "scripts/kafka.sh fetch")
        _run([str(self.scripts / "debezium.sh"), "fetch"], "scripts/debezium.sh fetch")

    def start_postgres(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o755)  # the server runs as `postgres` when we are root
        _run([str(self.scripts / "postgres.sh"), "start", str(self.pg_port), str(self.folder / "pg"), "--logical"],
             "scripts/postgres.sh start --logical")
        self.started.append("postgres")

    def start_kafka(self) -> None:
        _run([str(self.scripts / "kafka.sh"), "start", str(self.folder / "kafka"), str(self.kafka_port),
              str(self.controller_port)], "scripts/kafka.sh start")
        self.started.append("kafka")

    def start_connect(self) -> None:
        _run([str(self.scripts / "debezium.sh"), "start", str(self.folder / "connect"), str(self.connect_port),
              self.bootstrap_servers], "scripts/debezium.sh start")
        self.started.append("connect")

    def start(self) -> None:
        """PostgreSQL, then the broker, then Connect (no connector yet: tables come first)."""
        self.fetch()
        self.start_postgres()
        self.start_kafka()
        self.start_connect()

    def register(self, tables: Sequence[str], name: str = "lakemirror", config: Mapping[str, str] | None = None) -> None:
        """Capture ``tables`` (``schema.table``): an initial snapshot, then the log; ``config`` adds to
        (or overrides) the connector's settings of scripts/debezium.sh."""
        _run([str(self.scripts / "debezium.sh"), "register", str(self.connect_port), name, str(self.pg_port),
              self.database, self.topic_prefix, ",".join(tables)], f"registering Debezium connector {name}",
             env={"DEBEZIUM_EXTRA": json.dumps(dict(config))} if config else None)

    def connect_sql(self) -> Any:
        """A psycopg connection (autocommit, UTC) to the captured database."""
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.pg_port, user="postgres", dbname=self.database,
                               autocommit=True, options="-c TimeZone=UTC")

    def stop(self) -> None:
        """Stop what was started, newest first; never raises."""
        for part in reversed(self.started):
            args = {"connect": [str(self.scripts / "debezium.sh"), "stop", str(self.folder / "connect")],
                    "kafka": [str(self.scripts / "kafka.sh"), "stop", str(self.folder / "kafka")],
                    "postgres": [str(self.scripts / "postgres.sh"), "stop", str(self.pg_port), str(self.folder / "pg")]}[part]
            subprocess.run(args, capture_output=True, timeout=120, check=False)
        self.started.clear()
