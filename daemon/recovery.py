"""``lakemirror recovery-point`` and ``GET /api/recovery-point``: a recovery point consistent across
a pipeline's tables (:mod:`lakemirror.supervisor.recovery.recovery_point`), read from its checkpoint table and
replicas, optionally pinned as shallow clones.

Both take the same inputs: ``at`` (an instant: ISO 8601, a naive one read as UTC, or seconds since the
epoch; default the newest instant every replica has reached), ``anchor`` (a table whose commit times
are the only candidates) and ``tables`` (default every table with applied batches)."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any, Sequence, TextIO

from lakemirror.daemon.settings import limits
from lakemirror.errors import ConfigError
from lakemirror.identifiers import TableName


#: The longest instant written out: ISO 8601 with microseconds and an offset, or epoch seconds.
MAX_INSTANT_CHARS = 64


def parse_instant(text: str, where: str = "--at") -> float:
    """Seconds since the epoch from ISO 8601 (naive: UTC) or a number; :class:`ConfigError` naming ``where``."""
    value = text.strip()
    if len(value) > MAX_INSTANT_CHARS:
        raise ConfigError([(where, f"an instant is {len(value)} characters long; one has at most {MAX_INSTANT_CHARS} "
                                   f"(2026-05-01T12:00:00.000000+00:00)")])
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError([(where, f"{text!r} is not an instant: write ISO 8601 (2026-05-01T12:00:00Z) or "
                                   f"seconds since the epoch")]) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def parse_tables(text: str | None, where: str = "--tables") -> list[str] | None:
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ConfigError([(where, "name at least one table (a,b)")])
    try:
        limits.names(names, "a table name")
    except ValueError as exc:
        raise ConfigError([(where, str(exc))]) from None
    return names


def check_name(value: str | None, where: str) -> str | None:
    """``value`` (a table or schema name given on the command line or in a query), bounded as the
    settings bound names; :class:`ConfigError` naming ``where``."""
    if value is not None:
        try:
            limits.name(value, where)
        except ValueError as exc:
            raise ConfigError([(where, str(exc))]) from None
    return value


def recovery_points_of(context: Any) -> Any:
    """The daemon context's :class:`~lakemirror.supervisor.recovery.recovery_inputs.RecoveryPoints`."""
    from lakemirror.supervisor.recovery.recovery_inputs import RecoveryPoints

    checkpoint = context.catalog.locate(TableName.parse(context.settings.effective_checkpoint_table))
    return RecoveryPoints(context.spark, context.catalog.locate, checkpoint, context.spec.pipeline_id,
                          clock=context.clock)


def cut_json(context: Any, at: float | None, anchor: str | None, only: Sequence[str] | None,
             use_source: bool = True) -> dict[str, Any]:
    """The recovery point as JSON; :class:`~lakemirror.supervisor.recovery.recovery_point.NoRecoveryPoint` if none."""
    return dict(context.recovery_points.cut(at=at, anchor=anchor, only=only, use_source=use_source).as_json())


def pin_cut(context: Any, cut: dict[str, Any], schema: str) -> list[dict[str, Any]]:
    from lakemirror.sinks.batch.recovery_pins import pin
    from lakemirror.sinks.sql import SparkSql

    return pin(SparkSql(context.spark), [(t["replica"], int(t["replica_version"])) for t in cut["tables"]], schema,
               context.catalog.locate, lambda c, s: context.catalog.ensure_schema(context.spark, c, s))


def render(cut: dict[str, Any]) -> str:
    lines = [f"recovery point: the sources as of {cut['as_of']}"
             + (f" (until {cut['valid_until']})" if cut.get("valid_until") else "")]
    width = max((len(t["table"]) for t in cut["tables"]), default=5)
    for t in cut["tables"]:
        lines.append(f"  {t['table']:<{width}}  {t['replica']} VERSION AS OF {t['replica_version']}"
                     f"   (source version {t['source_version']}, committed {t['source_committed_at']})")
    for table, notes in cut.get("notes", {}).items():
        lines += [f"  note: {table}: {n}" for n in notes]
    for p in cut.get("pinned", []):
        lines.append(f"  pinned {p['pinned']} -> {p['replica']}@{p['version']}: {p['status']}"
                     + (f" ({p['error']})" if p.get("error") else ""))
    return "\n".join(lines)


def run(settings: Any, *, at: str | None, anchor: str | None, tables: str | None, pin_schema: str | None,
        use_source: bool, as_json: bool, out: TextIO | None = None) -> int:
    """The command: 0 with a cut (and every pin done), 1 without one (reasons printed) or a failed pin."""
    from lakemirror.daemon.context import DaemonContext
    from lakemirror.supervisor.recovery.recovery_point import NoRecoveryPoint

    stream = out or sys.stdout
    instant = parse_instant(at) if at is not None else None
    only = parse_tables(tables)
    check_name(anchor, "--anchor")
    check_name(pin_schema, "--pin-schema")
    if pin_schema is not None and (not pin_schema.strip() or any(ch in pin_schema for ch in "./`")):
        raise ConfigError([("--pin-schema", f"{pin_schema!r}: a schema name without '.', '/' or '`'")])
    context = DaemonContext(settings)
    context.preflight()
    try:
        cut = cut_json(context, instant, anchor, only, use_source)
    except NoRecoveryPoint as exc:
        payload = {"error": str(exc), "reasons": exc.reasons}
        print(json.dumps(payload, indent=2) if as_json else "no recovery point: " + str(exc) + "".join(
            f"\n  {t}: {why}" for t, why in sorted(exc.reasons.items())), file=stream if as_json else sys.stderr)
        return 1
    if pin_schema is not None:
        cut["pinned"] = pin_cut(context, cut, pin_schema)
    print(json.dumps(cut, indent=2) if as_json else render(cut), file=stream)
    return 0 if all(p["status"] == "success" for p in cut.get("pinned", [])) else 1
