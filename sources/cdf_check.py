"""Is a table ready for continuous sync? A pure verdict from its description (no Spark).

``GET /api/incremental/cdf-check`` describes a schema's tables on the daemon's Spark worker and
turns each :class:`~lakemirror.sources.catalog.TableInfo` into a :class:`Readiness` here: the
Change Data Feed must be enabled, a usable key must exist (the rule that found it is reported,
see :func:`~lakemirror.sources.keys.choose_key`), and the retention window is the headroom a new
replica starts with (it is bootstrapped at the current version, so it starts caught up). Every
problem comes with the exact statement (or setting) that fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

from lakemirror.errors import NoUsableKey
from lakemirror.identifiers import sql_string
from lakemirror.sources.catalog import CDF_PROPERTY, TableInfo
from lakemirror.sources.keys import PRIMARY_KEY_PROPERTY, choose_key
from lakemirror.sources.retention import DELETED_FILE_RETENTION, LOG_RETENTION, RetentionWindow

KeyDeclaration = Literal["property", "constraint"]


@dataclass(frozen=True)
class Readiness:
    """One table's verdict; ``fixes`` are statements to run (or settings to add), in order."""

    table: str
    ready: bool
    cdf_enabled: bool
    key: tuple[str, ...] | None
    key_rule: str | None
    retention_headroom_seconds: float | None
    problems: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())


def _props_statement(table_sql: str, props: Sequence[tuple[str, str]]) -> str:
    body = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in props)
    return f"ALTER TABLE {table_sql} SET TBLPROPERTIES ({body})"


def assess(info: TableInfo, *, configured_keys: Sequence[str] = (), key_declaration: KeyDeclaration = "property",
           retention_warning_seconds: float = 86400.0) -> Readiness:
    """The verdict for one described table. ``key_declaration`` says how a key is declared where
    the table lives: a table property locally, a PRIMARY KEY constraint in Unity Catalog."""
    name, table_sql = str(info.location.name), info.location.sql
    problems: list[str] = []
    fixes: list[str] = []
    warnings: list[str] = []
    if not info.cdf_enabled:
        problems.append("Change Data Feed is not enabled")
        fixes.append(_props_statement(table_sql, [(CDF_PROPERTY, "true")]))
    key: tuple[str, ...] | None = None
    rule: str | None = None
    try:
        choice = choose_key(name, info.columns, configured=configured_keys, declared=info.declared_key)
        key, rule = choice.columns, choice.rule
    except NoUsableKey as exc:
        problems.append(str(exc).split(". Set", 1)[0])
        if key_declaration == "constraint":
            fixes.append(f"ALTER TABLE {table_sql} ALTER COLUMN <key column> SET NOT NULL; ALTER TABLE {table_sql} "
                         f"ADD CONSTRAINT <name> PRIMARY KEY (<key column>[, …])")
        else:
            fixes.append(_props_statement(table_sql, [(PRIMARY_KEY_PROPERTY, "<col1,col2>")]))
        fixes.append(f"or in the pipeline: table_overrides: {{{info.location.name.table}: {{keys: [<col1>, <col2>]}}}}")
    window = RetentionWindow.from_properties(info.properties)
    if window.seconds < retention_warning_seconds:
        warnings.append(f"the change window is only {window.seconds:.0f}s: a replica stopped longer than that "
                        f"must be bootstrapped again")
        fixes.append(_props_statement(table_sql, [(DELETED_FILE_RETENTION, "interval 7 days"),
                                                  (LOG_RETENTION, "interval 30 days")]))
    return Readiness(table=name, ready=not problems, cdf_enabled=info.cdf_enabled, key=key, key_rule=rule,
                     retention_headroom_seconds=window.seconds, problems=tuple(problems), fixes=tuple(fixes),
                     warnings=tuple(warnings))


def unreadable(table: str, error: str) -> Readiness:
    """The verdict for a table that could not be described (missing, no permission, not Delta)."""
    return Readiness(table=table, ready=False, cdf_enabled=False, key=None, key_rule=None,
                     retention_headroom_seconds=None, problems=(f"cannot be described: {error}",),
                     fixes=("check that it is a Delta table this principal can read",))
