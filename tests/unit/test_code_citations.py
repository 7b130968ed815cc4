"""Comments and docstrings of the product say why, and cite what a reader can open.

A figure copied from a benchmark run into the code goes stale with the next run, and a note outside
the repository cannot be opened by the reader of a release. So the product's comments, docstrings
and help texts state the fact or the reason itself and point to a benchmark by name (``make bench
ONLY=apply_cost``), never:

- a design note kept outside the repository (CDC_SEMANTICS, RUNTIME_FACTS, HOUSE.md), nor "the
  seed" the project started from: name the fact, or the public document it comes from;
- a measured timing (``1.3 s p99``, ``p99 5.32 s``, ``0.46 JVM CPU-s``, ``1.3 s against 4.0 s``);
- a section of docs/BENCHMARKS.md that the report does not have.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.source_nodes import prose
from tests.unit.test_packaging import PRODUCT_FOLDERS

ROOT = Path(__file__).resolve().parents[2]

_UNIT = r"(?:ms|s|seconds|CPU-s)"
_FIGURE = rf"\d+(?:\.\d+)? ?{_UNIT}\b"
_STAT = r"(?:p50|p90|p95|p99|median)"
#: What no comment, docstring or string of the product may hold, with the reason shown on a hit.
FORBIDDEN: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"CDC_SEMANTICS|RUNTIME_FACTS|HOUSE\.md|/shared/design"), "a note outside the repository"),
    (re.compile(r"\bthe seed\b(?! (?:of|for)\b)|\bseed's\b|\bseed recipe\b", re.I), '"the seed": name the fact or the public source'),
    (re.compile(rf"{_FIGURE} {_STAT}\b|\b{_STAT}:? (?:of |at |lag )?{_FIGURE}"), "a measured latency"),
    (re.compile(rf"{_FIGURE} (?:against|instead of|vs\.?|->) (?:about )?{_FIGURE}"), "a measured before/after timing"),
    (re.compile(r"\d+(?:\.\d+)? (?:JVM )?CPU-s\b"), "a measured CPU time"),
    (re.compile(r"throwaway|What was tried|Diagnosis as it stands"), "a lab-notebook citation"),
)


def product_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for top in PRODUCT_FOLDERS for p in (root / top).rglob("*.py"))


def findings(text: str, where: str = "<text>") -> list[str]:
    """Every forbidden citation in ``text``, as ``where:line: reason: the line``.

    A string literal is joined with the next one on its line's neighbour when Python would join
    them (implicit concatenation across lines), so a figure split over two lines is still seen."""
    lines = prose(text)
    found = []
    for i, (line, chunk) in enumerate(lines):
        joined = chunk + (" " + lines[i + 1][1] if i + 1 < len(lines) and lines[i + 1][0] == line + 1 else "")
        for pattern, reason in FORBIDDEN:
            hit = pattern.search(joined)
            if hit and hit.start() < len(chunk):
                found.append(f"{where}:{line}: {reason}: {chunk.strip()}")
    return found


def test_no_product_file_cites_figures_notes_or_the_seed() -> None:
    found = [f for path in product_files() for f in findings(path.read_text(encoding="utf-8"),
                                                           str(path.relative_to(ROOT)))]
    assert not found, "state the fact or the reason, point to `make bench ONLY=…`:\n" + "\n".join(found)


def test_every_cited_benchmark_section_exists() -> None:
    """``docs/BENCHMARKS.md, "<section>"`` in the product names a heading the report has."""
    headings = {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", (ROOT / "docs" / "BENCHMARKS.md").read_text(),
                                                         re.M)}
    cited = re.compile(r"""docs/BENCHMARKS\.md, ["'](.+?)["']""")
    missing = []
    for path in product_files():
        text = " ".join(chunk.strip().strip("\"'#: ") for _, chunk in prose(path.read_text(encoding="utf-8")))
        missing += [f"{path.relative_to(ROOT)}: {m.group(1)}" for m in cited.finditer(text)
                    if m.group(1) not in headings]
    assert not missing, "sections of docs/BENCHMARKS.md that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("line", [
    "# one apply took 1.3 s against 4.0 s for the rewrite",
    "# p99 5.32 s with 65536, 0.78 s / 2.21 s with 512",
    '"""lag 1.95 s p99 at 4 tables"""',
    "# about 0.45 JVM CPU-s a batch of a 1M-row source",
    "# (docs/BENCHMARKS.md, \"What was tried and what it gained\")",
    "# a throwaway A/B on the 2-core machine",
    "# the rules (CDC_SEMANTICS.md §3)",
    "# as Debezium emits it (RUNTIME_FACTS.md, Kafka)",
    "# Field names follow the seed's YAML.",
    "# simple: the seed recipe's events",
    '"""A 100k-row table took 1.3 s against 4.0 s for the rewrite (a throwaway A/B; make bench: 0.22 s\n'
    'against 1.35 s an apply)."""',
    'x = ("the buffer held records: p50 2.86 s "\n     "/ p99 5.32 s")',
])
def test_a_cited_figure_note_or_seed_is_found(line: str) -> None:
    assert findings(line), line


@pytest.mark.parametrize("line", [
    "# waits at most timeout 30 s, then gives up",
    "# 5 s by default (spark.sql.streaming.realTimeMode.minBatchDuration)",
    '"""Pauses between re-reads of the table id (7.5 s in all)."""',
    "# the median of the last lag samples is reported",
    "rng = random.Random(seed)  # the seed of the writer's random changes",
    "# (make bench ONLY=apply_cost times both paths)",
    "# the percentile (p99) of the lag over the window",
])
def test_a_reason_a_default_or_a_benchmark_name_passes(line: str) -> None:
    assert findings(line) == [], line
