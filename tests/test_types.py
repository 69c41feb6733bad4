"""Member lists as id runs: the compact form the history and checkers use."""

from __future__ import annotations

from hypothesis import given, strategies as st

from rollcall.core.types import Cursor, RunSet, from_ranges, runs_of_sorted, to_ranges

ids_st = st.sets(st.integers(0, 300), max_size=120)


@given(ids_st)
def test_runs_round_trip(ids: set[int]) -> None:
    runs = to_ranges(ids)
    assert from_ranges(runs) == tuple(sorted(ids))
    assert all(a[1] + 1 < b[0] for a, b in zip(runs, runs[1:]))  # maximal runs


@given(ids_st)
def test_sorted_fast_path_agrees(ids: set[int]) -> None:
    assert runs_of_sorted(tuple(sorted(ids))) == to_ranges(ids)


@given(ids_st, st.integers(-5, 305))
def test_runset_membership(ids: set[int], probe: int) -> None:
    rs = RunSet(to_ranges(ids))
    assert (probe in rs) == (probe in ids)
    assert len(rs) == len(ids)


def test_cursor_json_and_order() -> None:
    assert Cursor.from_json(Cursor(3, 24).to_json()) == Cursor(3, 24)
    assert Cursor(3, 24) < Cursor(4, 0) and Cursor(3, 24) < Cursor(3, 25)
