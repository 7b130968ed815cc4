"""The Spark Connect batch function: picklable by plain pickle (no closure over the runner), and its
SQL keeps the planner's winner-per-key rule and clauses."""

from __future__ import annotations

from datetime import datetime

import pickle

from lakemirror.schema import Column
from lakemirror.sinks.merge.connect_apply import ConnectBatchJob, apply_batch, latest_changes_sql, merge_sql
from lakemirror.sinks.merge.planner import plan_merge


def _job(outcome_dir: str = "/c/lakemirror_outcomes") -> ConnectBatchJob:
    plan = plan_merge((Column("id", "bigint", False), Column("v", "string", True)), ["id"])
    return ConnectBatchJob(target_sql="delta.`/r`", plan=plan, app_id="lakemirror/p/src__s__t/e1",
                           outcome_dir=outcome_dir)


def test_the_bound_batch_function_pickles_by_reference() -> None:
    fn = pickle.loads(pickle.dumps(_job().bound()))
    assert fn.func is apply_batch and fn.args == (_job(),)


def test_the_sql_uses_the_planners_rule_and_one_merge() -> None:
    job = _job()
    latest = latest_changes_sql(job.plan, job.view)
    assert job.plan.latest_expr in latest and job.plan.change_filter in latest and "GROUP BY `id`" in latest
    merge = merge_sql(job.plan, job.target_sql, job.view)
    assert merge.startswith("MERGE INTO delta.`/r` AS t USING (")
    assert f"WHEN MATCHED AND {job.plan.delete_condition} THEN DELETE" in merge
    assert f"WHEN NOT MATCHED AND {job.plan.upsert_condition} THEN INSERT (`id`, `v`) VALUES (s.`id`, s.`v`)" in merge
    assert job.view.isidentifier()


def test_a_server_side_batch_error_is_reported_by_its_cause() -> None:
    from lakemirror.sinks.merge.connect_batches import server_batch_cause

    wrapped = RuntimeError(
        "[STREAM_FAILED] Query [id = 1] Found error inside foreachBatch Python process: Traceback (most recent call last):\n"
        '  File "/x/connect_apply.py", line 99, in merge_batch\n'
        "pyspark.errors.exceptions.connect.AnalysisException: [DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK "
        "constraint small (v < 100) violated by row with values: v : 500\n")
    cause = server_batch_cause(wrapped)
    assert str(cause).startswith("pyspark.errors.exceptions.connect.AnalysisException: [DELTA_VIOLATE_CONSTRAINT")
    plain = ValueError("no wrapper")
    assert server_batch_cause(plain) is plain


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class _Session:
    """Answers the batch's statistics and the MERGE, noting the confs each statement ran under."""

    def __init__(self, conf: dict[str, str], rows: int = 3) -> None:
        self.rows = rows
        self.conf = _Conf(conf)
        self.ran: list[tuple[str, dict[str, str]]] = []
        self.catalog = type("Catalog", (), {"dropTempView": staticmethod(lambda view: True)})()

    def sql(self, text: str) -> object:
        from datetime import datetime

        self.ran.append((text, dict(self.conf.values)))
        row = ({"n": self.rows, "lo": 1 if self.rows else None, "hi": 2 if self.rows else None,
                "ts": datetime(2026, 1, 1) if self.rows else None,
                "ts0": datetime(2025, 12, 31) if self.rows else None} if text.startswith("SELECT count(*)") else
               {"num_inserted_rows": 1, "num_updated_rows": 1, "num_deleted_rows": 0})
        return type("Answer", (), {"collect": lambda self: [type("Row", (dict,), {"asDict": dict.copy})(row)]})()


def test_the_server_merges_a_stable_batch_in_place_and_restores_the_sessions_confs() -> None:
    """The classic path's confs for a change-feed batch (no copy of the source, no AQE), scoped to
    the MERGE: the table's Connect session is the client's too."""
    from lakemirror.sinks.merge.connect_apply import merge_batch
    from lakemirror.sinks.txn import STABLE_SOURCE_CONFS, TXN_APP_ID, TxnId

    session = _Session({"spark.sql.adaptive.enabled": "true"})
    batch = type("Batch", (), {"sparkSession": session, "createOrReplaceTempView": lambda self, view: None})()
    outcome = merge_batch(_job(), batch, TxnId("lakemirror/p/src__s__t/e1", 7))
    assert outcome.counts.total == 2 and not outcome.replayed
    assert (outcome.stats.min_commit_time, outcome.stats.max_commit_time) == (
        datetime(2025, 12, 31).timestamp(), datetime(2026, 1, 1).timestamp())
    merge_confs = next(confs for text, confs in session.ran if text.startswith("MERGE INTO"))
    assert {k: merge_confs[k] for k in STABLE_SOURCE_CONFS} == STABLE_SOURCE_CONFS
    assert merge_confs[TXN_APP_ID] == "lakemirror/p/src__s__t/e1"
    assert session.conf.values == {"spark.sql.adaptive.enabled": "true"}


def test_the_batch_function_writes_its_outcome_for_the_daemon_and_no_spark_row(tmp_path: object) -> None:
    """No Spark write of a checkpoint row on the server: the batch's outcome goes to a file the daemon
    reads (sinks/merge/connect_outcomes.py); a batch with no change rows writes none."""
    from pathlib import Path

    from lakemirror.sinks.merge.connect_outcomes import read_outcomes

    folder = str(Path(str(tmp_path)) / "lakemirror_outcomes")
    session = _Session({})
    batch = type("Batch", (), {"sparkSession": session, "createOrReplaceTempView": lambda self, view: None})()
    apply_batch(_job(folder), batch, 7)  # type: ignore[arg-type]
    [done] = read_outcomes(folder, -1)
    assert (done.batch_id, done.txn_app_id, done.rows_read, done.first_version, done.last_version,
            done.inserted, done.updated, done.deleted, done.replayed) == (7, "lakemirror/p/src__s__t/e1", 3, 1, 2,
                                                                         1, 1, 0, False)
    # The source commit times of the batch's first and last versions, which its checkpoint row keeps
    # (first_version_at, last_version_at: recovery points are cut from them).
    assert (done.min_commit_time, done.max_commit_time) == (datetime(2025, 12, 31).timestamp(),
                                                            datetime(2026, 1, 1).timestamp())
    assert not [text for text, _ in session.ran if "INSERT INTO" in text.upper().split("MERGE")[0]]
    empty = _Session({}, rows=0)
    apply_batch(_job(folder), type("Batch", (), {"sparkSession": empty,  # type: ignore[arg-type]
                                                 "createOrReplaceTempView": lambda self, view: None})(), 8)
    assert [o.batch_id for o in read_outcomes(folder, -1)] == [7]
    assert not [text for text, _ in empty.ran if text.startswith("MERGE")]
