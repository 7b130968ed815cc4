"""Fixtures shared by the integration and e2e suites: ONE small local Spark with Delta per run."""

from __future__ import annotations

from typing import Any, Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from lakemirror.daemon.config import RuntimeSettings
    from lakemirror.daemon.spark import local_session

    session = local_session(RuntimeSettings(master="local[2]", shuffle_partitions=2, driver_memory="3g"),
                            app_name="lakemirror-tests")
    yield session
    session.stop()
