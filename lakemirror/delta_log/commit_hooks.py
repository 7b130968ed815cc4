"""What runs after each delta-rs commit lakemirror makes, batch after batch, to the same table.

After a commit, delta-rs writes a checkpoint when the new version is a multiple of the table's
``delta.checkpointInterval`` (cheap: once in that many commits), and, unless the table turns it
off (``delta.enableExpiredLogCleanup``), deletes the commit files older than
``delta.logRetentionDuration``, which takes a listing of the table's whole ``_delta_log``: on
every commit, although there is something to delete only once in a while. A replica taking a
batch every few seconds holds tens of thousands of commit files within a week's retention, so
that listing, and with it every batch's cost, grows with the log (on object storage, a request
per thousand files). Per-batch commits therefore run the clean-up only when the new version is a
multiple of :data:`LOG_CLEANUP_EVERY`: the log holds at most that many commits past its retention.

A batch's own commit runs neither hook (:func:`deferred_hooks`): the commit is visible to readers
once its file is put, and a checkpoint (a Parquet file of the table's state and ``_last_checkpoint``)
or a clean-up inside the same call would hold back the moment the daemon counts the batch as applied
(its lag and status) by its own length. :func:`after_commit` hands the caller what is due instead,
run once the batch is reported; a failure there is logged and leaves the table as readable as before
(the next due version checkpoints it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from deltalake import PostCommitHookProperties

log = logging.getLogger(__name__)

#: Versions between two clean-ups of a table's expired commit files.
LOG_CLEANUP_EVERY = 100
#: How often a table is checkpointed, in versions.
CHECKPOINT_INTERVAL_PROPERTY = "delta.checkpointInterval"
#: delta-rs's checkpoint interval for a table that does not set :data:`CHECKPOINT_INTERVAL_PROPERTY`.
DELTA_RS_CHECKPOINT_INTERVAL = 100
#: ``false`` on a table keeps every commit file (Delta's own clean-up honours it too).
LOG_CLEANUP_PROPERTY = "delta.enableExpiredLogCleanup"


def log_cleanup_enabled(configuration: "Mapping[str, str]") -> bool:
    """Whether a table with these properties has its expired commit files deleted at all."""
    return configuration.get(LOG_CLEANUP_PROPERTY, "true").strip().lower() != "false"


def cleans_log(next_version: int) -> bool:
    """Whether the commit that makes ``next_version`` runs the expired-log clean-up."""
    return next_version % LOG_CLEANUP_EVERY == 0


def post_commit_hooks(next_version: int) -> "PostCommitHookProperties":
    """The post-commit hooks of the commit expected to make ``next_version`` (see the module
    docstring): checkpoints as the table says; the clean-up as the table says on one commit in
    :data:`LOG_CLEANUP_EVERY`, never on the others."""
    from deltalake import PostCommitHookProperties

    return PostCommitHookProperties(create_checkpoint=True,
                                    cleanup_expired_logs=None if cleans_log(next_version) else False)


def deferred_hooks() -> "PostCommitHookProperties":
    """A commit that runs no hook: what is due is run by :func:`after_commit`'s answer."""
    from deltalake import PostCommitHookProperties

    return PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def upkeep_due(version: int, configuration: "Mapping[str, str]") -> tuple[bool, bool]:
    """Whether the commit that made ``version`` is followed by a checkpoint, and by the clean-up of
    expired commit files: the hooks :func:`post_commit_hooks` has delta-rs run."""
    try:
        interval = int(configuration.get(CHECKPOINT_INTERVAL_PROPERTY) or DELTA_RS_CHECKPOINT_INTERVAL)
    except ValueError:
        interval = DELTA_RS_CHECKPOINT_INTERVAL
    checkpoint = version > 0 and interval > 0 and version % interval == 0
    return checkpoint, version > 0 and cleans_log(version) and log_cleanup_enabled(configuration)


def after_commit(table: Any, version: int, label: str) -> "Callable[[], None] | None":
    """What the commit that made ``version`` of ``table`` (a delta-rs ``DeltaTable`` holding that
    version) leaves due, as one call that never raises; None: nothing is due."""
    checkpoint, cleanup = upkeep_due(version, table.metadata().configuration)
    if not (checkpoint or cleanup):
        return None

    def upkeep() -> None:
        try:
            if checkpoint and table.version() == version:  # a later version checkpoints on its own turn
                table.create_checkpoint()
            if cleanup:
                table.cleanup_metadata()
        except Exception as exc:  # noqa: BLE001 (see the module docstring)
            log.warning("%s: the upkeep after version %d (checkpoint, clean-up of expired commit files) failed: %s",
                        label, version, exc)
    return upkeep
