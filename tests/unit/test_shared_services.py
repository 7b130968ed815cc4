"""The run's services (PostgreSQL, Kafka, Spark Connect, the S3 server) are session fixtures defined
once, in tests/services.py and tests/integration/postgres_server.py, and reach tests through
tests/conftest.py only. A test module or another conftest that imported one again would hold a second
definition, which pytest runs as another session-scoped fixture: a second server in the same worker (and,
for the S3 server, the shared Spark session's fs.s3a settings pointed at it mid-run, so that delta-rs
looks for tables on a server Spark's cached file system does not write to)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SERVICES = {"postgres", "broker", "connect_server", "s3_bucket"}


def test_the_shared_services_are_imported_by_the_root_conftest_only() -> None:
    importers = {}
    for path in TESTS.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path == TESTS / "conftest.py" or "from tests" not in text:  # the only imports that could name one
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
                named = SERVICES & {alias.name for alias in node.names}
                if named:
                    importers[str(path.relative_to(TESTS))] = sorted(named)
    assert importers == {}, "take the fixture as a parameter instead; tests/conftest.py provides it"


def test_the_root_conftest_provides_each_service() -> None:
    tree = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert SERVICES <= imported


def test_the_worker_groups_are_marked_before_xdist_reads_them() -> None:
    """pytest-xdist's worker turns each test's xdist_group marker into its id's suffix in its own
    collection hook; a hook that ran after it would add markers nobody reads, and every service would
    start once per worker."""
    from tests import conftest

    assert conftest.pytest_collection_modifyitems.pytest_impl["tryfirst"] is True  # type: ignore[attr-defined]


def test_unit_tests_go_to_any_worker_one_by_one_and_the_others_by_module_or_service() -> None:
    from types import SimpleNamespace

    from tests import conftest

    def item(path: str, *fixtures: str) -> object:
        return SimpleNamespace(fspath=TESTS.parent / path, fixturenames=list(fixtures))

    assert conftest.worker_group(item("tests/unit/test_settings.py", "tmp_path")) is None  # type: ignore[arg-type]
    assert conftest.worker_group(item("tests/unit/test_layering.py", "tmp_path")) == "source-trees"  # type: ignore[arg-type]
    assert conftest.worker_group(item("tests/unit/test_uc_tags.py")) == "workspace-sdk"  # type: ignore[arg-type]
    assert conftest.worker_group(item("tests/integration/test_replication.py", "spark")) == (  # type: ignore[arg-type]
        "tests/integration/test_replication.py")
    assert conftest.worker_group(item("tests/integration/test_kafka_source.py", "broker")) == "kafka"  # type: ignore[arg-type]
    assert conftest.worker_group(item("tests/e2e/test_torture.py")) == "tests/e2e/test_torture.py"  # type: ignore[arg-type]


#: What makes a unit module share a per-process cost (tests/conftest.py: SHARED_COST_GROUPS).
SHARED_COST_IMPORTS = {"tests.unit.source_nodes": "source-trees",
                       "tests.unit.databricks_fake": "workspace-sdk",
                       "tests.unit.databricks_workspace_fake": "workspace-sdk"}


def test_every_unit_module_sharing_a_per_process_cost_is_in_its_group() -> None:
    """A module that parses the product's files or stands on the workspace SDK, left out of its group,
    would make the other worker pay that cost again; a group naming a module that is gone groups nothing."""
    from tests import conftest

    wanted = {}
    for path in sorted((TESTS / "unit").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in SHARED_COST_IMPORTS:
                wanted[path.stem] = SHARED_COST_IMPORTS[node.module]
    assert len(wanted) >= 10
    assert conftest.SHARED_COST_GROUPS == wanted
