"""The checkpoint file manager a table's query writes its offsets and commits with."""

from __future__ import annotations

from typing import Any

import pytest

from lakemirror.checkpoints.stream_dir import FILE_MANAGER_CONF, FILE_SYSTEM_MANAGERS, use_file_system_manager
from lakemirror.tables import is_local_path


@pytest.mark.parametrize("path, local", [
    ("/var/lib/lakemirror/ck", True), ("relative/ck", True), ("file:///var/ck", True),
    ("s3://bucket/ck", False), ("abfss://c@acct.dfs.core.windows.net/ck", False), ("dbfs:/Volumes/x/ck", False),
])
def test_only_a_checkpoint_on_the_drivers_file_system_is_local(path: str, local: bool) -> None:
    assert is_local_path(path) is local


class FakeSpark:
    """The conf and class lookup the choice uses; ``known`` are the classes the JVM has."""

    def __init__(self, known: set[str], preset: str | None = None) -> None:
        self.confs: dict[str, str] = {FILE_MANAGER_CONF: preset} if preset else {}
        known_classes = known

        class JavaClass:
            @staticmethod
            def forName(name: str) -> str:
                if name not in known_classes:
                    raise RuntimeError(f"java.lang.ClassNotFoundException: {name}")
                return name

        self._jvm: Any = type("Jvm", (), {"java": type("J", (), {"lang": type("L", (), {"Class": JavaClass})})})
        outer = self

        class Conf:
            def get(self, key: str, default: Any = None) -> Any:
                return outer.confs.get(key, default)

            def set(self, key: str, value: str) -> None:
                outer.confs[key] = value

        self.conf = Conf()


def test_a_local_checkpoint_gets_the_file_system_manager_this_spark_has() -> None:
    older = FakeSpark(known={FILE_SYSTEM_MANAGERS[1]})
    assert use_file_system_manager(older, "/tmp/ck") == FILE_SYSTEM_MANAGERS[1]  # type: ignore[arg-type]
    assert older.confs[FILE_MANAGER_CONF] == FILE_SYSTEM_MANAGERS[1]


@pytest.mark.parametrize("spark, path", [
    (FakeSpark(known=set(FILE_SYSTEM_MANAGERS)), "s3://bucket/ck"),                        # not local: Spark's choice
    (FakeSpark(known=set(FILE_SYSTEM_MANAGERS), preset="my.Manager"), "/tmp/ck"),          # the user's choice stays
    (FakeSpark(known=set()), "/tmp/ck"),                                                   # no such class: Spark's default
])
def test_the_manager_is_left_to_spark_or_the_user_otherwise(spark: FakeSpark, path: str) -> None:
    before = dict(spark.confs)
    assert use_file_system_manager(spark, path) is None  # type: ignore[arg-type]
    assert spark.confs == before


def test_without_a_jvm_nothing_is_chosen() -> None:
    class Connect:
        conf = None

    assert use_file_system_manager(Connect(), "/tmp/ck") is None  # type: ignore[arg-type]
