"""Fixtures shared by the integration and e2e suites: ONE small local Spark with Delta per run."""

from __future__ import annotations

import gc
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest

# The run's shared services, defined once: a test module must not import these again (see tests/services.py).
from tests.integration.postgres_server import postgres  # noqa: F401
from tests.services import broker, connect_server, s3_bucket  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

#: Each test's time limit by tier (pytest-timeout): a hang fails that test, by name, not the run.
#: A test may set its own with ``@pytest.mark.timeout(seconds)``.
TIER_TIMEOUTS = {"unit": 60, "integration": 420, "e2e": 900}
SLOW_TIMEOUT = 2400


#: Session services a test run starts once per worker process, by the fixture that starts them. With
#: ``make test``'s two workers (pytest-xdist, ``--dist loadgroup``), the tests of one such service stay
#: on one worker, so a run starts one Kafka broker and one Spark Connect server, not one per worker.
SERVICE_GROUPS = {"broker": "kafka", "connect_server": "connect"}


#: Tiers whose tests share nothing costlier than a function's fixtures: their tests are handed to the
#: workers one by one, so the run ends with both workers busy, not with one module left on one.
UNGROUPED_TIERS = ("unit",)


#: Unit modules that share a cost each test process pays once, kept on one worker so that a run pays
#: it once: the syntax trees of every product file (tests/unit/source_nodes.py, 2.3 s to parse) and
#: the import of the workspace SDK the Databricks fakes stand on (2.4 s).
SHARED_COST_GROUPS = {
    **dict.fromkeys(("test_layering", "test_checkpoint_layout", "test_code_citations",
                     "test_sql_choke_point"), "source-trees"),
    **dict.fromkeys(("test_api_databricks", "test_databricks_jobs", "test_uc_objects", "test_uc_run",
                     "test_uc_tags", "test_uc_views_sdk", "test_delta_sharing", "test_backup"),
                    "workspace-sdk"),
}


def worker_group(item: pytest.Item) -> str | None:
    """The unit a worker takes whole: a test module (its module fixtures set up once), every test
    of a service in :data:`SERVICE_GROUPS` (the service started once), or the unit modules of one
    :data:`SHARED_COST_GROUPS` entry; None for another test of a tier in :data:`UNGROUPED_TIERS`,
    which any worker may take alone."""
    for fixture, group in SERVICE_GROUPS.items():
        if fixture in getattr(item, "fixturenames", ()):
            return group
    module = Path(str(item.fspath)).relative_to(ROOT)
    if module.parts[:2] in {("tests", tier) for tier in UNGROUPED_TIERS}:
        return SHARED_COST_GROUPS.get(module.stem)
    return module.as_posix()


# First among the hooks: pytest-xdist's worker reads each test's xdist_group marker in its own
# collection hook (it suffixes the test's id with the group), so the markers must be there before it runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = worker_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("timeout") is not None:
            continue
        tier = Path(str(item.fspath)).relative_to(ROOT / "tests").parts[0]
        seconds = SLOW_TIMEOUT if item.get_closest_marker("slow") else TIER_TIMEOUTS.get(tier, 420)
        item.add_marker(pytest.mark.timeout(seconds))


_TIER_SECONDS: dict[str, float] = defaultdict(float)
_TIER_TESTS: dict[str, int] = defaultdict(int)
#: Each test's time, set-up and tear-down included (fixtures a test is the first to use count in it).
_TEST_SECONDS: dict[str, float] = defaultdict(float)
#: Where every test's time is written at the end of a run, slowest first (the terminal shows 25).
DURATIONS_FILE = ROOT / "build" / "test-durations.tsv"
_STARTED = time.monotonic()


def _tier(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


#: ``TEST_CPU_SECONDS=1``: also measure each test's CPU seconds (pytest, the JVM and every other
#: process under it), which a loaded machine inflates far less than wall time.
_CPU = os.environ.get("TEST_CPU_SECONDS") == "1"
_CPU_SECONDS: dict[str, float] = {}


def _tree_cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and every live descendant."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    me = os.getpid()
    below = {me}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in below and pid not in below:
                below.add(pid)
                grew = True
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + sum(used[p] for p in below if p != me)


_CPU_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _CPU:
        item.stash[_CPU_AT_SETUP] = _tree_cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """With ``TEST_CPU_SECONDS=1`` the tear-down's report carries the test's CPU seconds, measured in
    the process that ran it (a worker's, under ``make test``), to the one that prints the summary."""
    outcome = yield
    if _CPU and call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        outcome.get_result().user_properties.append(
            ("cpu_seconds", _tree_cpu_seconds() - item.stash[_CPU_AT_SETUP]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds each phase's time (fixture set-up, the test, tear-down) to its tier's total."""
    _TIER_SECONDS[_tier(report.nodeid)] += report.duration
    _TEST_SECONDS[report.nodeid] += report.duration
    if report.when == "call":
        _TIER_TESTS[_tier(report.nodeid)] += 1
    for name, value in report.user_properties:
        if name == "cpu_seconds":
            _CPU_SECONDS[report.nodeid] = float(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The time of each tier, so a run shows where its minutes went (beside ``--durations``)."""
    if not _TIER_SECONDS:
        return
    terminalreporter.write_sep("=", "time by tier (set-up, test and tear-down of each test)")
    for tier in sorted(_TIER_SECONDS, key=_TIER_SECONDS.__getitem__, reverse=True):
        terminalreporter.write_line(f"{tier:<12} {_TIER_TESTS[tier]:>5} tests {_TIER_SECONDS[tier]:>8.1f} s")
    terminalreporter.write_line(f"{'wall':<12} {sum(_TIER_TESTS.values()):>5} tests "
                                f"{time.monotonic() - _STARTED:>8.1f} s")
    try:
        DURATIONS_FILE.parent.mkdir(exist_ok=True)
        DURATIONS_FILE.write_text("".join(f"{seconds:.2f}\t{nodeid}\n" for nodeid, seconds in
                                          sorted(_TEST_SECONDS.items(), key=lambda kv: -kv[1])))
        terminalreporter.write_line(f"every test's time (set-up and tear-down included): {DURATIONS_FILE}")
    except OSError as exc:
        terminalreporter.write_line(f"every test's time could not be written to {DURATIONS_FILE}: {exc}")
    if _CPU_SECONDS:
        terminalreporter.write_sep("=", f"CPU seconds by test (sum {sum(_CPU_SECONDS.values()):.0f} s; top 60)")
        for nodeid, cpu in sorted(_CPU_SECONDS.items(), key=lambda kv: -kv[1])[:60]:
            terminalreporter.write_line(f"{cpu:8.1f}  {nodeid}")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The last thing a test process does before its interpreter ends: hand what the run left alive
    (the syntax trees the house's tests parse, every tier's modules and fixtures' objects) to the
    collector's permanent generation. Otherwise the collections the interpreter runs while it shuts
    down walk all of it, 2 to 4 s in every process of a unit run, paid after the last test."""
    gc.freeze()


#: The test session's JVM compiles hot code four times later than its default. A test run is hundreds
#: of short, different queries, and with the default thresholds the JIT compilers spend much of the
#: session's CPU on code that runs for a few seconds and never again.
TEST_JVM_OPTIONS = "-XX:CompileThresholdScaling=4"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.jars import JarsMissing, jar_paths
    from lakemirror.daemon.spark import local_session

    try:  # hadoop-aws, for the object-storage tests (tests/integration/test_object_storage.py)
        s3a = bool(jar_paths(group="s3"))
    except JarsMissing:
        s3a = False
    session = local_session(RuntimeSettings(master="local[2]", shuffle_partitions=2, driver_memory="3g",
                                            spark_conf={"spark.driver.extraJavaOptions": TEST_JVM_OPTIONS}),
                            app_name="lakemirror-tests", s3a=s3a)
    yield session
    session.stop()
