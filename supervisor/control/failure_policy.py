"""What a table's failure leads to: retry with backoff, restart at once, resync, or stay failed.

Pure: it looks at the lakemirror error (already translated by :mod:`lakemirror.supervisor.control.classify_errors`)
and the pipeline's policies, and returns the state machine's :class:`~lakemirror.supervisor.control.table_state.Failed`
event. Retrying only helps a failure that time can cure. A configuration error (a configured key
column the table does not have, no usable key, a listed table that does not exist, a destination
another pipeline owns, a column the replica cannot hold, a source whose change feed is off) fails the same way on every retry until a person changes something, so it is
terminal at once: the table goes ``failed`` with the fix in its message. A listed table that is
created later is picked up by the supervisor's discovery loop (:data:`REDISCOVERABLE`), not by
retries.
"""

from __future__ import annotations

from lakemirror.errors import (
    BootstrapCannotConverge, ChangeFeedDisabled, ChangeWindowExpired, ConfigError, DestinationConflict,
    LakemirrorError, NoUsableKey, SchemaChangeRestart, SourceReplaced, UnsupportedColumnType,
)
from lakemirror.sources.catalog import TableMissing
from lakemirror.supervisor.control import table_state as sm

#: Errors of the configuration (or of what it names): retrying cannot help.
CONFIGURATION_ERRORS: tuple[type[LakemirrorError], ...] = (NoUsableKey, TableMissing, ConfigError, DestinationConflict,
                                                            UnsupportedColumnType, ChangeFeedDisabled)

#: The error code of a table that does not exist; the discovery loop relaunches such a failed
#: table once the table is there.
TABLE_MISSING = "table_missing"
REDISCOVERABLE = frozenset({TABLE_MISSING})


def is_configuration_error(error: LakemirrorError) -> bool:
    return isinstance(error, CONFIGURATION_ERRORS)


def failure_code(error: LakemirrorError) -> str:
    return TABLE_MISSING if isinstance(error, TableMissing) else error.code


def failed_event(error: LakemirrorError, *, table: str, allow_schema_evolution: bool, change_window_policy: str,
                 rand: float) -> sm.Failed:
    """The state machine's event for ``error`` of ``table`` (its name in the source schema)."""
    restart = isinstance(error, SchemaChangeRestart) and allow_schema_evolution
    window_lost = isinstance(error, (ChangeWindowExpired, SourceReplaced))
    resync = window_lost and change_window_policy == "resync"
    configuration = is_configuration_error(error)
    too_short = isinstance(error, BootstrapCannotConverge)
    message = str(error)
    if too_short:
        # Not resynced by itself, whatever change_window_policy says: a new bootstrap would lose the
        # window the same way. Said once, in the table's state.
        message += (f" The table stays failed: raise the retention, then run `lakemirror resume CONFIG {table}` to "
                    f"continue this bootstrap where it stopped (while the source still holds the changes it needs; "
                    f"if not, the change window policy applies), or `lakemirror resync CONFIG {table}` to start it "
                    f"again.")
    elif window_lost:
        message += (" The table was resynced (new bootstrap epoch)." if resync else
                    f" Policy change_window_policy=fail: the table stays failed; run `lakemirror resync CONFIG "
                    f"{table}` (or POST /tables/{table}/resync), or set change_window_policy: resync.")
    elif isinstance(error, TableMissing):
        message += (f". Create the table, or remove {table!r} from `tables:` in the configuration; the table is "
                    f"picked up as soon as it exists (no retries meanwhile).")
    elif configuration:
        message += (f" This is a configuration error, not retried: fix it and restart the daemon, or run "
                    f"`lakemirror resume CONFIG {table}` once the table is fixed.")
    return sm.Failed(error=message, code=failure_code(error), restart_now=restart, rand=rand,
                     fatal=(window_lost and not resync) or configuration or too_short, resync=resync)
