"""Types of event-fed replicas: inferred from JSON values; values that do not fit are refused."""

from __future__ import annotations

from decimal import Decimal

import pytest

from lakemirror.sinks.events.event_rows import convert, convert_row, infer_type


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


@pytest.mark.parametrize("value, sql_type, reason", [
    (Decimal("100000000000000000000000000000000.000000"), "decimal(38,6)", "more than 32 digits before the point"),
    (Decimal("1.005"), "decimal(5,2)", "more than 2 digits after the point"),  # Spark would round it silently
    ("123.4", "decimal(3,0)", "more than 0 digits after the point"),
    (Decimal("NaN"), "decimal(10,2)", "no decimal"), (3.5e38, "float", "out of range for a float"),
    ("1e999", "double", "out of range"), (Decimal("1.5"), "bigint", "not a whole number"),
])
def test_convert_refuses_what_the_column_would_round_or_overflow(value: object, sql_type: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        convert(value, sql_type)


def test_convert_keeps_decimals_exact() -> None:
    assert convert(Decimal("99999999999999999999999999999999.999999"), "decimal(38,6)") == \
        Decimal("99999999999999999999999999999999.999999")
    assert str(convert(Decimal("1.5"), "decimal(10,3)")) == "1.500"       # widened to the column's scale
    assert convert(Decimal("1E-20"), "string") == "0.00000000000000000001"  # the exact decimal text
    assert convert(Decimal("1.23E+29"), "string") == "123000000000000000000000000000"
    assert convert(3.4028235e38, "float") == 3.4028235e38 and convert("NaN", "double") != convert("NaN", "double")


def test_convert_row_names_every_column_that_does_not_fit() -> None:
    types = {"id": "int", "amount": "decimal(4,2)", "n": "smallint", "ok": "string"}
    assert convert_row({"id": 1, "ok": "x"}, types, ["id", "ok"]) == {"id": 1, "ok": "x"}
    with pytest.raises(ValueError) as refused:
        convert_row({"id": 1, "amount": Decimal("123.45"), "n": 40000, "ok": "x"}, types, list(types))
    assert "column 'amount' (decimal(4,2))" in str(refused.value) and "column 'n' (smallint)" in str(refused.value)
    assert "'id'" not in str(refused.value)
