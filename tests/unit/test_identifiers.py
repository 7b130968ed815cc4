"""lakemirror.identifiers: quoting, dotted-name parsing, TableName and its checkpoint slug."""

from __future__ import annotations

import random

import pytest

from lakemirror.identifiers import TableName, quote, split_name, sql_string


# -- quote ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, quoted", [
    ("orders", "`orders`"),
    ("my table", "`my table`"),
    ("a.b", "`a.b`"),
    ("we`ird", "`we``ird`"),
    ("`", "````"),
    ("``x``", "`````x`````"),
])
def test_quote_wraps_in_backticks_and_doubles_backticks(name: str, quoted: str) -> None:
    assert quote(name) == quoted


@pytest.mark.parametrize("bad", ["", "a\x00b"])
def test_quote_refuses_empty_and_nul(bad: str) -> None:
    with pytest.raises(ValueError):
        quote(bad)


def test_sql_string_escapes_quotes_and_backslashes() -> None:
    assert sql_string("it's") == "'it\\'s'"
    assert sql_string("C:\\dir") == "'C:\\\\dir'"
    with pytest.raises(ValueError):
        sql_string("a\x00")


# -- split_name ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, parts", [
    ("a.b.c", ["a", "b", "c"]),
    (" a . b .c", ["a", "b", "c"]),
    ("a.`b.c`.d", ["a", "b.c", "d"]),
    ("`x``y`.z", ["x`y", "z"]),
    ("`a```.b", ["a`", "b"]),
    ("```a`.b", ["`a", "b"]),
    ("`my table`.`.`", ["my table", "."]),
    ("single", ["single"]),
])
def test_split_name_handles_quoted_parts(text: str, parts: list[str]) -> None:
    assert split_name(text) == parts


@pytest.mark.parametrize("text", ["", "a.", ".a", "a..b", "`a`b.c", "``", "a.``.c", "`a", "a. .b"])
def test_split_name_rejects_malformed_names(text: str) -> None:
    with pytest.raises(ValueError):
        split_name(text)


def test_split_name_inverts_quote_for_random_names() -> None:
    rng = random.Random(7)
    alphabet = "ab.`_ -é"
    for _ in range(300):
        parts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
        assert split_name(".".join(quote(p) for p in parts)) == parts


# -- TableName -----------------------------------------------------------------------------------

def test_parse_three_part_name() -> None:
    assert TableName.parse("main.sales.orders") == TableName("main", "sales", "orders")
    assert TableName.parse("main.`sales.eu`.`order``s`") == TableName("main", "sales.eu", "order`s")


@pytest.mark.parametrize("text, fragment", [
    ("sales.orders", "is not a three-part name"),
    ("a.b.c.d", "is not a three-part name"),
    ("a..c", "cannot parse"),
    ("a.b/x.c", "contains '/'"),
    ("a.` `.c", "schema part of a table name cannot be empty"),
])
def test_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        TableName.parse(text)
    assert fragment in str(info.value)


def test_constructor_validates_each_part() -> None:
    with pytest.raises(ValueError, match="catalog part"):
        TableName("", "s", "t")
    with pytest.raises(ValueError, match="table name 'a/b'"):
        TableName("c", "s", "a/b")
    with pytest.raises(ValueError, match="NUL"):
        TableName("c", "s\x00", "t")


def test_sql_quotes_every_part() -> None:
    assert TableName("main", "sales", "orders").sql == "`main`.`sales`.`orders`"
    assert TableName("main", "my schema", "t`x").sql == "`main`.`my schema`.`t``x`"


def test_str_quotes_only_parts_that_need_it() -> None:
    assert str(TableName("main", "sales", "orders")) == "main.sales.orders"
    assert str(TableName("main", "my schema", "t`x")) == "main.`my schema`.`t``x`"
    assert str(TableName("main", "s", "1st")) == "main.s.`1st`"


@pytest.mark.parametrize("name", [
    TableName("main", "sales", "orders"),
    TableName("main", "my schema", "t`x"),
    TableName("c", "a.b", "é"),
])
def test_str_parses_back(name: TableName) -> None:
    assert TableName.parse(str(name)) == name
    assert TableName.parse(name.sql) == name


# -- slug ----------------------------------------------------------------------------------------

def test_slug_of_plain_name() -> None:
    assert TableName("main", "sales", "orders").slug == "main__sales__orders"


def test_slug_encodes_unsafe_characters() -> None:
    slug = TableName("main", "my schema", "a%b").slug
    assert slug == "main__my%20schema__a%25b"
    assert TableName("c", "s", "t.x").slug == "c__s__t%2Ex"


def test_slug_distinguishes_names_differing_only_in_encoded_characters() -> None:
    names = [TableName("c", "s", t) for t in ("a b", "a_b", "a-b", "a.b", "a%20b", "a%b", "a`b", "a:b", "aé")]
    slugs = [n.slug for n in names]
    assert len(set(slugs)) == len(slugs), slugs
    assert all(set(s) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-%") for s in slugs)


def test_slug_is_injective_for_non_ascii_table_names() -> None:
    assert TableName("c", "s", "\u04e2D").slug != TableName("c", "s", "\u4e2d").slug


def test_slug_separator_cannot_occur_inside_a_part() -> None:
    assert TableName("a__b", "c", "t").slug != TableName("a", "b__c", "t").slug
