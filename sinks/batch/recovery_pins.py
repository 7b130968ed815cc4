"""A recovery point pinned as tables a failover can switch readers to: per table, a shallow clone of
its replica at the version the cut names (``CREATE OR REPLACE TABLE … SHALLOW CLONE … VERSION AS OF``).

A shallow clone copies no data: it references the replica's files as of that version, so it costs a
commit, and it stays readable as long as those files do (a ``VACUUM`` of the replica past its
retention removes files it may still reference: pin again after a new cut, or deep clone the pinned
tables for a copy of their own).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from lakemirror.identifiers import TableName
from lakemirror.sinks.sql import SqlExecutor


def pin_sql(pinned_sql: str, replica_sql: str, version: int) -> str:
    return f"CREATE OR REPLACE TABLE {pinned_sql} SHALLOW CLONE {replica_sql} VERSION AS OF {int(version)}"


def pinned_name(replica: TableName, schema: str) -> TableName:
    """Where the pinned table of ``replica`` goes: the same catalog and table name, in ``schema``."""
    return TableName(replica.catalog, schema, replica.table)


def pin(sql: SqlExecutor, cuts: Sequence[tuple[str, int]], schema: str, locate: Callable[[TableName], Any],
        ensure_schema: Callable[[str, str], None]) -> list[dict[str, Any]]:
    """Pin each ``(replica, version)`` into ``schema``; every table is tried, each outcome reported."""
    out: list[dict[str, Any]] = []
    for replica_name, version in cuts:
        replica = TableName.parse(replica_name)
        pinned = pinned_name(replica, schema)
        try:
            ensure_schema(pinned.catalog, pinned.schema)
            sql.sql(pin_sql(locate(pinned).sql, locate(replica).sql, version))
            out.append({"replica": replica_name, "version": version, "pinned": str(pinned), "status": "success"})
        except Exception as exc:  # noqa: BLE001 — one table failing never stops the others
            out.append({"replica": replica_name, "version": version, "pinned": str(pinned), "status": "failed",
                        "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}"})
    return out
