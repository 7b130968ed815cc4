"""docs/BENCHMARKS.md is a report generated from docs/bench/results.json (bench/report.py): one section
per workload with its command, date, commit and machine, the defaults' figures first and the opt-ins
after, hand-written text only in kept blocks, and no lab notebook."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from bench.__main__ import WORKLOADS, fresh_results, render, run_provenance, sections
from bench.report import KEPT_CLOSE, kept_blocks, kept_open

ROOT = Path(__file__).resolve().parents[2]
REPORT = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
RESULTS: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "results.json").read_text(encoding="utf-8"))


def records(results: dict[str, Any]) -> list[dict[str, Any]]:
    found = [r for w in WORKLOADS for r in results.get(w) or [] if isinstance(r, dict)]
    for opt in (results.get("opt_in") or {}).values():
        found += records(opt)
    return found


def without_kept(text: str) -> str:
    return re.sub(r"<!-- kept: \S+ -->\n.*?<!-- /kept -->", "", text, flags=re.S)


def test_the_report_is_what_the_generator_makes_of_the_results_and_its_kept_blocks() -> None:
    """Figures are never edited by hand: regenerate with `python -m bench` (or render())."""
    assert render(RESULTS, kept_blocks(REPORT)) == REPORT


def test_the_defaults_come_first_and_the_opt_in_after_them() -> None:
    headings = re.findall(r"^## (.+)$", REPORT, re.M)
    opt_in = headings.index("Opt-in: the Kernel-based change feed")
    defaults = [s.lines[0][3:] for s in sections(RESULTS)]
    assert headings[0] == "Goals" and headings[1:opt_in] == defaults
    assert headings[opt_in + 1:] == ["Notes"]
    assert "testing only" in REPORT.split("## Opt-in", 1)[1].split("\n\n", 2)[1]
    default_part = REPORT.split("## Opt-in", 1)[0]
    assert "kernel_change_feed: true" not in default_part


def test_every_section_says_its_command_date_commit_and_machine() -> None:
    lines = REPORT.splitlines()
    provenance = [lines[i + 2] for i, line in enumerate(lines)
                  if re.match(r"^#{2,3} ", line) and i + 2 < len(lines) and lines[i + 2].startswith("*Measured")]
    expected = len(sections(RESULTS)) + sum(len(sections({**opt, "parameters": RESULTS["parameters"]}))
                                            for opt in RESULTS["opt_in"].values())
    assert len(provenance) == expected
    for line in provenance:
        assert re.match(r"^\*Measured \d{4}-\d\d-\d\d \d\d:\d\d UTC at `[0-9a-f]{7}` by `make bench ONLY=[a-z0-9_,]+"
                        r'( ARGS="[^"`]+")?` '
                        r"on 2 cores, [\d.]+ GiB, Python [\d.]+, PySpark [\d.]+, deltalake [\d.]+, Linux \S+; "
                        r"load average [\d.]+ at start\.\*$", line), line


def test_the_generated_text_names_no_commit_but_those_its_figures_were_measured_at() -> None:
    measured = {r["commit"] for r in records(RESULTS)}
    named = set(re.findall(r"`([0-9a-f]{7,40})`", without_kept(REPORT)))
    assert named == measured


def test_no_lab_notebook() -> None:
    assert not re.search(r"^\| 20\d\d-\d\d-\d\d \|", REPORT, re.M), "a dated diary row"
    for gone in ("What was tried", "Diagnosis", "Next steps", "throwaway", "seed"):
        assert gone not in REPORT, gone
    assert len(REPORT) < 72_000  # about 4 KB a workload: a report of figures, not their history


def test_the_goals_follow_the_records() -> None:
    results = copy.deepcopy(RESULTS)
    lm = next(r for r in results["steady"] if r["tables"] == 4 and r["system"] == "lakemirror")
    lm["lag"]["p99"] = 3.5
    row = next(line for line in render(results).splitlines() if line.startswith("| 4 tables of 100k rows"))
    assert "p99 3.50 s" in row and "**missed**" in row
    row = next(line for line in REPORT.splitlines() if line.startswith("| 4 tables of 100k rows"))
    assert f"p99 {next(r for r in RESULTS['steady'] if r['tables'] == 4)['lag']['p99']:.2f} s" in row and "| met |" in row


def test_the_start_goals_judge_every_table_ready_and_memory_growth() -> None:
    from bench.report import _start, _start_memory

    def start(tables: int, kind: str, ready: float, mib: float, exact: bool = True) -> dict[str, Any]:
        return {"tables": tables, "start": kind, "every_table_ready_s": ready, "spark_at": 6.0,
                "replicas_equal_sources": exact, "peak_resident_mib": {"python": mib / 4, "jvm": mib * 3 / 4}}

    results = {"startup": [start(1, "first start", 19.0, 800), start(16, "restart", 15.5, 900),
                           start(64, "first start", 40.0, 1700), start(64, "restart", 29.0, 1600, exact=False)]}
    assert _start("first start", 1, 20.0)(results)[2] is True
    assert _start("restart", 16, 15.0)(results)[2] is False       # 15.5 s against 15 s
    assert _start("restart", 64, 30.0)(results)[2] is False       # in time, but a replica differs
    assert _start("restart", 4, 15.0)(results) is None            # not measured: not judged
    figure = _start_memory(results)
    assert figure is not None and "2.12x for 64x the tables" in figure[0] and figure[2] is True
    results["startup"][2]["peak_resident_mib"] = {"python": 100_000, "jvm": 0}
    assert _start_memory(results)[2] is False


def test_results_without_a_goals_workload_say_so() -> None:
    text = render({k: v for k, v in RESULTS.items() if k in ("machine", "parameters", "key_lookup")})
    assert "None of the workloads with a goal is in these results." in text and "| goal |" not in text


def test_kept_blocks_return_to_their_section_and_an_orphan_is_not_lost() -> None:
    results = {k: v for k, v in RESULTS.items() if k != "postgres"}
    text = render(results, {"catch_up": "Why the drain is fast.", "postgres": "A note on PostgreSQL."})
    catch_up = text.split("## Catch-up", 1)[1].split("\n## ", 1)[0]
    assert f"{kept_open('catch_up')}\nWhy the drain is fast.\n{KEPT_CLOSE}" in catch_up
    assert "## Throughput into PostgreSQL" not in text
    orphans = text.split("## Kept notes of sections no longer measured", 1)[1]
    assert f"{kept_open('postgres')}\nA note on PostgreSQL.\n{KEPT_CLOSE}" in orphans
    assert kept_blocks(text) == {"catch_up": "Why the drain is fast.", "postgres": "A note on PostgreSQL."}


def test_a_run_keeps_the_sections_and_opt_ins_it_does_not_measure() -> None:
    fresh = fresh_results(RESULTS, "make bench ONLY=steady  # python -m bench --only steady", False, {}, {})
    assert fresh["opt_in"] == RESULTS["opt_in"] and fresh["catch_up"] == RESULTS["catch_up"]
    assert fresh_results({}, "make bench", False, {}, {})["opt_in"] == {}


def test_the_make_command_carries_the_arguments_that_chose_the_run() -> None:
    from bench.__main__ import make_args

    assert make_args(["--only", "soak", "--soak-row", "driver"]) == ' ARGS="--soak-row driver"'
    assert make_args(["--quick", "--only=steady"]) == ""
    assert make_args(["--only", "production", "--rows", "driver,loop", "--tables", "4"]) == \
        ' ARGS="--rows driver,loop --tables 4"'


def test_each_record_of_a_run_carries_its_make_command_commit_and_machine() -> None:
    run = run_provenance("make bench ONLY=steady  # python -m bench --only steady",
                         {"cores": 2, "kernel": "6.1", "load_average_at_start": [1.0, 1.0, 1.0]})
    assert run["command"] == "make bench ONLY=steady"
    assert run["machine"] == {"cores": 2, "kernel": "6.1"}
    assert run["commit"] is None or re.fullmatch(r"[0-9a-f]{7,}(\+changes)?", run["commit"])
