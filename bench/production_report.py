"""docs/BENCHMARKS.md's section for `make bench ONLY=production`, with the issue's goals judged (pure).

The goals, each a ratio of p99 lags taken in one run on one machine, per writer of the sources and
table count (:data:`RATIO_GOALS`); the daemon's own ``lakemirror_lag_seconds`` against the same
statistic taken from outside at the moments of its scrapes, at p50 and at max, within
:data:`LAG_AGREEMENT` in every lakemirror row; every replica exact. A goal whose rows are missing,
failed, measured in different runs, or did not take the path the goal is about is reported as not
judged, with the reason, never as met.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from bench.production import ROWS, SYSTEMS
from bench.systems import DRIVER_PATH


@dataclass(frozen=True)
class RatioGoal:
    """``subject``'s p99 at most ``limit`` times ``baseline``'s (row keys), at ``tables``."""

    subject: str
    baseline: str
    limit: float
    tables: tuple[int, ...]
    text: str


RATIO_GOALS = (
    RatioGoal("driver", "loop", 1.5, (4, 16), "S3 driver path: p99 <= 1.5x the delta-rs loop's"),
    RatioGoal("spark", "recipe", 0.5, (4, 16), "Spark-only path: p99 <= 0.5x the user recipe's"),
    RatioGoal("connect", "spark", 1.25, (4,), "Spark Connect: p99 <= 1.25x the classic Spark-only path's"),
)
#: How far the daemon's lag metric may be from the outside measure (relative to the outside one).
LAG_AGREEMENT = 0.20


@dataclass(frozen=True)
class Verdict:
    goal: str
    writer: str
    tables: int | None
    measured: str
    limit: str
    met: bool | None  # None: not judged (``note`` says why)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"goal": self.goal, "writer": self.writer, "tables": self.tables, "measured": self.measured,
                "limit": self.limit, "met": self.met, "note": self.note}


def _row_key(run: dict[str, Any]) -> str | None:
    if run.get("row"):
        return str(run["row"])
    row = SYSTEMS.get(run.get("system", ""))
    return row.key if row is not None else None


def _p99(run: dict[str, Any]) -> float:
    return float(run["lag"]["p99"])


def off_path(run: dict[str, Any]) -> list[str]:
    """The tables of a lakemirror run whose batches did not take the path its row is about."""
    row = ROWS.get(_row_key(run) or "")
    if row is None or row.expected_path is None:
        return []
    want = DRIVER_PATH if row.expected_path == "driver" else row.expected_path
    paths = run.get("apply_paths") or {}
    return sorted(t for t, a in paths.items() if a.get("path") != want)


def ratio_verdicts(runs: Iterable[dict[str, Any]]) -> list[Verdict]:
    """Each ratio goal at each (writer, table count) where its subject or baseline ran."""
    index: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in runs:
        key = _row_key(r)
        if key is not None:
            index[(r.get("writer", "delta-rs"), int(r["tables"]), key)] = r
    out = []
    for goal in RATIO_GOALS:
        cells = sorted({(w, n) for (w, n, k) in index if k in (goal.subject, goal.baseline)})
        for writer, n in cells:
            subject, baseline = index.get((writer, n, goal.subject)), index.get((writer, n, goal.baseline))
            limit = f"{goal.limit:.2f}x"
            missing = [ROWS[k].name for k, r in ((goal.subject, subject), (goal.baseline, baseline)) if r is None]
            failed = [r["system"] for r in (subject, baseline) if r is not None and "error" in r]
            if missing or failed:
                why = "; ".join([*(f"no {m} run" for m in missing), *(f"the {f} run failed" for f in failed)])
                out.append(Verdict(goal.text, writer, n, "-", limit, None, why))
                continue
            assert subject is not None and baseline is not None
            ratio = _p99(subject) / _p99(baseline) if _p99(baseline) > 0 else math.nan
            measured = "-" if math.isnan(ratio) else f"{ratio:.2f}x ({_p99(subject):.2f} / {_p99(baseline):.2f} s)"
            notes = []
            if math.isnan(_p99(subject)) or math.isnan(_p99(baseline)):
                notes.append("no commit of the measured window applied by one of them")
            if subject.get("run_id") != baseline.get("run_id"):
                notes.append("the two rows come from different runs")
            astray = off_path(subject)
            if astray:
                notes.append(f"{subject['system']} did not take its path for {', '.join(astray)}: not a measure of it")
            if n not in goal.tables:
                notes.append(f"the goal is set at {' and '.join(map(str, goal.tables))} tables")
            judged = not notes and not math.isnan(ratio)
            out.append(Verdict(goal.text, writer, n, measured, limit, (ratio <= goal.limit) if judged else None,
                               "; ".join(notes)))
    return out


def within(metric: float | None, outside: float | None, tolerance: float = LAG_AGREEMENT) -> bool | None:
    """Whether ``metric`` is within ``tolerance`` of ``outside`` (relative to it); both 0 agree.
    None when either is missing."""
    if metric is None or outside is None or math.isnan(metric) or math.isnan(outside):
        return None
    if outside == 0:
        return metric == 0
    return abs(metric - outside) <= tolerance * abs(outside)


def lag_agreement(run: dict[str, Any]) -> dict[str, Any] | None:
    """The daemon's metric against the outside measure at its scrapes' moments, at p50 and at max;
    None for a run without the metric (the recipe, the loop)."""
    d = run.get("daemon_metric_lag")
    if not d:
        return None
    out: dict[str, Any] = {"samples": d.get("samples", 0)}
    for stat in ("p50", "max"):
        metric, outside = d.get(stat), d.get(f"outside_{stat}")
        out[stat] = {"metric": metric, "outside": outside, "agree": within(metric, outside)}
    return out


def lag_verdicts(runs: Iterable[dict[str, Any]]) -> list[Verdict]:
    out = []
    for r in runs:
        if "error" in r:
            continue
        agreement = lag_agreement(r)
        if agreement is None:
            continue
        stats = [agreement[stat] for stat in ("p50", "max")]
        goal = f"lag metric within {LAG_AGREEMENT:.0%} of the outside measure: {r['system']}"
        if not agreement["samples"] or any(a["agree"] is None for a in stats):
            why = "no scrape of the metric in the measured window" if not agreement["samples"] else \
                "no outside figure at the scrapes' moments (a run from before it was taken)"
            out.append(Verdict(goal, r.get("writer", "delta-rs"), int(r["tables"]), "-", f"±{LAG_AGREEMENT:.0%}",
                               None, why))
            continue
        measured = "; ".join(f"{stat} {a['metric']:.2f} vs {a['outside']:.2f} s" for stat, a in zip(("p50", "max"), stats))
        clock = "" if r["daemon_metric_lag"].get("outside_clock") else \
            "outside clock: writer's return"
        out.append(Verdict(goal, r.get("writer", "delta-rs"), int(r["tables"]), measured, f"±{LAG_AGREEMENT:.0%}",
                           all(bool(a["agree"]) for a in stats), clock))
    return out


def exact_verdicts(runs: Iterable[dict[str, Any]]) -> list[Verdict]:
    """Per writer: every replica of every run equal to its source."""
    by_writer: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_writer.setdefault(r.get("writer", "delta-rs"), []).append(r)
    out = []
    for writer, group in sorted(by_writer.items()):
        done = [r for r in group if "error" not in r]
        wrong = [f"{r['system']} at {r['tables']}" for r in done if not r.get("replicas_equal_sources")]
        failed = [f"{r['system']} at {r['tables']}" for r in group if "error" in r]
        note = "; ".join([*(f"not exact: {w}" for w in wrong), *(f"failed: {f}" for f in failed)])
        out.append(Verdict("replicas exact in every row", writer, None, f"{len(done) - len(wrong)} of {len(group)} runs",
                           "all", not wrong and not failed, note))
    return out


def verdicts(runs: list[dict[str, Any]]) -> list[Verdict]:
    return [*ratio_verdicts(runs), *lag_verdicts(runs), *exact_verdicts(runs)]


def _met(v: Verdict) -> str:
    return "not judged" if v.met is None else ("met" if v.met else "**missed**")


def goals_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["| goal | sources written by | tables | measured | limit | verdict | note |",
             "|---|---|---|---|---|---|---|"]
    for v in verdicts(runs):
        lines.append(f"| {v.goal} | {v.writer} | {v.tables if v.tables is not None else 'all'} | {v.measured} | "
                     f"{v.limit} | {_met(v)} | {v.note or '-'} |")
    return lines


def _paths(run: dict[str, Any]) -> str:
    paths = run.get("apply_paths")
    if not paths:
        return ""
    by_path: dict[str, list[str]] = {}
    for table, a in sorted(paths.items()):
        by_path.setdefault(a.get("path", "unknown"), []).append(table)
    first = next(iter(sorted(paths.items())))[1]
    text = "; ".join(f"{p} for {len(ts)} of {len(paths)} tables" for p, ts in sorted(by_path.items()))
    return f"; apply path: {text} (e.g. \"{first.get('reason', '')}\")"


def _writer(run: dict[str, Any]) -> str:
    seconds = (run.get("warmup_seconds") or 0) + run.get("seconds", 0)
    if not seconds or not run.get("tables"):
        return ""
    rate = run.get("source_commits", 0) / seconds / run["tables"]
    return f"; the writer made {run.get('source_commits', 0)} commits ({rate:.2f} a table a second)"


def _agreement(run: dict[str, Any]) -> str:
    a = lag_agreement(run)
    if a is None or not a["samples"]:
        return ""
    parts = []
    for stat in ("p50", "max"):
        s = a[stat]
        if s["agree"] is None:
            continue
        parts.append(f"{stat} {s['metric']:.2f} s against {s['outside']:.2f} s outside "
                     f"({'within' if s['agree'] else 'NOT within'} {LAG_AGREEMENT:.0%})")
    return f"; `lakemirror_lag_seconds` {', '.join(parts)}" if parts else ""


def _server(run: dict[str, Any]) -> str:
    if "connect_server_start_seconds" not in run:
        return ""
    m = run.get("peak_resident_mib") or {}
    return (f"; the Connect server's peak RSS {m.get('server jvm', 0):.0f} MiB JVM + "
            f"{m.get('server python', 0):.0f} MiB Python workers, its start {run['connect_server_start_seconds']} s")


def render(runs: list[dict[str, Any]], p: dict[str, Any], steady_table: Callable[..., list[str]]) -> list[str]:
    """The section (``steady_table``: bench.__main__'s lag table, with a base system to compare to)."""
    title = "## The production shapes on S3: lakemirror's paths, the user's recipe, the delta-rs loop"
    failed = [r for r in runs if "error" in r]
    done = [r for r in runs if "error" not in r]
    if not done:
        return [title, "", *(f"- {r['system']}, {r.get('writer', 'delta-rs')} writer, {r['tables']} tables: "
                            f"failed: {r['error']}" for r in failed)]
    r0 = min(done, key=lambda r: r["measured_at"])
    runs_ids = {r.get("run_id") for r in runs}
    recipe = ROWS["recipe"].name
    lines = [title, "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(r0['measured_at']))}"
             + (f", rows from {len(runs_ids)} runs (each row's time below)" if len(runs_ids) > 1 else "") + ". "
             "Sources and replicas in a bucket of moto's S3 server on loopback (scripts/s3-server.sh): `s3a://` "
             "for Spark, `s3://` for delta-rs. The rows: the **user recipe** (bench/recipe.py, its own process and "
             "JVM): one always-on `readChangeFeed` stream per table, `foreachBatch` keeping the last change per key "
             "and MERGEing it under Delta's `txnAppId`/`txnVersion` confs, Spark's and Delta's defaults otherwise; "
             "lakemirror with `driver_apply: true` (**S3 driver path**: a delta-rs MERGE on the driver where the "
             "daemon takes it; the path each table took is listed), with `driver_apply: false` (**Spark-only "
             "path**, as Unity Catalog replicas get) and the same over **Spark Connect** (a server started by "
             "scripts/connect-server.sh for the row), each with `kernel_change_feed: false` and its other settings "
             "at their defaults; the **delta-rs CDF loop** on the same bucket. Sources written by delta-rs (a "
             "checkpoint every 10 commits, `delta.checkpointInterval`, as Spark leaves a table) and by Spark "
             "(Delta's own writer in the benchmark's process: a `.crc` beside each commit, its checkpoints every "
             "10 commits; bench/spark_writer.py), the same changes either way: one MERGE per table a second, or as "
             f"fast as the writer goes, touching {p.get('fraction', 0.01):.0%} of the rows. "
             f"{r0['rows_per_table']:,} rows a table, trigger {p.get('trigger', 1.0)} s for every system; the "
             f"systems with a JVM measured {r0['seconds']:.0f} s after {p.get('warmup', 0):.0f} s of warm-up, the "
             f"loop from its first commit; {p.get('drain', 0):.0f} s allowed to drain. A replica commit's time is "
             "its `commitInfo.timestamp`. The daemon's `lakemirror_lag_seconds` (scraped every second, the largest "
             "over tables) is compared with the same statistic taken from outside at the moments of the scrapes "
             "(the age of the oldest source commit not yet on the replica, a source commit at its `commitInfo.timestamp` "
             "as the daemon prices it; the lags above take it when the writer's call returned). The machine's two "
             "cores also run the "
             "writer and the S3 server; each run's `uptime` at its start is listed.", "",
             "### Goals", "", *goals_table(runs), ""]
    several_commits = len({r.get("commit") for r in done}) > 1  # the heading names one of them
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in done:
        groups.setdefault((r.get("writer", "delta-rs"), int(r["tables"])), []).append(r)
    for (writer, n), group in sorted(groups.items()):
        base = recipe if any(r["system"] == recipe for r in group) else group[0]["system"]
        lines += [f"### Sources written by {writer}, {n} tables", "", *steady_table(group, base), ""]
        for r in group:
            when = time.strftime("%H:%M UTC", time.gmtime(r["measured_at"]))
            if several_commits and r.get("commit"):
                when += f" at `{r['commit']}`"
            lines.append(f"- {r['system']} ({when}): `uptime` at start: `{r.get('uptime_at_start', '?')}`"
                         f"{_writer(r)}{_paths(r)}{_agreement(r)}{_server(r)}.")
            astray = off_path(r)
            if astray:
                lines.append(f"  **{r['system']} did not take its path for {', '.join(astray)}**: its figures "
                             "measure the path named above, not the driver path.")
        lines.append("")
    for r in failed:
        lines.append(f"- {r['system']}, sources written by {r.get('writer', 'delta-rs')}, {r['tables']} tables: "
                     f"the run failed: {r['error']}")
    return lines
