"""Member lists written as deltas: a history's size follows its events.

A ``generation`` record's ``members`` (and a compact ``contribute``'s
``workers``) of more than ``DELTA_MIN_RUNS`` runs is written as its change
against the previous record of the kind; every reader
(``rollcall.results.read_history``, ``check``) sees the whole list again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rollcall.core import IdRuns, expand_deltas, members_delta
from rollcall.core.history import DELTA_MIN_RUNS
from rollcall.results import HISTORY_FILE, read_history
from rollcall.scenario import load_scenario
from sim.driver import Simulation

ROOT = Path(__file__).resolve().parent.parent

# member sets over 0..999 with many holes: lists of up to hundreds of runs
_SETS = st.lists(st.sets(st.integers(0, 999), min_size=1, max_size=600), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(_SETS)
def test_deltas_expand_back_to_the_lists(sets: list[set[int]]) -> None:
    records, before = [], None
    for g, ids in enumerate(sets):
        members = IdRuns.of(ids)
        fields = members_delta("members", members, before)
        assert ("members" in fields) != ("members_add" in fields)
        if before is None or members.run_count() <= DELTA_MIN_RUNS:
            assert "members" in fields  # short lists and the first stay whole
        records.append({"f": "generation", "gen": g, **fields})
        before = members
    lines = [json.loads(json.dumps(r)) for r in records]  # through the file format
    whole = list(expand_deltas(lines))
    assert [r["members"] for r in whole] == [IdRuns.of(ids).runs() for ids in sets]
    assert all(set(r) == {"f", "gen", "members"} for r in whole)
    sets_of = [r["members"] for r in expand_deltas(lines, lists=False)]
    assert [IdRuns(m) if isinstance(m, list) else m for m in sets_of] == \
        [IdRuns.of(ids) for ids in sets]


def test_run_count_is_the_derived_runs_count() -> None:
    for ids in ([], [5], [0, 1, 2, 7, 9, 10], list(range(0, 200, 2))):
        s = IdRuns.from_mask(IdRuns.of(ids).mask) if ids else IdRuns.of(ids)
        assert s.run_count() == len(IdRuns.of(ids).runs())


def test_a_large_sim_run_writes_deltas_and_reads_whole(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "scenarios" / "gpu100k-30d.yaml", ["workload.steps=20000"])
    out = tmp_path / "run"
    out.mkdir()
    summary = Simulation(sc, out).run()
    assert summary["completed"] and summary["valid"], summary["violations"]
    raw = [json.loads(line) for line in (out / HISTORY_FILE).read_text().splitlines()]
    deltas = [r for r in raw if "members_add" in r or "workers_add" in r]
    assert deltas, "no delta written: the member lists stayed short"
    whole = list(read_history(out))
    assert len(whole) == len(raw)
    for r in whole:
        assert not any(k.endswith(("_add", "_drop")) for k in r), r
        if r["f"] == "generation":
            assert len(r["members"]) >= 1
    longest = max(len(r["members"]) for r in whole if r["f"] == "generation")
    assert longest > DELTA_MIN_RUNS  # the lists the deltas stand for are long


def test_the_checker_reads_the_deltas(tmp_path: Path) -> None:
    """A delta that leaves a committing member out of its generation is a
    violation: the checker does not skip what it cannot see whole."""
    sc = load_scenario(ROOT / "scenarios" / "gpu100k-30d.yaml", ["workload.steps=20000"])
    out = tmp_path / "run"
    out.mkdir()
    Simulation(sc, out).run()
    raw = [json.loads(line) for line in (out / HISTORY_FILE).read_text().splitlines()]
    committers = {(r["gen"], r["process"]) for r in raw if r["f"] == "commit"}
    for r in raw:
        if r["f"] == "generation" and "members_add" in r:
            voter = next((p for g, p in committers if g == r["gen"]), None)
            if voter is not None:
                r["members_drop"] = IdRuns.of(
                    set(IdRuns(r["members_drop"])) | {voter}).runs()
                break
    else:
        raise AssertionError("no delta generation with a commit to tamper with")
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    (bad / HISTORY_FILE).write_text("".join(json.dumps(r) + "\n" for r in raw))
    from rollcall.config import data_spec
    from rollcall.core import check

    report = check(read_history(bad), data_spec(sc))
    assert not report.valid
    assert any("non-member" in v for v in report.violations), report.violations
