"""The batch runner: retries with backoff, timeouts, isolation of failures, one audit row per attempt."""

from __future__ import annotations

import io
import threading

from lakemirror.checkpoints.audit import InMemoryAuditLog
from lakemirror.errors import NoUsableKey, TransientError
from lakemirror.identifiers import TableName
from lakemirror.supervisor.control.table_state import RestartPolicy
from lakemirror.supervisor.subtasks.batch_runner import BatchRunner, TableJob, TaskSettings, TextProgress


class FakeOps:
    """Scripted outcomes per (operation, table): a list consumed one per attempt."""

    def __init__(self, script):
        self.script = {k: list(v) for k, v in script.items()}
        self.calls = []
        self.cancelled = []
        self.release = threading.Event()
        self._lock = threading.Lock()

    def run(self, operation, job, tag):
        with self._lock:
            self.calls.append((operation, job.source.table))
            step = self.script[(operation, job.source.table)].pop(0)
        if step == "hang":
            self.release.wait(5)
            return {}
        if isinstance(step, BaseException):
            raise step
        return step

    def cancel(self, tag):
        self.cancelled.append(tag)
        self.release.set()


def job(table, **kw):
    settings = TaskSettings(**{"operations": ("clone",), "max_attempts": 3,
                               "backoff": RestartPolicy(1.0, 10.0, 2.0, 0.5),
                               "config": {"http": {"auth_token": "s3cret"}}, **kw})
    return TableJob(TableName("prod", "s", table), TableName("dr", "s", table), settings)


def runner(ops, audit, sleeps, out=None):
    return BatchRunner(ops, audit, run_id="run1", execution_user="me", max_workers=2,
                       progress=TextProgress(out or io.StringIO(), tty=False),
                       sleep=sleeps.append, rand=lambda: 1.0, cancel_grace_seconds=5)


def test_retries_with_backoff_and_one_audit_row_per_attempt():
    ops = FakeOps({("clone", "a"): [TransientError("blip"), RuntimeError("boom"), {"mode": "full"}],
                   ("clone", "b"): [{"mode": "noop"}]})
    audit, sleeps, out = InMemoryAuditLog(), [], io.StringIO()
    summary = runner(ops, audit, sleeps, out).run([job("a"), job("b")])
    assert summary.ok
    a_rows = [r for r in audit.records if r.object_name == "a"]
    assert [(r.attempt_number, r.status, r.max_attempts) for r in a_rows] == [(1, "failed", 3), (2, "failed", 3),
                                                                                (3, "success", 3)]
    assert a_rows[0].error_message.endswith("blip") and a_rows[2].error_message is None
    assert all(r.operation_type == "replication" and r.execution_user == "me" and r.run_id == "run1"
               for r in audit.records)
    assert "s3cret" not in a_rows[0].config_details and "**********" in a_rows[0].config_details
    assert sleeps == [0.5, 1.0]  # base 1 then 2, each shortened by the jitter (rand = 1.0 -> 50 %)
    text = out.getvalue()
    assert "2 operations to run" in text and "failed, will retry" in text and "[2/2]" in text


def test_a_terminal_error_is_not_retried_and_never_stops_the_others():
    ops = FakeOps({("clone", "a"): [NoUsableKey("no key", table="a")], ("clone", "b"): [{}],
                   ("reconcile", "b"): [RuntimeError("x"), RuntimeError("y"), RuntimeError("z")]})
    audit, sleeps = InMemoryAuditLog(), []
    summary = runner(ops, audit, sleeps).run([job("a"), job("b", operations=("clone", "reconcile"))])
    assert not summary.ok
    assert [(o.operation, o.job.source.table, o.attempts) for o in summary.failed] == [("clone", "a", 1),
                                                                                       ("reconcile", "b", 3)]
    assert ("clone", "b") in ops.calls
    assert [r.status for r in audit.records if r.object_name == "b"] == ["success", "failed", "failed", "failed"]
    assert [r.operation_type for r in audit.records if r.object_name == "b"][-1] == "reconciliation"


def test_an_attempt_past_its_timeout_is_cancelled_and_recorded():
    ops = FakeOps({("clone", "slow"): ["hang", {"mode": "full"}]})
    audit, sleeps = InMemoryAuditLog(), []
    summary = runner(ops, audit, sleeps).run([job("slow", timeout_seconds=0.2)])
    assert summary.ok and len(ops.cancelled) == 1
    first = audit.records[0]
    assert first.status == "failed" and "timed out after 0.2 s" in first.error_message
    assert audit.records[1].status == "success"
