"""Fixtures shared by the integration and e2e suites: ONE small local Spark with Delta per run."""

from __future__ import annotations

from typing import Any, Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from lakemirror.daemon.config import RuntimeSettings
    from lakemirror.daemon.jars import JarsMissing, jar_paths
    from lakemirror.daemon.spark import local_session

    try:  # hadoop-aws, for the object-storage tests (tests/integration/test_object_storage.py)
        s3a = bool(jar_paths(group="s3"))
    except JarsMissing:
        s3a = False
    session = local_session(RuntimeSettings(master="local[2]", shuffle_partitions=2, driver_memory="3g"),
                            app_name="lakemirror-tests", s3a=s3a)
    yield session
    session.stop()
