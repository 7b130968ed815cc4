"""The checkpoint volume's layout: every file and folder lakemirror keeps there, named in one place.

Pure: names and joins, no I/O. A streaming pipeline (``lakemirror run``, or one posted to the HTTP
API) keeps everything in its own folder, ``<checkpoint_volume>/<pipeline_id>/``; ``lakemirror
replicate`` keeps its state under ``<checkpoint_volume>/replicate/``::

    <checkpoint_volume>/
    ├── <pipeline_id>/                     pipeline_dir: one pipeline, whatever its source
    │   ├── daemon.json                    the running daemon's endpoint: url, pid, start, token file, lease
    │   ├── daemon.token                   the control API's generated bearer token (mode 0600)
    │   ├── .lakemirror-pipeline           only in a folder created for a pipeline posted to the API:
    │   │                                  names the pipeline the folder belongs to
    │   ├── lease/                         the pipeline's lease: one daemon at a time
    │   ├── commands.json                  control commands accepted (202) whose effect is not yet in
    │   │                                  their table's state: applied by the next start if the daemon dies
    │   ├── state/<table>.json             a table's state: paused, bootstrap epoch, bootstrapped version
    │   ├── bootstrap/<table>.json         a chunked bootstrap's plan and the chunks it committed
    │   ├── <table>/                       a change-feed table's Spark state, one set per bootstrap epoch:
    │   │   ├── e<epoch>/                  the Structured Streaming checkpoint of the table's query
    │   │   └── e<epoch>-changes/          the chunked bootstrap's change log: the feed captured beside the copy
    │   ├── events/<source>/               an event source's one query:
    │   │   ├── status.json                its last batch, offsets and lag, for status while it is down
    │   │   ├── epoch                      the epoch in its transaction ids, renewed with its checkpoint
    │   │   ├── checkpoint/                the Structured Streaming checkpoint of the query
    │   │   └── checkpoint.retired-<id>/   a checkpoint set aside by a resync, removed right after
    │   ├── cycles/state/<table>.json      a PostgreSQL replica's triggered or snapshot cycles
    │   └── incremental/                   scheduled incremental sweeps (as under replicate/, below)
    ├── api/                               the checkpoint volume of pipelines posted to the API:
    │   └── <pipeline_id>/                 each one's folder, laid out as above
    └── replicate/                         lakemirror replicate (its transaction-id namespace):
        ├── incremental/
        │   ├── state/<table>.json         a target's sweep state
        │   └── <table>/e<epoch>/          the checkpoint of a sweep's stream
        └── volumes/<target>/              a volume's file manifest (snapshot.json, segment-<seq>.jsonl)

``<table>`` is the table's slug (:attr:`lakemirror.identifiers.TableName.slug`,
``catalog__schema__table``), which always holds ``__`` and so never takes one of the names above.
Every file is written whole to a temporary file beside it (a name starting with a dot, or
``epoch.tmp``) and renamed over it.

Folders that Spark reads or writes (stream checkpoints, a bootstrap's change log) are joined as
strings, since the volume may be a URI (``dbfs:/…``); the daemon's own files as :class:`Path`.
"""

from __future__ import annotations

import os
from pathlib import Path

DAEMON_FILE = "daemon.json"
TOKEN_FILE = "daemon.token"
#: Written into a pipeline folder lakemirror creates for a pipeline posted to the API: only a folder
#: holding it, naming that pipeline, is ever deleted through the API.
OWNER_MARKER = ".lakemirror-pipeline"
LEASE_DIR = "lease"
COMMANDS_FILE = "commands.json"
STATE_DIR = "state"
BOOTSTRAP_DIR = "bootstrap"
EVENTS_DIR = "events"
EVENT_EPOCH_FILE = "epoch"
EVENT_RECORD_FILE = "status.json"
EVENT_CHECKPOINT_DIR = "checkpoint"
#: A resync renames an event source's checkpoint to this prefix and an id, then removes it.
RETIRED_CHECKPOINT_PREFIX = EVENT_CHECKPOINT_DIR + ".retired-"
CYCLES_DIR = "cycles"
INCREMENTAL_DIR = "incremental"
VOLUMES_DIR = "volumes"
#: The folder, under the daemon's checkpoint volume, that is the checkpoint volume of pipelines posted
#: to the API.
API_DIR = "api"
#: ``lakemirror replicate``'s folder under its checkpoint volume, also the namespace of its
#: transaction ids.
REPLICATE_DIR = "replicate"


def pipeline_dir(checkpoint_volume: str | os.PathLike[str], pipeline_id: str) -> Path:
    """``<checkpoint_volume>/<pipeline_id>``: everything one pipeline keeps."""
    return Path(checkpoint_volume) / pipeline_id


def daemon_file(pipeline: Path) -> Path:
    """The running daemon's endpoint record (``lakemirror status|pause|…`` read it)."""
    return pipeline / DAEMON_FILE


def daemon_file_tmp(pipeline: Path, pid: int) -> Path:
    """Where process ``pid`` writes :func:`daemon_file` before renaming it into place."""
    return pipeline / f".{DAEMON_FILE}.{pid}.tmp"


def token_file(pipeline: Path) -> Path:
    return pipeline / TOKEN_FILE


def token_file_tmp(pipeline: Path, pid: int) -> Path:
    return pipeline / f".{TOKEN_FILE}.{pid}.tmp"


def owner_marker(pipeline: Path) -> Path:
    return pipeline / OWNER_MARKER


def lease_dir(pipeline: Path) -> Path:
    return pipeline / LEASE_DIR


def commands_file(pipeline: Path) -> Path:
    """The pipeline's command journal (:mod:`lakemirror.checkpoints.commands`)."""
    return pipeline / COMMANDS_FILE


def commands_file_unreadable(pipeline: Path, tag: str) -> Path:
    """Where a command journal that cannot be parsed is set aside, kept for the operator."""
    return pipeline / f"{COMMANDS_FILE}.unreadable-{tag}"


def state_dir(root: str | os.PathLike[str]) -> Path:
    """The table states of a state store rooted at ``root`` (a pipeline's folder, its cycles, a sweep's)."""
    return Path(root) / STATE_DIR


def bootstrap_dir(state: Path) -> Path:
    """The chunked bootstraps' records beside the state folder ``state``."""
    return state.parent / BOOTSTRAP_DIR


def cycles_dir(pipeline: Path) -> Path:
    """The root of the PostgreSQL cycles' state store."""
    return pipeline / CYCLES_DIR


def event_source_dir(pipeline: Path, source: str) -> Path:
    return pipeline / EVENTS_DIR / source


def event_epoch_file(source_dir: Path) -> Path:
    return source_dir / EVENT_EPOCH_FILE


def event_checkpoint(source_dir: Path) -> Path:
    return source_dir / EVENT_CHECKPOINT_DIR


def retired_event_checkpoint(source_dir: Path, tag: str) -> Path:
    return source_dir / f"{RETIRED_CHECKPOINT_PREFIX}{tag}"


def _join(root: str, *parts: str) -> str:
    return "/".join((root.rstrip("/"), *parts))


def stream_checkpoint(checkpoint_root: str, pipeline_id: str, table_slug: str, epoch: int) -> str:
    """The stream checkpoint folder of a table's epoch."""
    return _join(checkpoint_root, pipeline_id, table_slug, f"e{epoch}")


def change_log_table(checkpoint_root: str, pipeline_id: str, table_slug: str, epoch: int) -> str:
    """The Delta table into which a chunked bootstrap captures the source's change feed after its
    pinned version (its *change log*), in that epoch."""
    return _join(checkpoint_root, pipeline_id, table_slug, f"e{epoch}-changes")


def incremental_dir(checkpoint_volume: str | os.PathLike[str], namespace: str) -> Path:
    """The root of the state store of incremental sweeps in ``namespace`` (a pipeline id, or
    :data:`REPLICATE_DIR`)."""
    return Path(checkpoint_volume) / namespace / INCREMENTAL_DIR


def incremental_checkpoint(checkpoint_root: str, namespace: str, table_slug: str, epoch: int) -> str:
    """The checkpoint of an incremental sweep's stream of a table's epoch."""
    return _join(checkpoint_root, namespace, INCREMENTAL_DIR, table_slug, f"e{epoch}")


def api_checkpoint_volume(checkpoint_volume: str) -> str:
    """The checkpoint volume given to pipelines posted to the API of a daemon on ``checkpoint_volume``."""
    return _join(checkpoint_volume, API_DIR)


def replicate_dir(checkpoint_volume: str | os.PathLike[str]) -> Path:
    return Path(checkpoint_volume) / REPLICATE_DIR


def volume_manifest_dir(root: str | os.PathLike[str], target_slug: str) -> Path:
    """The file manifest of a volume copied by ``lakemirror replicate`` (``root``: :func:`replicate_dir`)."""
    return Path(root) / VOLUMES_DIR / target_slug
