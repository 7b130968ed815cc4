"""The ``lakemirror`` command line: thin commands that build a context (:mod:`lakemirror.daemon.context`)
and call one method."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from lakemirror import __version__
from lakemirror.checkpoints.lease import LeaseHeld, LeaseLost, LeaseUnreachable
from lakemirror.daemon import dead_letters_cli
from lakemirror.daemon.exit_codes import EXIT_CONFIG as EXIT_CONFIG
from lakemirror.daemon.exit_codes import EXIT_DRAIN_INCOMPLETE as EXIT_DRAIN_INCOMPLETE
from lakemirror.daemon.exit_codes import EXIT_FAILED as EXIT_FAILED
from lakemirror.daemon.exit_codes import EXIT_OK as EXIT_OK
from lakemirror.daemon.jars import JarsMissing
from lakemirror.daemon.preflight import StartupError
from lakemirror.daemon.java_check import JavaMissing
from lakemirror.errors import ConfigError
from lakemirror.secrets import redact

#: The demo's HTTP port unless ``--port`` says otherwise.
DEMO_PORT = 9464


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from lakemirror.daemon.settings import parse_set_flags

    out: dict[str, Any] = parse_set_flags(getattr(args, "set", None) or [])
    if getattr(args, "trigger_interval_seconds", None) is not None:
        out["trigger_interval_seconds"] = args.trigger_interval_seconds
    runtime: dict[str, Any] = out.setdefault("runtime", {})
    if getattr(args, "spark_remote", None):
        runtime.update(mode="connect", spark_remote=args.spark_remote)
    if getattr(args, "warehouse", None):
        runtime["warehouse"] = args.warehouse
    if getattr(args, "http_port", None) is not None:
        out.setdefault("http", {})["port"] = args.http_port
    if not runtime:
        out.pop("runtime")
    return out


def _load(args: argparse.Namespace) -> Any:
    from lakemirror.daemon.settings import load_settings

    return load_settings(args.config, _overrides(args))


def _print_problems(err: ConfigError) -> int:
    print(f"invalid configuration ({len(err.problems)} problem{'s' if len(err.problems) != 1 else ''}):",
          file=sys.stderr)
    for where, msg in err.problems:
        print(f"  {where}: {msg}", file=sys.stderr)
    return EXIT_CONFIG


def cmd_validate(args: argparse.Namespace) -> int:
    settings = _load(args)
    tables = ", ".join(settings.tables) if settings.tables is not None else "every table of the schema"
    print(redact(f"{args.config}: valid. Pipeline {settings.effective_pipeline_id}: "
                 f"{settings.source_catalog}.{settings.schema_name} -> "
                 f"{settings.destination_catalog}.{settings.destination_schema or settings.schema_name} ({tables})."))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    settings = _load(args)  # a bad file is refused before the daemon's modules (Spark's among them) load
    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.progress_bar import attach
    from lakemirror.daemon.signals import ShutdownSignals
    from lakemirror.supervisor.control.observer import Observers

    signals = ShutdownSignals()
    signals.install()
    context = DaemonContext(settings, config_file=str(Path(args.config).absolute()))
    bar = attach(sys.stderr)  # a terminal: the bootstrap's progress bar below the log lines
    if bar is not None:
        context.replace(observer=Observers(context.metrics, bar))
    # As the program itself, the process ends within the drain's bound whatever hangs (main() ends it).
    # Not on Databricks: there the job's own Python process runs the entry point, and ends the run.
    args.ends_process = getattr(args, "own_process", False) and settings.runtime.mode != "databricks"
    guard = None
    if args.ends_process:
        from lakemirror.daemon.drain import EXIT_GRACE_SECONDS, ExitGuard

        guard = ExitGuard(lambda: signals.stop.is_set() or context.lease_lost.is_set(),
                          settings.drain_timeout_seconds + EXIT_GRACE_SECONDS, context.abandon).start()
    try:
        outcome = context.run(signals.stop)
    finally:
        if guard is not None:
            guard.disarm()
    return EXIT_OK if outcome is None or outcome.complete else EXIT_DRAIN_INCOMPLETE


def _daemon_url(settings: Any) -> str | None:
    """The running daemon's endpoint, as it recorded it in its pipeline folder."""
    from lakemirror.checkpoints import layout

    endpoint = layout.daemon_file(layout.pipeline_dir(Path(settings.checkpoint_volume).expanduser(),
                                                      settings.effective_pipeline_id))
    try:
        url = json.loads(endpoint.read_text())["url"] if endpoint.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # being rewritten, or not the daemon's: as if no daemon ran
    return url if isinstance(url, str) else None


def _control_token(settings: Any) -> str | None:
    """The bearer token for the daemon's control routes: ``http.auth_token``, else the one the running
    daemon generated (:mod:`lakemirror.daemon.http_token`); TokenUnreadable when that file is not ours."""
    from lakemirror.checkpoints import layout
    from lakemirror.daemon import http_token

    if settings.http.auth_token is not None:
        return str(settings.http.auth_token.get_secret_value())
    if settings.http.auth == "none":
        return None
    return http_token.read(layout.pipeline_dir(Path(settings.checkpoint_volume).expanduser(),
                                               settings.effective_pipeline_id))


def cmd_control(args: argparse.Namespace) -> int:
    """pause / resume / resync one table of the running daemon (through its HTTP endpoint)."""
    from urllib.error import HTTPError
    from urllib.parse import quote

    from lakemirror.daemon.settings.limits import MAX_NAME_CHARS

    if len(args.table) > MAX_NAME_CHARS:
        print(f"lakemirror {args.command}: TABLE is {len(args.table)} characters long; a table name has at most "
              f"{MAX_NAME_CHARS}", file=sys.stderr)
        return EXIT_CONFIG
    settings = _load(args)
    url = args.url or _daemon_url(settings)
    if not url:
        print(f"no running daemon for pipeline {settings.effective_pipeline_id} (no daemon.json under "
              f"{settings.checkpoint_volume}); start it with `lakemirror run`, or pass --url", file=sys.stderr)
        return EXIT_FAILED
    from lakemirror.daemon.http_token import TokenUnreadable

    try:
        token = _control_token(settings)
    except TokenUnreadable as exc:
        print(f"lakemirror {args.command} {args.table}: no token for the daemon's control API: {exc}", file=sys.stderr)
        return EXIT_FAILED
    request = urllib.request.Request(f"{url.rstrip('/')}/tables/{quote(args.table, safe='')}/{args.command}",
                                     data=b"", method="POST")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
    except HTTPError as exc:
        try:
            reason = json.loads(exc.read() or b"{}").get("error", exc.reason)
        except (ValueError, AttributeError, OSError):
            reason = exc.reason  # not the daemon's JSON: something else answers there
        print(f"lakemirror {args.command} {args.table}: refused ({exc.code}): {redact(str(reason), (token or '',))}",
              file=sys.stderr)
        return EXIT_FAILED
    except (OSError, ValueError) as exc:  # ValueError: a URL or header http.client cannot send
        print(f"lakemirror {args.command} {args.table}: the daemon at {url} did not answer "
              f"({redact(f'{type(exc).__name__}: {exc}', (token or '',))})", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.command} {args.table}: accepted; `lakemirror status` shows the table's state")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """The daemon's ``/status``, or without a daemon the same shape from the pipeline's records."""
    url = args.url
    if url is None and args.config:
        url = _daemon_url(_load(args))
    if url:
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/status", timeout=5) as resp:
                payload = json.load(resp)
        except OSError as exc:
            print(f"the daemon at {url} did not answer ({exc}); reading the pipeline's records instead",
                  file=sys.stderr)
        else:
            _print_status(payload, args.json)
            return EXIT_OK
    if not args.config:
        print("give CONFIG (to find the daemon or its checkpoint table) or --url", file=sys.stderr)
        return EXIT_CONFIG
    _print_status(_status_from_records(_load(args)), args.json)
    return EXIT_OK


def _print_status(payload: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
        return
    from lakemirror.daemon.status import (render_apply_paths, render_event_sources, render_feed_letters,
                                          render_subtasks, render_table)

    subtasks = render_subtasks(payload.get("subtasks", []))
    events = render_event_sources(payload["tables"])
    paths = render_apply_paths(payload["tables"])
    letters = render_feed_letters(payload["tables"])
    print(render_table(payload["tables"]) + (f"\n\n{letters}" if letters else "") + (f"\n\n{paths}" if paths else "")
          + (f"\n\n{events}" if events else "") + (f"\n\n{subtasks}" if subtasks else ""))


def _status_from_records(settings: Any) -> dict[str, Any]:
    """Status when no daemon answers: without Spark where the records are on this machine
    (:mod:`lakemirror.daemon.offline_status`), else the checkpoint table through a Spark session."""
    from lakemirror.daemon.offline_status import offline_status, payload

    found = offline_status(settings)
    return found if found is not None else payload(settings, _status_with_spark(settings))


def _status_with_spark(settings: Any) -> list[Any]:
    """The checkpoint table read by Spark (a catalog only Spark can reach: Unity Catalog)."""
    from pyspark.sql import functions as F

    from lakemirror import tables
    from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
    from lakemirror.checkpoints.offline import summarize
    from lakemirror.checkpoints.records import CheckpointRow
    from lakemirror.daemon.context import DaemonContext
    from lakemirror.supervisor.control.loop import TableView

    app = DaemonContext(settings)
    app.preflight()  # what the mode needs, as one line, before Spark starts
    store = app.checkpoints
    assert isinstance(store, DeltaCheckpointStore)
    loc = store.location
    if not tables.exists(app.spark, loc):
        return []
    data = tables.read(app.spark, loc).where(F.col("pipeline_id") == F.lit(app.spec.pipeline_id)).collect()
    summaries = summarize(CheckpointRow(**r.asDict()) for r in data)
    return [TableView(table=fqn, state="degraded" if s.latest.degraded else "stopped",
                      lag_seconds=s.latest.lag_seconds, versions_behind=None,
                      applied_through=s.latest.last_committed_version, rows_applied=s.rows_applied,
                      batches=s.batches, failures=0, retries=0, next_retry_at=None, last_error=s.latest.error,
                      last_batch_at=s.last_batch.ended_at.timestamp() if s.last_batch else None)
            for fqn, s in summaries.items()]


def cmd_fetch_jars(args: argparse.Namespace) -> int:
    from lakemirror.daemon.jars import OPTIONAL_PACKAGES, FetchFailed, JarsMissing, fetch_missing, jar_paths

    if args.check:
        try:
            counts = [f"{len(jar_paths(args.dest))} jars cached"]
            counts += [f"{len(jar_paths(args.dest, g))} {g} jars" for g in OPTIONAL_PACKAGES]
        except JarsMissing as exc:
            print(exc, file=sys.stderr)
            return EXIT_FAILED
        print(", ".join(counts))
        return EXIT_OK
    try:
        written = fetch_missing(args.dest, refresh=args.refresh)
    except FetchFailed as exc:
        print(f"fetch-jars: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print("\n".join(f"jars cached in {folder}" for folder in written) or "every jar group is already cached")
    return EXIT_OK


def cmd_build_class_archive(args: argparse.Namespace) -> int:
    import subprocess

    from lakemirror.daemon.class_archive import build

    try:
        path, written = build(force=args.force)
    except (JarsMissing, JavaMissing, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"build-class-archive: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"class archive {'recorded' if written else 'already recorded'}: {path}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """The live demo: development tools (``lakemirror.tools``), imported only by this command."""
    if args.source == "debezium":
        from lakemirror.tools.demo_debezium import run_debezium_demo

        return run_debezium_demo(workdir=Path(args.workdir), duration=args.duration, http_port=args.http_port)
    from lakemirror.tools.demo import run_demo

    return run_demo(workdir=Path(args.workdir), duration=args.duration, http_port=args.http_port)


def cmd_replicate(args: argparse.Namespace) -> int:
    """Batch clone / reconcile / metadata sync; exit 0 only if every object succeeded."""
    from lakemirror.daemon.settings.replicate import cli_overrides, load_replicate_config

    cli = cli_overrides(args.target_catalog, args.target_schemas, args.operation, args.uc_object_types)
    config = load_replicate_config(args.config, cli)
    if args.validate_only:
        print(f"{args.config}: valid ({len(config.selected_catalogs())} catalog(s), max_workers {config.max_workers}).")
        return EXIT_OK
    from lakemirror.daemon.context import ReplicateContext

    summary = ReplicateContext(config).run()
    for o in summary.failed:
        print(f"FAILED {o.operation} {o.job.source} -> {o.job.target} after {o.attempts} attempt(s): {o.error}",
              file=sys.stderr)
    print(f"run {summary.run_id}: {len(summary.outcomes) - len(summary.failed)} succeeded, "
          f"{len(summary.failed)} failed")
    return EXIT_OK if summary.ok else EXIT_FAILED


def cmd_recovery_point(args: argparse.Namespace) -> int:
    """A recovery point consistent across the pipeline's tables (see lakemirror.daemon.recovery)."""
    from lakemirror.daemon.recovery import run

    return run(_load(args), at=args.at, anchor=args.anchor, tables=args.tables, pin_schema=args.pin_schema,
               use_source=not args.source_unreachable, as_json=args.json)


def _add_config_flags(p: argparse.ArgumentParser, required: bool = True) -> None:
    """The pipeline file, and ``--set`` (every command that reads the file may need to override it)."""
    p.add_argument("config", nargs=None if required else "?", help="pipeline YAML file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a setting of the file, e.g. runtime.master=local[4] (repeatable; environment "
                        "variables LAKEMIRROR_<FIELD> work too)")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """Shortcuts for settings a daemon run often overrides (``run`` only)."""
    p.add_argument("--trigger-interval-seconds", type=float, metavar="SECONDS",
                   help="how often each table's query looks for new source commits (trigger_interval_seconds)")
    p.add_argument("--spark-remote", metavar="sc://HOST:PORT",
                   help="run through a Spark Connect server (runtime.mode connect, runtime.spark_remote)")
    p.add_argument("--warehouse", metavar="DIR", help="local mode: the lakehouse directory (runtime.warehouse)")
    p.add_argument("--http-port", type=int, metavar="PORT",
                   help="port of /metrics, /status and the status page (http.port; 0: any free port)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakemirror", description="Live, exact replicas of Delta tables.")
    parser.add_argument("--version", action="version", version=f"lakemirror {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="the least severe log records written to stderr (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="what to do (`lakemirror COMMAND --help` says more)")
    p = sub.add_parser("run", help="run the replication daemon until SIGTERM")
    _add_config_flags(p)
    _add_run_flags(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("validate", help="check a config file; exit 2 listing every problem")
    _add_config_flags(p)
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("status", help="per-table state and lag, from the daemon or its checkpoint table")
    _add_config_flags(p, required=False)
    p.add_argument("--url", help="the daemon's HTTP endpoint, e.g. http://127.0.0.1:9464")
    p.add_argument("--json", action="store_true", help="print the status as JSON instead of a table")
    p.set_defaults(func=cmd_status)
    for verb, what in (("pause", "stop replicating a table (kept across restarts)"),
                       ("resume", "resume a paused or failed table"),
                       ("resync", "rebuild a table's replica from a new snapshot (new epoch)")):
        p = sub.add_parser(verb, help=f"{what}, in the running daemon")
        _add_config_flags(p)
        p.add_argument("table", help="the table's name in the source schema")
        p.add_argument("--url", help="the daemon's HTTP endpoint (default: the one it recorded)")
        p.set_defaults(func=cmd_control)
    dead_letters_cli.add_parser(sub)
    p = sub.add_parser("demo", help="a live demo on the embedded lakehouse (until Ctrl-C)")
    p.add_argument("--workdir", default=".lakemirror-demo", metavar="DIR",
                   help="where the demo's lakehouse, checkpoints and logs go (default .lakemirror-demo)")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS", help="stop after this many seconds")
    p.add_argument("--port", "--http-port", dest="http_port", type=int, default=DEMO_PORT, metavar="PORT",
                   help=f"port of the demo daemon's status page and /metrics (default {DEMO_PORT}; 0: any free "
                        f"port). `make demo PORT=…` passes it")
    p.add_argument("--source", choices=["delta", "debezium"], default="delta",
                   help="delta: Delta tables' change feed (default); debezium: a PostgreSQL database through "
                        "Debezium and Kafka, all started on loopback by the project's scripts")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("replicate", help="batch clone, reconciliation, metadata sync and disaster recovery (one shot)")
    p.add_argument("config", help="replication YAML file")
    p.add_argument("--validate-only", action="store_true", help="check the config; exit 2 listing every problem")
    p.add_argument("--target-catalog", help="only the catalog entry replicating into this catalog")
    p.add_argument("--target-schemas", metavar="A,B", help="only these schemas (replaces include_schemas)")
    p.add_argument("--uc-object-types", metavar="T,…", help="metadata object types, e.g. table_tag,column_comment")
    p.add_argument("--operation", metavar="OP[,OP]", help="clone, incremental, reconcile, metadata, volume_files, "
                                                          "backup and/or uc_objects (overrides the file)")
    p.set_defaults(func=cmd_replicate)
    p = sub.add_parser("recovery-point", help="per table, the replica version showing its source as of one "
                                              "instant, the same for every table (for a consistent failover)")
    _add_config_flags(p)
    p.add_argument("--at", metavar="TIME", help="the instant (ISO 8601, UTC if no offset, or epoch seconds); "
                                                "default: the newest instant every replica has reached")
    p.add_argument("--anchor", metavar="TABLE", help="only instants at which this table committed (the table "
                                                     "each step of the writers commits last)")
    p.add_argument("--tables", metavar="A,B", help="only these tables (default: every table with applied batches)")
    p.add_argument("--pin-schema", metavar="SCHEMA", help="also pin the cut: a shallow clone of each replica at "
                                                          "its version, in this schema of the replica's catalog")
    p.add_argument("--source-unreachable", action="store_true",
                   help="do not read the sources (they are lost): use what the replicas' side recorded")
    p.add_argument("--json", action="store_true", help="print the recovery point as JSON instead of a table")
    p.set_defaults(func=cmd_recovery_point)
    p = sub.add_parser("fetch-jars", help="resolve Delta's jars (and hadoop-aws for s3a://) from Maven Central into the local cache")
    p.add_argument("--dest", help="target folder (default ~/.cache/lakemirror/jars-…)")
    p.add_argument("--check", action="store_true", help="only check that the jars are cached")
    p.add_argument("--refresh", action="store_true", help="fetch every group again, even those already cached")
    p.set_defaults(func=cmd_fetch_jars)
    p = sub.add_parser("build-class-archive", help="record the driver JVM's class archive, which every later "
                                                   "embedded session maps to start sooner (make setup runs it)")
    p.add_argument("--force", action="store_true", help="record it again, even if this JVM, Spark and jars have one")
    p.set_defaults(func=cmd_build_class_archive)
    return parser


class DrainRefusals(logging.Filter):
    """Drops py4j's error record, with its traceback, of a batch refused because the daemon drains.

    py4j logs every exception a ``foreachBatch`` callback raises. A batch that begins after SIGTERM
    is refused on purpose (nothing applied; the next run applies it) and the drain already logs
    that it is draining, so that refusal is not an error. Every other exception is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        from lakemirror.supervisor.change_feed.table_runner import Drained

        return not (record.exc_info and isinstance(record.exc_info[1], Drained))


#: Arrow's default allocator keeps the memory it frees for reuse, so the driver path's Arrow batches
#: kept the daemon's Python process at its largest batch's size; the system allocator gives freed
#: memory back, at no cost in lag (``make bench ONLY=steady`` reports the daemon's peak resident
#: memory). A user's own setting wins.
ARROW_POOL_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system"}


def main(argv: Sequence[str] | None = None) -> int:
    """The ``lakemirror`` program: run the command ``argv`` names (default: the process's arguments)
    and return its exit code.

    As the program itself (no ``argv``), ``run`` also ends the process as soon as the daemon has
    stopped (:func:`lakemirror.daemon.drain.end_process`), without waiting for other libraries' exit
    work, and from its stop's request on holds it to ``drain_timeout_seconds`` and a few seconds
    (except in Databricks mode, where the job's Python process runs the entry point)."""
    for key, value in ARROW_POOL_ENV.items():
        os.environ.setdefault(key, value)  # before pyarrow is first imported
    args = build_parser().parse_args(argv)
    args.own_process, args.ends_process = argv is None, False
    try:
        code = _dispatch(args)
    except BaseException:
        if not args.ends_process:
            raise
        import traceback

        traceback.print_exc()  # an unforeseen error: its traceback, then the same quick exit
        code = EXIT_FAILED
    if args.ends_process:
        from lakemirror.daemon.drain import end_process

        end_process(code)
    return code


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("py4j.clientserver").addFilter(DrainRefusals())
    try:
        return int(args.func(args))
    except ConfigError as err:
        return _print_problems(err)
    except LeaseHeld as err:  # another daemon runs the pipeline: a configuration matter, like a clash of ids
        print(f"lakemirror: cannot start: {redact(str(err))}", file=sys.stderr)
        return EXIT_CONFIG
    except LeaseUnreachable as err:
        from lakemirror.daemon.lease import unreachable_advice

        print(f"lakemirror: cannot start: {redact(unreachable_advice(err))}", file=sys.stderr)
        return EXIT_FAILED
    except LeaseLost as err:
        print(f"lakemirror: {redact(str(err))}", file=sys.stderr)
        return EXIT_FAILED
    except StartupError as err:
        print(f"lakemirror: cannot start: {redact(str(err))}", file=sys.stderr)
        return EXIT_FAILED
    except (JarsMissing, JavaMissing) as err:
        print(f"lakemirror: {redact(str(err))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
