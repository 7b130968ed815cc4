"""docs/BENCHMARKS.md as a report, assembled from docs/bench/results.json.

One section per workload, in :data:`ORDER`: the default configuration's figures first, each section
opening with the command that measured it, when, at which commit and on which machine; then the
opt-ins (``results["opt_in"]``, measured with a setting that is off by default), then notes on method.
A goals table at the top is computed from the same records, so it cannot disagree with them.

Hand-written text lives only in *kept blocks*, ``<!-- kept: <section id> -->`` … ``<!-- /kept -->``:
:func:`kept_blocks` reads them from the report being replaced and :func:`assemble` puts each back at
the end of its section (a block whose section is no longer measured goes to the end, never lost).
What was tried, and earlier figures, stay in git history.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable

KEPT_CLOSE = "<!-- /kept -->"
_KEPT = re.compile(r"<!-- kept: (\S+) -->\n(.*?)\n?<!-- /kept -->", re.S)


def kept_open(section: str) -> str:
    return f"<!-- kept: {section} -->"


@dataclass(frozen=True)
class Section:
    """One workload's part of the report: ``lines`` start with its ``## `` heading."""

    id: str
    workload: str
    records: list[dict[str, Any]]
    lines: list[str]


#: Which opt-ins the report knows, with the sentence that introduces each.
OPT_INS: dict[str, tuple[str, str]] = {
    "kernel_change_feed": (
        "Opt-in: the Kernel-based change feed",
        "`kernel_change_feed: true` streams a path-based source's change feed with Delta's Kernel-based "
        "source, reached only through `spark.databricks.delta.v2.enableMode=STRICT`, which Delta 4.4 documents "
        "as for testing only; off by default, where `DeltaSource` reads it. It reads the source's log on the "
        "driver instead of rebuilding two snapshots of the source with Spark jobs every micro-batch (the cost "
        "of a source whose writer leaves no checksum files, as delta-rs's). These figures were measured while "
        "it was the daemon's default, with the commands below; compare them with the default's sections above."),
}


def kept_blocks(text: str) -> dict[str, str]:
    """The kept blocks of a report, by section id."""
    return {m.group(1): m.group(2).strip("\n") for m in _KEPT.finditer(text)}


def machine_text(m: dict[str, Any]) -> str:
    return (f"{m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}, PySpark {m['pyspark']}, "
            f"deltalake {m['deltalake']}, Linux {m['kernel']}")


def provenance(records: list[dict[str, Any]], workload: str, machine: dict[str, Any] | None) -> str:
    """``Measured <date> at <commit> by `<command>` on <machine>; load average <x> at start.``"""
    r0 = min(records, key=lambda r: r.get("measured_at") or 0)
    at = r0.get("measured_at")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at)) if at else "at an unrecorded time"
    commit = f" at `{r0['commit']}`" if r0.get("commit") else ""
    command = r0.get("command") or f"make bench ONLY={workload}"
    m = r0.get("machine") or machine
    load = r0.get("load_average_at_start")
    return (f"*Measured {when}{commit} by `{command}`" + (f" on {machine_text(m)}" if m else "")
            + (f"; load average {load[0]:.2f} at start" if load else "") + ".*")


# -- the goals table ---------------------------------------------------------------------------------

Figure = tuple[str, str, "bool | None"]  # lakemirror's figure, the baseline's, whether the goal is met (None: not judged)


def _one(records: list[dict[str, Any]], test: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    return next((r for r in records if test(r)), None)


def _steady(n: int, goal: float, workload: str = "steady") -> Callable[[dict[str, Any]], Figure | None]:
    def figure(results: dict[str, Any]) -> Figure | None:
        runs = [r for r in results.get(workload) or [] if r.get("tables") == n]
        lm = _one(runs, lambda r: r["system"] in ("lakemirror", "lakemirror, S3, Spark MERGE"))
        loop = _one(runs, lambda r: r["system"] == "delta-rs CDF loop")
        if lm is None:
            return None
        p99 = lm["lag"]["p99"]
        return (f"p99 {p99:.2f} s (p50 {lm['lag']['p50']:.2f} s)",
                f"delta-rs CDF loop p99 {loop['lag']['p99']:.2f} s" if loop else "-", p99 <= goal)
    return figure


def _steady_vs_loop(n: int, times: float) -> Callable[[dict[str, Any]], Figure | None]:
    """lakemirror's p99 lag at ``n`` tables against ``times`` the delta-rs loop's, in the same run."""
    def figure(results: dict[str, Any]) -> Figure | None:
        runs = [r for r in results.get("steady") or [] if r.get("tables") == n]
        lm = _one(runs, lambda r: r["system"] == "lakemirror")
        loop = _one(runs, lambda r: r["system"] == "delta-rs CDF loop")
        if lm is None or loop is None:
            return None
        ratio = lm["lag"]["p99"] / loop["lag"]["p99"]
        return (f"p99 {lm['lag']['p99']:.2f} s, {ratio:.2f}x", f"delta-rs CDF loop p99 {loop['lag']['p99']:.2f} s",
                ratio <= times)
    return figure


def _start(kind: str, n: int, limit: float) -> Callable[[dict[str, Any]], Figure | None]:
    """Seconds from process start to every table's first applied batch, for one start of ``n`` tables."""
    def figure(results: dict[str, Any]) -> Figure | None:
        r = _one(results.get("startup") or [], lambda r: r["tables"] == n and r["start"] == kind)
        if r is None or r.get("every_table_ready_s") is None:
            return None
        return (f"{r['every_table_ready_s']} s (Spark session ready at {r.get('spark_at', '-')} s)", "-",
                r["every_table_ready_s"] <= limit and bool(r["replicas_equal_sources"]))
    return figure


def _start_memory(results: dict[str, Any]) -> Figure | None:
    """Peak memory (Python + JVM) of the first starts: it must grow less than the number of tables."""
    runs = sorted((r for r in results.get("startup") or [] if r["start"] == "first start" and r.get("peak_resident_mib")),
                  key=lambda r: r["tables"])
    if len(runs) < 2:
        return None
    total = {r["tables"]: sum(r["peak_resident_mib"].values()) for r in runs}
    few, many = runs[0]["tables"], runs[-1]["tables"]
    growth = total[many] / total[few]
    return (", ".join(f"{n} table{'s' if n != 1 else ''} {mib:,.0f} MiB" for n, mib in total.items()) + f" ({growth:.2f}x for {many // few}x the tables)",
            "-", growth < many / few)


def _production(subject: str, n: int) -> Callable[[dict[str, Any]], Figure | None]:
    """A ratio goal of the production workload (bench/production_report.py), sources written by delta-rs."""
    def figure(results: dict[str, Any]) -> Figure | None:
        from bench.production_report import RATIO_GOALS, ratio_verdicts

        goal = next(g for g in RATIO_GOALS if g.subject == subject)
        verdict = next((v for v in ratio_verdicts(results.get("production") or [])
                        if v.goal == goal.text and v.tables == n and v.writer == "delta-rs"), None)
        if verdict is None:
            return None
        return (verdict.measured + (f" ({verdict.note})" if verdict.note else ""), f"limit {verdict.limit}", verdict.met)
    return figure


def _catch_up(results: dict[str, Any]) -> Figure | None:
    runs = results.get("catch_up") or []
    lm, rs = _one(runs, lambda r: r["system"] == "lakemirror"), _one(runs, lambda r: r["system"] == "delta-rs")
    if lm is None or rs is None:
        return None
    return (f"{lm['rows_per_second']:,.0f} change rows/s ({lm['drain_seconds']} s)",
            f"delta-rs {rs['rows_per_second']:,.0f} change rows/s", lm["rows_per_second"] > rs["rows_per_second"])


def _steady_cost(results: dict[str, Any]) -> Figure | None:
    runs = results.get("steady_cost") or []
    lm = _one(runs, lambda r: r["system"] == "lakemirror (deletion vectors on)")
    spark = _one(runs, lambda r: r["system"].startswith("full refresh (Spark"))
    if lm is None or spark is None:
        return None
    warm = lm["cpu_s"]["median"] / spark["cpu_s"]["median"]
    started = (f", just started {lm['started_cpu_s']['median'] / spark['started_cpu_s']['median']:.2f}x"
               if lm.get("started_cpu_s") and spark.get("started_cpu_s") else "")
    return (f"warm {warm:.3f}x{started} (deletion vectors on)",
            f"a warm Spark overwrite: {spark['cpu_s']['median']} CPU-s", warm <= 0.10)


def _bootstrap(results: dict[str, Any]) -> Figure | None:
    runs = results.get("bootstrap") or []
    floor, lm = _one(runs, lambda r: r["system"].startswith("copy floor")), _one(runs, lambda r: r["system"].startswith("lakemirror"))
    if floor is None or lm is None:
        return None
    ratio = lm["seconds_to_replica"] / floor["seconds_to_replica"]
    return (f"{lm['seconds_to_replica']} s, {ratio:.2f}x", f"copy floor {floor['seconds_to_replica']} s", ratio <= 1.2)


def _chunked(kind: str) -> Callable[[dict[str, Any]], Figure | None]:
    def figure(results: dict[str, Any]) -> Figure | None:
        runs = results.get("bootstrap_chunked") or []
        floor = _one(runs, lambda r: r.get("kind") == "floor")
        if kind == "default":
            r = _one(runs, lambda r: "default settings" in r["system"])
            forced = _one(runs, lambda r: r.get("kind") == "uninterrupted" and "public API" in r["system"])
            if r is None or floor is None:
                return None
            extra = f"; forced into {forced['chunk_commits']} chunks {forced['vs_floor']}x" if forced else ""
            return (f"{r['seconds_to_replica']} s, {r['vs_floor']}x{extra}", f"copy floor {floor['seconds_to_replica']} s",
                    r["vs_floor"] <= 1.2)
        if kind == "killed":
            r = _one(runs, lambda r: r.get("kind") == "killed")
            if r is None:
                return None
            return (f"{r['chunks_committed_twice']} chunks written twice ({r['chunks_committed_before_kill']} "
                    f"committed before the kill, {r['chunks_committed_after_restart']} after)", "-",
                    r["chunks_committed_twice"] <= 1 and r["replica_equal_source"])
        r = _one(runs, lambda r: r.get("kind") == "retention")
        if r is None or "bootstrap_seconds" not in r:
            return None
        proven = r.get("cdf_read_works") is False and r.get("vacuum_removed_first_change_by") is not None
        return (f"{'0' if r['replica_equal_source'] else 'some'} changes lost; the bootstrap {r['bootstrap_seconds']} s "
                f"against a {r['retain_seconds']:.0f} s retention", "-", bool(r["replica_equal_source"] and proven))
    return figure


def _events(workload: str) -> Callable[[dict[str, Any]], Figure | None]:
    def figure(results: dict[str, Any]) -> Figure | None:
        runs = results.get(workload) or []
        lm = _one(runs, lambda r: r["system"] == "lakemirror")
        recipe = _one(runs, lambda r: "recipe" in r["system"])
        if lm is None or recipe is None:
            return None
        ratio = lm["events_per_second"] / recipe["events_per_second"]
        return (f"{lm['events_per_second']:,.0f} messages/s, {lm['wrong_keys']} keys wrong ({ratio:.2f}x)",
                f"{recipe['system']} {recipe['events_per_second']:,.0f} messages/s, {recipe['wrong_keys']:,} keys wrong",
                ratio >= 1 and lm["wrong_keys"] == 0)
    return figure


def _postgres(results: dict[str, Any]) -> Figure | None:
    runs = results.get("postgres") or []
    lm, row = _one(runs, lambda r: r["system"].startswith("lakemirror")), _one(runs, lambda r: "per-row" in r["system"])
    if lm is None or row is None:
        return None
    return (f"{lm['rows_per_second']:,} change rows/s ({lm['speedup_vs_per_row']}x)",
            f"per-row upsert {row['rows_per_second']:,} rows/s", lm["speedup_vs_per_row"] >= 10)


def _latency(results: dict[str, Any]) -> Figure | None:
    runs = results.get("kafka_postgres_latency") or []
    rt, mb = _one(runs, lambda r: r["mode"] == "real-time"), _one(runs, lambda r: r["mode"] != "real-time")
    if rt is None:
        return None
    return (f"p99 {rt['p99_ms'] / 1000:.2f} s (p50 {rt['p50_ms'] / 1000:.2f} s)",
            f"{mb['mode']}: p99 {mb['p99_ms'] / 1000:.2f} s" if mb else "-", rt["p99_ms"] < 1000)


@dataclass(frozen=True)
class Goal:
    section: str
    workload: str
    text: str
    figure: Callable[[dict[str, Any]], Figure | None]


GOALS: tuple[Goal, ...] = (
    Goal("steady_4", "steady", "4 tables of 100k rows, 1% changed a second: p99 lag <= 3 s", _steady(4, 3.0)),
    Goal("steady_16", "steady", "16 tables: p99 lag <= 10 s", _steady(16, 10.0)),
    Goal("scale", "scale", "64 tables on one driver: p99 lag <= 30 s", _steady(64, 30.0, "scale")),
    Goal("steady_16", "steady", "16 tables, default settings: p99 <= 2x the delta-rs loop's", _steady_vs_loop(16, 2.0)),
    Goal("scale", "scale", "64 tables, default settings: p99 lag <= 10 s", _steady(64, 10.0, "scale")),
    Goal("startup", "startup", "a new pipeline with one small table: first batch applied <= 20 s from process start",
         _start("first start", 1, 20.0)),
    Goal("startup", "startup", "restart, 16 tables: every table's first batch applied <= 15 s", _start("restart", 16, 15.0)),
    Goal("startup", "startup", "restart, 64 tables: every table's first batch applied <= 30 s", _start("restart", 64, 30.0)),
    Goal("startup", "startup", "peak memory (Python + JVM) growing less than linearly in tables", _start_memory),
    Goal("catch_up", "catch_up", "a backlog drained ahead of delta-rs", _catch_up),
    Goal("steady_cost", "steady_cost", "1% change into a 10M-row replica, warm: <= 0.10x a full refresh's CPU",
         _steady_cost),
    Goal("bootstrap", "bootstrap", "a 5M-row replica within 1.2x of the copy floor", _bootstrap),
    Goal("bootstrap_chunked", "bootstrap_chunked", "a 20M-row chunked bootstrap within 1.2x of the copy floor",
         _chunked("default")),
    Goal("bootstrap_chunked", "bootstrap_chunked", "a SIGKILL mid-bootstrap redoes at most one chunk", _chunked("killed")),
    Goal("bootstrap_chunked", "bootstrap_chunked", "a source retention shorter than the bootstrap: no change lost",
         _chunked("retention")),
    Goal("production", "production", "S3, driver path, 4 tables: p99 <= 1.5x the delta-rs loop's", _production("driver", 4)),
    Goal("production", "production", "S3, driver path, 16 tables: p99 <= 1.5x the delta-rs loop's",
         _production("driver", 16)),
    Goal("production", "production", "S3, Spark-only path, 4 tables: p99 <= 0.5x the user recipe's",
         _production("spark", 4)),
    Goal("production", "production", "S3, Spark-only path, 16 tables: p99 <= 0.5x the user recipe's",
         _production("spark", 16)),
    Goal("production", "production", "Spark Connect, 4 tables: p99 <= 1.25x the classic Spark-only path's",
         _production("connect", 4)),
    Goal("debezium_events", "debezium_events", "Debezium events into Delta: at least the recipe's throughput, exact",
         _events("debezium_events")),
    Goal("debezium_events_s3", "debezium_events_s3", "the same into Delta on S3", _events("debezium_events_s3")),
    Goal("postgres", "postgres", "into PostgreSQL: >= 10x a per-row upsert writer", _postgres),
    Goal("kafka_postgres_latency", "kafka_postgres_latency", "Kafka to PostgreSQL in Real-Time Mode: p99 < 1 s",
         _latency),
)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.lower().strip())
    return "#" + text.replace(" ", "-")


def goals_table(results: dict[str, Any], headings: dict[str, str]) -> list[str]:
    lines = ["| goal | lakemirror | baseline | met | section |", "|---|---|---|---|---|"]
    for goal in GOALS:
        figure = goal.figure(results)
        if figure is None:
            continue
        mine, base, met = figure
        heading = headings.get(goal.section, goal.section)
        lines.append(f"| {goal.text} | {mine} | {base} | {'not judged' if met is None else 'met' if met else '**missed**'} | "
                     f"[{heading}]({anchor(heading)}) |")
    return lines if len(lines) > 2 else ["None of the workloads with a goal is in these results."]


# -- the report --------------------------------------------------------------------------------------

def _demote(lines: list[str]) -> list[str]:
    return ["#" + line if line.startswith("#") else line for line in lines]


def _with_kept(section: Section, kept: dict[str, str], used: set[str]) -> list[str]:
    used.add(section.id)
    block = kept.get(section.id)
    return [kept_open(section.id), block, KEPT_CLOSE] if block else []


def _body(section: Section, machine: dict[str, Any] | None, kept: dict[str, str], used: set[str]) -> list[str]:
    heading, *rest = section.lines
    while rest and not rest[0].strip():
        rest = rest[1:]
    extra = _with_kept(section, kept, used)
    return [heading, "", provenance(section.records, section.workload, machine), "", *rest,
            *([""] + extra if extra else [])]


def assemble(results: dict[str, Any], defaults: list[Section], opt_ins: dict[str, list[Section]],
             kept: dict[str, str], intro: list[str], notes: list[str]) -> str:
    """The whole report; ``intro`` goes under the title, ``notes`` at the end."""
    machine = results.get("machine")
    headings = {s.id: s.lines[0].lstrip("# ").strip() for s in defaults}
    used: set[str] = set()
    lines = ["# Benchmarks", "", *intro, "", "## Goals", "",
             "The default settings' figures against each goal, from the sections below.", "",
             *goals_table(results, headings)]
    summary = Section("goals", "", [], ["## Goals"])
    extra = _with_kept(summary, kept, used)
    lines += [""] + extra if extra else []
    for section in defaults:
        lines += ["", *_body(section, machine, kept, used)]
    for name, sections in opt_ins.items():
        if not sections:
            continue
        title, about = OPT_INS.get(name, (f"Opt-in: {name}", f"Measured with `{name}` on; off by default."))
        lines += ["", f"## {title}", "", about]
        extra = _with_kept(Section(name, name, [], []), kept, used)
        lines += [""] + extra if extra else []
        for section in sections:
            demoted = Section(f"{name}.{section.id}", section.workload, section.records, _demote(section.lines))
            lines += ["", *_body(demoted, machine, kept, used)]
    lines += ["", "## Notes", "", *notes]
    orphans = [k for k in kept if k not in used]
    if orphans:
        lines += ["", "## Kept notes of sections no longer measured"]
        for k in orphans:
            lines += ["", kept_open(k), kept[k], KEPT_CLOSE]
    return "\n".join(lines) + "\n"
