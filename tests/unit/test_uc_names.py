"""Rewriting names in view definitions and ordering views by dependency (pure)."""

from __future__ import annotations

import pytest

from lakemirror.sinks.batch.uc_names import NameMap, ViewCycle, dependency_levels, references, rewrite_names

NAMES = NameMap(catalogs={"prod": "dr"}, schemas={("prod", "sales"): ("dr", "sales_copy")})


@pytest.mark.parametrize("text, want", [
    ("SELECT * FROM prod.hr.people", "SELECT * FROM dr.hr.people"),
    ("SELECT * FROM `prod`.`sales`.`order lines`", "SELECT * FROM dr.sales_copy.`order lines`"),
    ("SELECT * FROM PROD.Sales.orders o JOIN sales.items i ON o.id = i.order_id",
     "SELECT * FROM dr.sales_copy.orders o JOIN sales_copy.items i ON o.id = i.order_id"),
    ("SELECT 'prod.sales.orders' AS s, prod.hr.t.col FROM other.x.y -- prod.sales.z\n/* prod.hr.q */",
     "SELECT 'prod.sales.orders' AS s, dr.hr.t.col FROM other.x.y -- prod.sales.z\n/* prod.hr.q */"),
    ("SELECT orders.id FROM orders", "SELECT orders.id FROM orders"),
    ("SELECT a.`b``c` FROM prod.hr.`we``ird`", "SELECT a.`b``c` FROM dr.hr.`we``ird`"),
])
def test_only_mapped_qualified_names_change(text: str, want: str) -> None:
    assert rewrite_names(text, NAMES, ("prod", "sales")) == want


def test_a_schema_renamed_into_another_catalog_keeps_three_parts() -> None:
    names = NameMap(catalogs={"prod": "dr"}, schemas={("prod", "sales"): ("archive", "sales")})
    assert rewrite_names("SELECT * FROM sales.t", names, ("prod", "hr")) == "SELECT * FROM archive.sales.t"


def test_references_and_levels() -> None:
    home = ("prod", "sales")
    refs = {("prod", "sales", "v1"): references("SELECT * FROM orders", home),
            ("prod", "sales", "v2"): references("SELECT * FROM v1 JOIN prod.sales.v3 USING (id)", home),
            ("prod", "sales", "v3"): references("SELECT * FROM sales.v1", home)}
    assert dependency_levels(refs) == [[("prod", "sales", "v1")], [("prod", "sales", "v3")], [("prod", "sales", "v2")]]
    with pytest.raises(ViewCycle, match="prod.sales.a, prod.sales.b"):
        dependency_levels({("prod", "sales", "a"): {("prod", "sales", "b")}, ("prod", "sales", "b"): {("prod", "sales", "a")}})
