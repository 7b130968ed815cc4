"""The public chunk reads' planner (key ranges from the files' key statistics) and the one choice
between them and Delta's internal file reads. Pure: no Spark, no JVM (as over Spark Connect)."""

from __future__ import annotations

import datetime
import decimal
import random

import pytest

from lakemirror.sources.chunks import Chunk
from lakemirror.sources.key_ranges import FileKeys, KeyRange, bound_text, plan_key_ranges, range_type
from lakemirror.sources.snapshot_files import DELTA_LOG_FILES, KEY_RANGES, choose_chunk_reads


def test_internal_file_reads_are_taken_only_when_configured_and_the_session_has_its_own_jvm():
    assert choose_chunk_reads(internal_file_reads=False, own_jvm=True).kind == KEY_RANGES
    assert choose_chunk_reads(internal_file_reads=False, own_jvm=False).kind == KEY_RANGES
    over_connect = choose_chunk_reads(internal_file_reads=True, own_jvm=False)
    assert over_connect.kind == KEY_RANGES and "Spark Connect" in over_connect.reason
    fast = choose_chunk_reads(internal_file_reads=True, own_jvm=True)
    assert fast.kind == DELTA_LOG_FILES and "internal" in fast.reason


def files(*ranges: tuple[int, int], size: int = 10) -> list[FileKeys]:
    return [FileKeys(f"part-{i}", size, hi - lo + 1, lo, hi) for i, (lo, hi) in enumerate(ranges)]


def covering(ranges: list[KeyRange], key: int | None) -> list[int]:
    """Which ranges hold ``key``, by the same rule the SQL predicate states."""
    out = []
    for n, r in enumerate(ranges):
        low_ok = r.lower is None or (key is not None and key >= int(r.lower))
        up_ok = r.upper is None or key is None or key < int(r.upper)
        if r.lower is not None and key is None:
            low_ok = False
        if low_ok and up_ok:
            out.append(n)
    return out


def test_disjoint_files_become_ranges_that_follow_them_and_cover_every_key():
    planned = plan_key_ranges(files((0, 99), (100, 199), (200, 299), (300, 399)), 20, "id", "bigint")
    ranges = [r for r, _, _ in planned]
    assert [(r.lower, r.upper) for r in ranges] == [(None, "200"), ("200", None)]
    assert [(b, n) for _, b, n in planned] == [(20, 200), (20, 200)]
    for key in (None, -5, 0, 150, 199, 200, 399, 10**12):
        assert len(covering(ranges, key)) == 1, key  # every row in exactly one chunk, stats or not


def test_overlapping_files_stay_in_one_range_and_a_table_that_fits_is_whole():
    planned = plan_key_ranges(files((0, 50), (40, 90), (100, 120), (110, 130)), 10, "id", "int")
    assert [(r.lower, r.upper) for r, _, _ in planned] == [(None, "100"), ("100", None)]
    assert [b for _, b, _ in planned] == [20, 20]
    whole = plan_key_ranges(files((0, 9), (10, 19)), 1000, "id", "int")
    assert len(whole) == 1 and whole[0][0].predicate() is None
    tangled = plan_key_ranges(files((0, 100), (50, 150), (1, 2)), 1, "id", "int")
    assert len(tangled) == 1, "files that all overlap cannot be split by key"
    with pytest.raises(ValueError):
        plan_key_ranges([], 0, "id", "int")


def test_a_small_file_spanning_the_key_domain_does_not_tie_the_ranges_into_one_chunk():
    """A MERGE's output holds a few changed keys from anywhere: left out of the grouping, it is
    read by every chunk, and each row still falls in exactly one range."""
    clustered = files(*[(i * 100, i * 100 + 99) for i in range(8)], size=100)
    merge_output = FileKeys("merge", 2, 5, 3, 750)
    planned = plan_key_ranges(clustered + [merge_output], 200, "id", "bigint")
    ranges = [r for r, _, _ in planned]
    assert [(r.lower, r.upper) for r in ranges] == [(None, "200"), ("200", "400"), ("400", "600"), ("600", None)]
    assert sum(b for _, b, _ in planned) == 802 and sum(n for _, _, n in planned) == 800 + 5
    assert planned[0][1] == 202, "the stray counts in the range of its smallest key"
    for key in (None, 3, 199, 200, 750, 799, 10**9):
        assert len(covering(ranges, key)) == 1, key
    big_stray = FileKeys("rewrite", 60, 400, 0, 799)  # too large to be read by every chunk
    assert len(plan_key_ranges(clustered + [big_stray], 200, "id", "bigint")) == 1
    many = [FileKeys(f"m{i}", 10, 1, 0, 799) for i in range(4)]  # 40 bytes read 4 times: 160 > 10% of 840
    assert len(plan_key_ranges(clustered + many, 200, "id", "bigint")) == 1


def test_the_plan_does_not_depend_on_the_listing_order_and_null_only_files_go_first():
    listed = files(*[(i * 10, i * 10 + 9) for i in range(30)]) + [FileKeys("nulls", 7, 3, None, None)]
    shuffled = list(listed)
    random.Random(3).shuffle(shuffled)
    assert plan_key_ranges(listed, 35, "id", "bigint") == plan_key_ranges(shuffled, 35, "id", "bigint")
    planned = plan_key_ranges(listed, 35, "id", "bigint")
    assert planned[0][1] == 30 + 7 and planned[0][2] == 30 + 3
    assert sum(n for _, _, n in planned) == sum(f.rows for f in listed)


def test_range_predicates_are_sql_with_typed_literals_and_null_keys_in_the_first_range():
    first = KeyRange("id", "bigint", None, "200")
    middle = KeyRange("id", "bigint", "200", "400")
    last = KeyRange("we`ird", "string", "it's", None)
    assert first.predicate() == "(`id` IS NULL OR `id` < CAST('200' AS BIGINT))"
    assert middle.predicate() == "`id` >= CAST('200' AS BIGINT) AND `id` < CAST('400' AS BIGINT)"
    assert last.predicate() == "`we``ird` >= CAST('it\\'s' AS STRING)"
    assert KeyRange.from_json(middle.to_json()) == middle
    chunk = Chunk(1, (), 10, 5, middle)
    assert Chunk.from_json(chunk.to_json()) == chunk and not chunk.whole_table
    assert Chunk(0, (), 0, None, KeyRange("id", "int", None, None)).whole_table


def test_only_types_whose_bounds_round_trip_as_text_bound_a_range():
    assert all(range_type(t) for t in ("int", "bigint", "string", "date", "decimal(10,2)"))
    assert not any(range_type(t) for t in ("double", "float", "timestamp", "binary", "boolean"))
    assert bound_text(datetime.date(2024, 2, 29)) == "2024-02-29"
    assert bound_text(decimal.Decimal("12.50")) == "12.50" and bound_text(-3) == "-3"
    with pytest.raises(TypeError):
        bound_text(1.5)
    with pytest.raises(TypeError):
        bound_text(True)
