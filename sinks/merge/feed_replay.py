"""The Spark side of replaying a change-feed table's dead letters: the keys' state at the table's
applied version, read from the source and MERGEd into the replica.

What is written and why (the source's state of each key at ``V``, the applied version; never an
older one), the fallback when ``V``'s files are gone, and the transaction ids:
:mod:`lakemirror.sinks.merge.letter_replay`. Here, thinly:

1. the letters' keys become a small DataFrame of typed key values (each with its letter's key text);
2. the source at ``V`` is read for those keys (``versionAsOf``, filtered by key so that Delta reads
   only the files that may hold them), or, when that fails, the change feed after ``V`` and the latest
   version are; a key found becomes an ``insert`` of its row, a key not found a ``delete``, each at
   commit version ``V``: change rows the batch MERGE of the plan applies as it applies any batch
   (:func:`~lakemirror.sinks.merge.connect_apply.merge_sql`);
3. one MERGE of all the keys under the replay's transaction id; refused because of a value, the
   keys are bisected (:func:`~lakemirror.sinks.isolate.bisect`), each attempt under an id of its own.

Called with the table's batches held off (its runner's batch lock): :mod:`lakemirror.supervisor.change_feed.dead_letters`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any, Sequence

from lakemirror import tables
from lakemirror.sinks.events.dead_letters import Resolution
from lakemirror.sinks.isolate import bisect
from lakemirror.sinks.merge import letter_replay as lr
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.planner import (CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, DELETE, INSERT, OP_COLUMN,
                                            MergePlan)
from lakemirror.sinks.merge.row_isolation import refusal_reason
from lakemirror.sinks.txn import TxnId, transaction
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayTarget:
    """What a replay needs of one table, taken while its batches are held off."""

    label: str                 # the source table, as its letters name it
    source: TableLocation
    replica: TableLocation
    plan: MergePlan
    applied_through: int       # V: the newest source version whose changes the replica holds
    app_id: str                # the table's transaction app id of its epoch


class StateUnreadable(Exception):
    """The keys' state at the applied version can be read neither from the source's snapshot at that
    version nor from its change feed after it (the message says both reasons and what to do)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


def _col(alias: str, name: str) -> "SparkColumn":
    from pyspark.sql import functions as F

    return F.col(f"{alias}.`{name.replace('`', '``')}`")


def replay_keys(session: "SparkSession", target: ReplayTarget, replays: Sequence[lr.KeyReplay]) -> list[Resolution]:
    """Write the state at ``target.applied_through`` of every key of ``replays`` (one table's) into its
    replica; what became of each letter (see the module docstring)."""
    too_new = lr.unapplied(replays, target.applied_through)
    done = [x for r in replays if r.key in too_new for x in lr.not_replayed(r, too_new[r.key])]
    keys, ready, refused = key_frame(session, target, [r for r in replays if r.key not in too_new])
    done += refused
    if keys is None or not ready:
        return done
    try:
        states, present, how = states_at(session, target, keys, ready)
    except (StateUnreadable, ValueError) as exc:  # ValueError: a first change that cannot tell the state
        return done + [x for r in ready for x in lr.not_replayed(r, str(exc))]
    log.info("table %s: replaying %d key(s) of dead letters: their state at source version %d (%s)",
             target.label, len(ready), target.applied_through, how)
    states = states.persist()
    try:
        done += _write(session, target, states, present, ready)
    finally:
        states.unpersist()
    return done


def key_frame(session: "SparkSession", target: ReplayTarget, replays: Sequence[lr.KeyReplay]
              ) -> tuple["DataFrame | None", list[lr.KeyReplay], list[Resolution]]:
    """The letters' keys as typed values (each row with its letter's key text, :data:`LETTER_KEY`), the
    replays whose key was read back, and what became of the others (not replayed, and why)."""
    if not replays:
        return None, [], []
    names = {f.name: f for f in tables.read(session, target.source).schema.fields}
    missing = [k for k in target.plan.keys if k not in names]
    if missing:
        return None, [], [x for r in replays for x in lr.not_replayed(
            r, f"the source no longer has the key column(s) {', '.join(missing)}; resync the table")]
    columns = [(k, names[k].dataType.simpleString()) for k in target.plan.keys]
    rows: list[tuple[Any, ...]] = []
    ready: list[lr.KeyReplay] = []
    refused: list[Resolution] = []
    for r in replays:
        try:
            rows.append((r.key, *lr.key_values(r.key, columns)))
            ready.append(r)
        except ValueError as exc:
            refused += lr.not_replayed(r, f"{exc}; skip it and resync the table")
    if not ready:
        return None, [], refused
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField(lr.LETTER_KEY, StringType(), False),
                         *[StructField(k, names[k].dataType, True) for k in target.plan.keys]])
    return session.createDataFrame(rows, schema), ready, refused


def _present(frame: "DataFrame", keys: "DataFrame", plan: MergePlan) -> "DataFrame":
    """``frame``'s rows of the letters' keys (NULL matching NULL), as the plan's columns with the
    letter's key text; a plan column ``frame`` lacks is NULL."""
    from pyspark.sql import functions as F

    have = set(frame.columns)
    on = reduce(lambda a, b: a & b, [_col("s", k).eqNullSafe(_col("w", k)) for k in plan.keys])
    return frame.alias("s").join(keys.alias("w"), on, "inner").select(
        _col("w", lr.LETTER_KEY).alias(lr.LETTER_KEY),
        *[(_col("s", c.name) if c.name in have else F.lit(None).cast(c.type)).alias(c.name) for c in plan.columns])


def states_at(session: "SparkSession", target: ReplayTarget, keys: "DataFrame", replays: Sequence[lr.KeyReplay],
              snapshot: bool = True) -> tuple["DataFrame", set[str], str]:
    """The change rows that set each key (of ``keys``, :func:`key_frame`) to its state at ``V``, the key
    texts found there (upserts; the others are deletes), and where the state was read: the source's
    snapshot at ``V``, or (when it cannot be read, or not ``snapshot``) its change feed after ``V``."""
    from pyspark.sql import functions as F

    plan, version = target.plan, target.applied_through
    try:
        if not snapshot:
            raise StateUnreadable("not asked for")
        at_version = tables.read(session, target.source, versionAsOf=str(version))
        found = _present(at_version, keys, plan)
        present = {r[lr.LETTER_KEY] for r in found.select(lr.LETTER_KEY).collect()}
        how = f"read from the source's version {version}"
    except Exception as exc:  # noqa: BLE001 (the version's files or commits gone: derived from the feed)
        snapshot_error = _first_line(exc)
        found, present = _derived(session, target, keys, snapshot_error)
        how = (f"the source's version {version} is gone ({snapshot_error}); derived from its change feed after it "
               f"and its latest version")
    absent = [r.key for r in replays if r.key not in present]
    deletes = keys.where(F.col(lr.LETTER_KEY).isin(absent)).select(
        F.col(lr.LETTER_KEY),
        *[(F.col(f"`{c.name}`") if c.name in plan.keys else F.lit(None).cast(c.type)).alias(c.name)
          for c in plan.columns])
    ops = (found.withColumn(CHANGE_TYPE, F.lit(INSERT))
           .unionByName(deletes.withColumn(CHANGE_TYPE, F.lit(DELETE))))
    rows = (ops.withColumn(COMMIT_VERSION, F.lit(version).cast("bigint"))
            .withColumn(COMMIT_TIMESTAMP, F.lit(None).cast("timestamp")))
    return rows, present, how


def _derived(session: "SparkSession", target: ReplayTarget, keys: "DataFrame",
             snapshot_error: str) -> tuple["DataFrame", set[str]]:
    """The keys' rows at ``V`` from the change feed after ``V`` and the latest version ``L``
    (:func:`~lakemirror.sinks.merge.letter_replay.state_source`); raises StateUnreadable."""
    from pyspark.sql import functions as F

    plan, version = target.plan, target.applied_through
    try:
        latest = tables.latest_version(session, target.source)
        if latest <= version:
            raise StateUnreadable(f"the source's version {version} cannot be read ({snapshot_error}) and it is "
                                  f"its latest; replay again once it can be read, or resync the table")
        feed = tables.read(session, target.source, readChangeFeed="true", startingVersion=str(version + 1),
                           endingVersion=str(latest))
        on = reduce(lambda a, b: a & b, [_col("c", k).eqNullSafe(_col("w", k)) for k in plan.keys])
        changes = feed.alias("c").join(keys.alias("w"), on, "inner").select("c.*", _col("w", lr.LETTER_KEY).alias(
            lr.LETTER_KEY))
        first = (changes.groupBy(lr.LETTER_KEY).agg(F.expr(lr.first_change_expr(plan)).alias("f"))
                 .select(lr.LETTER_KEY, "f.*"))
        firsts = {r[lr.LETTER_KEY]: r[OP_COLUMN] for r in first.select(lr.LETTER_KEY, OP_COLUMN).collect()}
        at_latest = _present(tables.read(session, target.source, versionAsOf=str(latest)), keys, plan)
        in_latest = {r[lr.LETTER_KEY] for r in at_latest.select(lr.LETTER_KEY).collect()}
    except StateUnreadable:
        raise
    except Exception as exc:  # noqa: BLE001 (both ways failed: refused, with both reasons)
        raise StateUnreadable(
            f"the source's version {version} cannot be read ({snapshot_error}), nor its change feed after it "
            f"({_first_line(exc)}): the key's row at that version is gone; resync the table") from exc
    wanted = [r[lr.LETTER_KEY] for r in keys.select(lr.LETTER_KEY).collect()]
    source = {key: lr.state_source(firsts.get(key), key in in_latest) for key in wanted}
    from_first = [k for k, s in source.items() if s == lr.FROM_FIRST_CHANGE]
    from_latest = [k for k, s in source.items() if s == lr.FROM_LATEST]
    rows = (first.where(F.col(lr.LETTER_KEY).isin(from_first))
            .select(lr.LETTER_KEY, *[F.col(f"`{c.name}`") for c in plan.columns])
            .unionByName(at_latest.where(F.col(lr.LETTER_KEY).isin(from_latest))))
    return rows, set(from_first) | set(from_latest)


def _write(session: "SparkSession", target: ReplayTarget, states: "DataFrame", present: set[str],
           replays: Sequence[lr.KeyReplay]) -> list[Resolution]:
    """One MERGE of every key's state; bisected by key when the replica refuses a value."""
    from pyspark.sql import functions as F

    merge = DeltaMergeSink(target.replica, target.plan)
    replica = str(target.replica.name)

    def write(part: Sequence[lr.KeyReplay], txn: TxnId) -> tuple[tuple[lr.KeyReplay, ...], bool]:
        """MERGE ``part``'s keys under ``txn``: the keys and whether Delta wrote (False: a repeat it skipped)."""
        rows = states.where(F.col(lr.LETTER_KEY).isin([r.key for r in part]))
        with transaction(session, txn):
            answer = merge.merge_rows(session, rows)
        return tuple(part), bool(answer)

    txn = lr.replay_txn(target.app_id, replays)
    try:
        outcomes, refused = [write(replays, txn)], []
    except Exception as exc:
        reason = refusal_reason(exc)
        if reason is None:
            raise
        log.warning("table %s: the replica refused the replay of %d key(s) (%s); finding the key(s) that cause it",
                    target.label, len(replays), reason)
        found = bisect(list(replays), write, txn, refusal_reason, reason)
        outcomes, refused = found.applied, found.refused
    done: list[Resolution] = []
    for part, wrote in outcomes:
        for r in part:
            done += lr.written(r, r.key in present, target.applied_through, replica, repeated=not wrote)
    for r, reason in refused:
        done += lr.refused(r, reason)
    return done
