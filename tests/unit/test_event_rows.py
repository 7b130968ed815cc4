"""Types of event-fed replicas: inferred from JSON values; values that do not fit are refused."""

from __future__ import annotations

from decimal import Decimal

import pytest

from lakemirror.sinks.events.event_rows import convert, infer_type


@pytest.mark.parametrize("values, want", [
    ([1, None, 2], "bigint"), ([1, 2.5], "double"), ([True], "boolean"), (["a", 1], "string"),
    ([None, None], "string"), ([{"a": 1}], "string"), ([], "string"),
])
def test_infer_type(values: list[object], want: str) -> None:
    assert infer_type(values) == want


def test_convert_accepts_what_fits() -> None:
    assert convert("12", "bigint") == 12 and convert(3.0, "int") == 3 and convert(2, "double") == 2.0
    assert convert({"b": 1, "a": 2}, "string") == '{"a": 2, "b": 1}' and convert("1.10", "decimal(5,2)") == Decimal("1.10")
    assert convert("true", "boolean") is True and convert(None, "bigint") is None


@pytest.mark.parametrize("value, sql_type", [
    ("abc", "bigint"), (True, "bigint"), (1.5, "bigint"), (2**31, "int"), ("x", "double"), (1, "boolean"),
    ("nope", "decimal(5,2)"), ("2024-13-01", "date"), ([1], "binary"),
])
def test_convert_refuses_what_does_not_fit(value: object, sql_type: str) -> None:
    with pytest.raises(ValueError):
        convert(value, sql_type)
