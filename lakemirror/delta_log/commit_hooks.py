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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from deltalake import PostCommitHookProperties

#: Versions between two clean-ups of a table's expired commit files.
LOG_CLEANUP_EVERY = 100
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
