"""Rendering per-table and per-sub-task status as plain-text tables (`lakemirror status`, the demo)."""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

from lakemirror import __version__
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec


def status_info(spec: PipelineSpec) -> dict[str, Any]:
    """The pipeline's header in ``/status`` and in `lakemirror status --json`, daemon up or down."""
    return {"pipeline_id": spec.pipeline_id, "version": __version__,
            "source": f"{spec.source_catalog}.{spec.schema_name}",
            "destination": f"{spec.destination_catalog}.{spec.destination_schema}"}


def _fmt_lag(v: Any) -> str:
    return "-" if v is None else f"{float(v):.1f}s"


def _fmt_age(ts: Any, now: float) -> str:
    return "-" if not ts else f"{max(0.0, now - float(ts)):.0f}s ago"


def _fmt_state(r: Mapping[str, Any]) -> str:
    """The state, with a running bootstrap's chunks done and ETA (``bootstrap`` of ``/status``)."""
    boot = r.get("bootstrap")
    if not boot:
        return str(r.get("state"))
    eta = boot.get("eta_seconds")
    return (f"{r.get('state')} {boot.get('chunks_done')}/{boot.get('chunks_total')} chunks"
            + ("" if eta is None else f", ETA {float(eta):.0f}s"))


def render_table(rows: Iterable[Mapping[str, Any]], now: float | None = None) -> str:
    now = time.time() if now is None else now
    header = ("TABLE", "STATE", "LAG", "BEHIND", "APPLIED@V", "ROWS", "BATCHES", "LAST BATCH", "LAST ERROR")
    lines = [header]
    for r in rows:
        error = r.get("last_error") or ""
        if r.get("state") == "degraded" and r.get("next_retry_at"):
            error = f"retry in {max(0.0, float(r['next_retry_at']) - now):.0f}s: {error}"
        lines.append((
            str(r.get("table")), _fmt_state(r), _fmt_lag(r.get("lag_seconds")),
            "-" if r.get("versions_behind") is None else str(r.get("versions_behind")),
            "-" if r.get("applied_through") is None else str(r.get("applied_through")),
            str(r.get("rows_applied", 0)), str(r.get("batches", 0)),
            _fmt_age(r.get("last_batch_at"), now), error[:80]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in lines)


def _fmt_in(ts: Any, now: float) -> str:
    return "-" if not ts else f"in {max(0.0, float(ts) - now):.0f}s"


def render_subtasks(rows: Iterable[Mapping[str, Any]], now: float | None = None) -> str:
    """The scheduled sub-tasks of ``/status`` (empty string when there are none)."""
    now = time.time() if now is None else now
    header = ("SUB-TASK", "SCHEDULE", "STATE", "NEXT RUN", "LAST RUN", "LAST OUTCOME", "LAST ERROR")
    lines = [header]
    for r in rows:
        lines.append((str(r.get("task")), str(r.get("schedule")), "running" if r.get("running") else "idle",
                      _fmt_in(r.get("next_run_at"), now), _fmt_age(r.get("last_started_at"), now),
                      str(r.get("last_outcome") or "-"), str(r.get("last_error") or "")[:80]))
    if len(lines) == 1:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in lines)


def render_apply_paths(rows: Iterable[Mapping[str, Any]]) -> str:
    """How each change-feed table's batches reach its replica (``detail.apply`` of ``/status``): the
    path and its reason, and why the latest batch took another path if it did; empty when none is known."""
    lines = []
    for r in rows:
        d = r.get("detail")
        apply = d.get("apply") if isinstance(d, Mapping) else None
        if not isinstance(apply, Mapping):
            continue
        note = f" (latest batch: {apply['latest_batch']})" if apply.get("latest_batch") else ""
        lines.append(f"{r.get('table')}: {apply.get('path')}: {apply.get('reason')}{note}")
    return "apply paths:\n" + "\n".join(f"  {line}" for line in lines) if lines else ""


def render_feed_letters(rows: Iterable[Mapping[str, Any]]) -> str:
    """The change-feed tables' dead letters waiting for the operator (``detail.dead_letters_pending``
    of ``/status``); empty when none waits."""
    waiting = []
    for r in rows:
        d = r.get("detail")
        n = d.get("dead_letters_pending") if isinstance(d, Mapping) else None
        if isinstance(n, int) and n > 0:
            waiting.append(f"{r.get('table')} {n}")
    if not waiting:
        return ""
    return ("dead letters pending: " + ", ".join(waiting)
            + " (`lakemirror dead-letters CONFIG` lists them; skip or replay them there)")


def render_event_sources(rows: Iterable[Mapping[str, Any]]) -> str:
    """Each event source's replicas (rows by operation, guard drops, event-time lag), dead letters and
    Kafka offsets behind per topic-partition; empty string when the pipeline has no event source."""
    blocks = []
    for r in rows:
        d = r.get("detail")
        if not isinstance(d, Mapping) or "replicas" not in d:
            continue
        header = ("REPLICA", "INSERTED", "UPDATED", "DELETED", "STALE", "BATCHES", "EVENT LAG", "ORDERED BY")
        lines = [header]
        for table, x in (d.get("replicas") or {}).items():
            lines.append((str(table), str(x.get("inserted", 0)), str(x.get("updated", 0)), str(x.get("deleted", 0)),
                          str(x.get("stale", 0)), str(x.get("batches", 0)), _fmt_lag(x.get("event_lag_seconds")),
                          str(x.get("position_basis") or "-")))
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        table_text = "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(line)).rstrip() for line in lines)
        behind = ", ".join(f"{o['topic']}[{o['partition']}] {o['behind']}" for o in d.get("offsets_behind") or ())
        pending = d.get("dead_letters_pending") or {}
        waiting = sum(pending.values()) if isinstance(pending, Mapping) else 0
        letters = f"dead letters {d.get('dead_letters', 0)}" + (
            f" ({waiting} pending: " + ", ".join(f"{t or '?'} {n}" for t, n in sorted(pending.items())) + ")"
            if waiting else "")
        blocks.append(f"event source {d.get('source')} ({d.get('kind')}): {letters}; "
                      f"offsets behind: {behind or '-'}\n{table_text}")
    return "\n\n".join(blocks)
