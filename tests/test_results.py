"""Run-directory files: layout, atomic summary, crash-safe history."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rollcall import results
from rollcall.results import (
    SUMMARY_KEYS,
    HistoryWriter,
    default_out_dir,
    prepare_out_dir,
    read_history,
    read_summary,
    write_summary,
)
from rollcall.scenario import parse_scenario

SCENARIO = parse_scenario("name: demo\nseed: 7\n")


def test_default_out_dir() -> None:
    assert default_out_dir(SCENARIO, "20250102T030405Z") == Path("runs/demo/20250102T030405Z-seed7")
    assert default_out_dir(SCENARIO, "20250102T030405Z", root="/x") == Path("/x/demo/20250102T030405Z-seed7")
    with pytest.raises(ValueError):
        default_out_dir(SCENARIO, "2025-01-02 03:04")


def test_prepare_out_dir_writes_resolved_scenario(tmp_path: Path) -> None:
    out = prepare_out_dir(tmp_path / "a" / "b", SCENARIO)
    assert out.is_dir()
    assert parse_scenario((out / "scenario.yaml").read_text()) == SCENARIO
    prepare_out_dir(out, SCENARIO)  # idempotent
    assert sorted(p.name for p in out.iterdir()) == ["scenario.yaml"]


def test_summary_keys() -> None:
    assert len(SUMMARY_KEYS) == len(set(SUMMARY_KEYS)) == 27
    assert SUMMARY_KEYS[0] == "scenario" and SUMMARY_KEYS[-2:] == ("result", "end_reason")


def test_summary_round_trip_sorted_indented(tmp_path: Path) -> None:
    summary = {k: i for i, k in enumerate(SUMMARY_KEYS)}
    write_summary(tmp_path, summary)
    text = (tmp_path / "summary.json").read_text()
    assert text == json.dumps(summary, sort_keys=True, indent=2) + "\n"
    assert read_summary(tmp_path) == summary
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left


def test_summary_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_summary(tmp_path, {"v": 1})
    calls = []
    real_replace = os.replace

    def crash(src: str, dst: str) -> None:
        calls.append((src, dst))
        # the new content is complete in the temp file before the rename
        assert json.loads(Path(src).read_text()) == {"v": 2}
        raise OSError("disk gone")

    monkeypatch.setattr(results.os, "replace", crash)
    with pytest.raises(OSError):
        write_summary(tmp_path, {"v": 2})
    assert calls and Path(calls[0][1]) == tmp_path / "summary.json"
    assert read_summary(tmp_path) == {"v": 1}  # old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # temp file removed
    monkeypatch.setattr(results.os, "replace", real_replace)
    write_summary(tmp_path, {"v": 3})
    assert read_summary(tmp_path) == {"v": 3}


def test_history_writer_flushes_every_write(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(tmp_path) as h:
        h.write({"type": "invoke", "b": 2, "a": [1, 2]})
        # read back from disk before close: the record is already there
        assert path.read_text() == '{"a":[1,2],"b":2,"type":"invoke"}\n'
        h.write_many([{"n": 1}, {"n": 2}])
        assert path.read_text().splitlines()[1:] == ['{"n":1}', '{"n":2}']
        assert h.count == 3
    assert h.closed
    assert list(read_history(tmp_path)) == [{"a": [1, 2], "b": 2, "type": "invoke"}, {"n": 1}, {"n": 2}]


def test_history_writer_appends(tmp_path: Path) -> None:
    with HistoryWriter(tmp_path) as h:
        h.write({"n": 1})
    with HistoryWriter(tmp_path) as h:
        h.write({"n": 2})
    assert [r["n"] for r in read_history(tmp_path)] == [1, 2]


def test_history_survives_a_crash_without_close(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from rollcall.results import HistoryWriter\n"
        "h = HistoryWriter(sys.argv[1])\n"
        "h.write({'n': 1})\n"
        "h.write({'n': 2})\n"
        "os._exit(9)\n"  # no close, no atexit, no buffer flush
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60)
    assert proc.returncode == 9
    assert [r["n"] for r in read_history(tmp_path)] == [1, 2]


def test_read_jsonl_so_far_skips_a_torn_last_line_and_a_missing_file(tmp_path) -> None:
    from rollcall.results import read_jsonl_so_far

    path = tmp_path / "live.jsonl"
    assert read_jsonl_so_far(path) == []
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert read_jsonl_so_far(path) == [{"a": 1}, {"b": 2}]


def test_goodput_counts_committed_steps_and_never_exceeds_one() -> None:
    from rollcall.results import goodput

    assert goodput(100, 0.5, 100.0) == 0.5
    assert goodput(50, 0.5, 100.0) == 0.25  # a run cut short did half the work
    assert goodput(300, 0.5, 100.0) == 1.0  # faster than the ideal: all of it, not more
    assert goodput(0, 0.5, 100.0) == 0.0
    assert goodput(100, None, 100.0) == 0.0 and goodput(100, 0.5, 0.0) == 0.0


# --- history lines: orjson's bytes must be the standard library's ----------------

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _VALUES, max_size=8))
@example({"\x7f": []})  # DEL: ASCII, yet the standard library escapes it
@example({"": 1e-6, "e-1": "1e-7"})  # orjson 3.13 writes 1e-6
@example({"": 1e-05, "b": -2.5e-05, "c": 10.00001})  # orjson 3.13 writes 0.00001
def test_history_line_is_the_standard_librarys_bytes(record):
    """Every record (non-ASCII text, ints beyond 64 bits, floats of every size,
    nulls, nesting) is written exactly as json.dumps(sort_keys=True) writes it."""
    want = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    assert results.history_line(record) == want


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_history_line_refuses_what_json_cannot_carry(bad):
    with pytest.raises(ValueError):
        results.history_line({"t": 0.0, "x": [1, bad]})
