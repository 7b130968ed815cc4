"""lakemirror.sources.keys: primary-key inference, rule by rule, with the reason reported."""

from __future__ import annotations

import pytest

from lakemirror.errors import NoUsableKey
from lakemirror.schema import Column
from lakemirror.sources.keys import PRIMARY_KEY_PROPERTY, KeyChoice, choose_key, parse_declared

COLS = (Column("Region", "string"), Column("ID", "bigint"), Column("sku", "string", nullable=False),
        Column("line", "int", nullable=False))


def test_config_wins_over_everything() -> None:
    choice = choose_key("c.s.t", COLS, configured=["line", "REGION"], declared=["sku"])
    assert choice == KeyChoice(("line", "Region"), "config")
    assert choice.describe() == "(line, Region) by config"


def test_declared_constraint_comes_next() -> None:
    choice = choose_key("c.s.t", COLS, declared=["SKU", "line"])
    assert choice == KeyChoice(("sku", "line"), "declared constraint")


def test_then_a_column_named_id_case_insensitively() -> None:
    choice = choose_key("c.s.t", COLS)
    assert choice == KeyChoice(("ID",), "column named id")
    assert choice.describe() == "(ID) by column named id"


def test_then_the_first_not_null_column() -> None:
    cols = (Column("a", "int"), Column("b", "int", nullable=False), Column("c", "int", nullable=False))
    assert choose_key("c.s.t", cols) == KeyChoice(("b",), "first NOT NULL column")


def test_a_column_merely_containing_id_is_not_the_id_rule() -> None:
    cols = (Column("order_id", "int"), Column("n", "int", nullable=False))
    assert choose_key("c.s.t", cols) == KeyChoice(("n",), "first NOT NULL column")


def test_no_usable_key_explains_how_to_fix() -> None:
    with pytest.raises(NoUsableKey) as info:
        choose_key("main.sales.events", (Column("a", "int"), Column("b", "string")))
    err = info.value
    assert err.table == "main.sales.events"
    assert err.code == "no_key"
    msg = str(err)
    assert msg.startswith("main.sales.events: no usable primary key")
    assert "Set `keys:` for this table in the config" in msg
    assert "PRIMARY KEY" in msg
    assert f"'{PRIMARY_KEY_PROPERTY}' = 'col1,col2'" in msg


@pytest.mark.parametrize("kw, origin", [({"configured": ["nope"]}, "configured"),
                                        ({"declared": ["sku", "gone"]}, "declared")])
def test_unknown_key_columns_are_named(kw: dict[str, list[str]], origin: str) -> None:
    with pytest.raises(NoUsableKey) as info:
        choose_key("c.s.t", COLS, **kw)  # type: ignore[arg-type]
    msg = str(info.value)
    assert f"the {origin} key column(s)" in msg
    assert "(Region, ID, sku, line)" in msg
    assert "fix the key or the table" in msg


def test_configured_key_that_is_wrong_is_not_silently_replaced_by_inference() -> None:
    with pytest.raises(NoUsableKey):
        choose_key("c.s.t", COLS, configured=["nope"], declared=["sku"])


@pytest.mark.parametrize("value, parsed", [
    (None, ()), ("", ()), ("id", ("id",)), (" a , b ,, c ", ("a", "b", "c")),
])
def test_parse_declared(value: str | None, parsed: tuple[str, ...]) -> None:
    assert parse_declared(value) == parsed
