"""The local Debezium stack (lakemirror.tools) outside a source checkout: one clear error, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakemirror.tools import debezium_stack
from lakemirror.tools.debezium_stack import DebeziumStack, StackError


def test_a_missing_script_says_the_stack_needs_a_source_checkout(tmp_path: Path) -> None:
    with pytest.raises(StackError) as caught:
        DebeziumStack(tmp_path / "stack", scripts=tmp_path / "scripts").start()
    message = str(caught.value)
    assert message.startswith(f"scripts/kafka.sh fetch: {tmp_path / 'scripts' / 'kafka.sh'} is missing")
    assert "source checkout" in message and "lakemirror demo --source debezium" in message


def test_the_stack_runs_the_checkouts_own_scripts() -> None:
    assert (debezium_stack.SCRIPTS / "debezium.sh").is_file() and (debezium_stack.SCRIPTS / "kafka.sh").is_file()
