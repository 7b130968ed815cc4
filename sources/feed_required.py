"""A source table's Change Data Feed, required on before a replica is kept from it.

Both ways of keeping a replica from the change feed need it: a stream's preparation
(:mod:`lakemirror.supervisor.change_feed.prepare`) and a destination's cycles (a triggered PostgreSQL replica,
:mod:`lakemirror.sinks.postgres.cycles`). Off, it is turned on when the pipeline opts in, else the
table is refused with both fixes named.
"""

from __future__ import annotations

import logging
from typing import Protocol

from lakemirror.errors import ChangeFeedDisabled
from lakemirror.sources.catalog import TableInfo, enable_change_feed_sql

log = logging.getLogger(__name__)


class ChangeFeedSource(Protocol):
    def describe(self) -> TableInfo: ...
    def enable_change_feed(self) -> None: ...


def require_change_feed(source: ChangeFeedSource, info: TableInfo, label: str, *, enable: bool,
                        otherwise: str = "") -> TableInfo:
    """``info`` of a source whose change data feed is on. Off, it is turned on when the pipeline
    opts in (``enable_change_data_feed: true``; one table-property commit on the source, logged),
    else refused as a configuration error naming both fixes (and ``otherwise``, another way out)."""
    if info.cdf_enabled:
        return info
    statement = enable_change_feed_sql(info.location)
    if not enable:
        raise ChangeFeedDisabled(
            f"{label}: the source's Change Data Feed is not enabled, and the replica is kept from it. Run: "
            f"{statement}; or set enable_change_data_feed: true to let lakemirror run it{otherwise}.", table=label)
    try:
        source.enable_change_feed()
    except Exception as exc:  # noqa: BLE001 (a permission, a read-only table: the person must do it)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ChangeFeedDisabled(
            f"{label}: the source's Change Data Feed is not enabled, and turning it on (enable_change_data_feed) "
            f"failed: {first}. Run {statement} as a user allowed to alter the table{otherwise}.", table=label) from exc
    log.warning("table %s: the source's Change Data Feed was off; turned on (enable_change_data_feed: true): %s",
                label, statement)
    return source.describe()
