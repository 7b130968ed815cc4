"""Checks of a PostgreSQL destination against the rest of the pipeline, run once at config load.

Each problem comes back with its location, like :func:`~.schedule.schedule_problems`, and stops
``lakemirror validate`` / ``run`` with exit 2:

- the connection budget: Real-Time Mode's executor tasks (one connection each) plus the daemon's
  own pool must fit ``destination.max_connections``; the message shows the arithmetic;
- ``table_modes`` must name tables the pipeline replicates;
- triggered and snapshot modes read a Delta source (its change feed, its snapshots), not an event
  stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakemirror.daemon.settings.destination import PostgresDestination
from lakemirror.daemon.settings.schedule import Problem
from lakemirror.sinks.postgres.modes import ConnectionBudget, connection_budget

if TYPE_CHECKING:
    from lakemirror.daemon.settings.pipeline import Settings

WHERE = ("destination", "postgres")


def budget_of(settings: "Settings") -> ConnectionBudget | None:
    """The connection budget of a Postgres destination (None: a Delta destination)."""
    d = settings.destination
    if not isinstance(d, PostgresDestination):
        return None
    rt = settings.source.real_time if settings.source is not None else None
    tasks = 0 if rt is None or rt.tasks is None else rt.tasks  # unset: counted when the source starts
    return connection_budget(d.max_connections, tasks=tasks, per_task=1,
                             pool=d.pool_connections if d.pool_connections is not None else None)


def postgres_problems(settings: "Settings") -> list[Problem]:
    d = settings.destination
    if not isinstance(d, PostgresDestination):
        return []
    problems: list[Problem] = []
    budget = budget_of(settings)
    if budget is not None and not budget.fits:
        if d.pool_connections is None:
            fix = f"raise max_connections to at least {budget.needed}, or read fewer partitions (source.real_time.tasks)"
        else:
            fix = "raise max_connections, lower pool_connections, or read fewer partitions (source.real_time.tasks)"
        problems.append(((*WHERE, "max_connections"), f"the connections do not fit: {budget.arithmetic()}; {fix}"))
    if d.table_modes:
        if settings.tables is not None:
            unknown = sorted(set(d.table_modes) - set(settings.tables))
            if unknown:
                problems.append(((*WHERE, "table_modes"), f"names tables not in `tables`: {unknown}"))
        excluded = sorted(set(d.table_modes) & set(settings.exclude_tables))
        if excluded:
            problems.append(((*WHERE, "table_modes"), f"names excluded tables (exclude_tables): {excluded}"))
    if settings.source is not None and d.cycled_modes():
        problems.append(((*WHERE, "mode"), f"{' and '.join(sorted(d.cycled_modes()))} modes read a Delta source; an "
                                           f"event source (source.kind {settings.source.kind}) streams continuously"))
    return problems
