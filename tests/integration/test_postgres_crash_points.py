"""The Postgres sink's crash points, with a real SIGKILL and a real server: a process killed inside
a batch's transaction (after the COPY into staging, or after the upsert and progress row but before
COMMIT) leaves nothing behind, and the batch applied again afterwards is applied exactly once.

The kill is the torture harness's hook (``LAKEMIRROR_TEST_KILL_AT``, daemon/context.py), inert unless
set; no Spark is needed: the batch is an Arrow table of change-feed rows, as foreachBatch gives it.
The whole daemon under kills is tests/e2e/test_postgres_torture.py.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.integration

PROGRAM = """
import sys
import pyarrow as pa
from lakemirror.daemon.context import crash_points_from_environment
from lakemirror.schema import Column
from lakemirror.sinks.postgres.executor import Connector, PostgresReplica, PostgresTarget
from lakemirror.sinks.postgres.plan import ReplicaTable

host, port, user, schema, batch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
target = PostgresTarget(host, port, "postgres", schema, user)
table = ReplicaTable(schema, "kv", ("id",), (Column("id", "bigint", False), Column("v", "string")))
replica = PostgresReplica(Connector(target), "crash-test", table, fault=crash_points_from_environment())
replica.prepare(True)
if batch == "bootstrap":
    replica.bootstrap(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}), 1, 1)
else:
    changes = pa.table({"id": pa.array([1, 2, 4], pa.int64()), "v": ["a2", None, "d"],
                        "_change_type": ["update_postimage", "delete", "insert"],
                        "_commit_version": pa.array([2, 2, 2], pa.int64()),
                        "_commit_timestamp": pa.array([0, 0, 0], pa.timestamp("us"))})
    result = replica.apply(changes, 1, int(batch))
    print("replayed" if result.replayed else "applied", result.counts.inserted, result.counts.updated,
          result.counts.deleted)
"""


def _run(postgres: Any, schema: str, batch: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({"LAKEMIRROR_TEST_KILL_AT": kill_at} if kill_at else {})}
    return subprocess.run([sys.executable, "-c", PROGRAM, postgres.host, str(postgres.port), postgres.user, schema,
                           batch], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("point", ["postgres_after_copy", "postgres_before_commit"])
def test_a_kill_inside_the_batch_transaction_loses_and_doubles_nothing(postgres: Any, point: str) -> None:
    if postgres.password:
        pytest.skip("the program below connects without a password (the script-managed server)")
    schema = f"crash_{uuid.uuid4().hex[:8]}"
    boot = _run(postgres, schema, "bootstrap")
    assert boot.returncode == 0, boot.stderr
    killed = _run(postgres, schema, "0", kill_at=point)
    assert killed.returncode == -9, f"not killed at {point}: {killed.returncode} {killed.stderr[-500:]}"

    def state() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        return (postgres.query(f"SELECT id, v FROM {schema}.kv ORDER BY id"),
                postgres.query(f"SELECT batch_id FROM {schema}.lakemirror_progress WHERE batch_id >= 0"),
                postgres.query(f"SELECT id FROM {schema}.kv__lm_tombstones"))

    assert state() == ([(1, "a"), (2, "b"), (3, "c")], [], []), "the killed transaction left something behind"
    again = _run(postgres, schema, "0")
    assert again.returncode == 0 and again.stdout.split() == ["applied", "1", "1", "1"], again.stdout + again.stderr
    assert state() == ([(1, "a2"), (3, "c"), (4, "d")], [(0,)], [(2,)])
    replay = _run(postgres, schema, "0")  # Spark replays the batch after a crash past COMMIT
    assert replay.returncode == 0 and replay.stdout.split() == ["replayed", "1", "1", "1"], replay.stdout
    assert state() == ([(1, "a2"), (3, "c"), (4, "d")], [(0,)], [(2,)])
