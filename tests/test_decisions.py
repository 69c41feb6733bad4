"""rollcall.app.decisions: a run's decisions from its history alone, and their diff.

A sim run (deterministic, a second) gives the history; the expected
sequence follows from the scenario: a checkpoint-restart with worker 1
killed at step 15 (evicted on its host's exit notice) relaunches workers 0
and 2 as their second lives and resumes from the step-10 checkpoint. Hand-written records check the parts
a run cannot force (simultaneous evictions, a differing field).
"""

from __future__ import annotations

from pathlib import Path

from rollcall.app.decisions import NOT_COMPARED, decisions, drop, first_difference, kills, mask
from rollcall.results import read_history
from rollcall.scenario import load_scenario
from sim import driver

ROOT = Path(__file__).resolve().parent.parent


def test_a_checkpoint_restart_run_reads_as_its_decisions(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "scenarios" / "real-checkpoint-restart.yaml", [])
    driver.run(sc, tmp_path)
    history = list(read_history(tmp_path))
    assert kills(history) == [1]
    assert decisions(history) == [
        {"kind": "generation", "gen": 1, "members": [[0, 2]], "cursor": [0, 0], "source": None,
         "stale": 0, "reason": "start"},
        {"kind": "evict", "worker": 1, "incarnation": 0, "reason": "exited"},
        {"kind": "restart", "gen": 1, "reason": "failure"},
        {"kind": "relaunch", "gen": 1, "workers": [[0, 0], [2, 2]],
         "incarnations": [[1, [[0, 0], [2, 2]]]]},
        {"kind": "generation", "gen": 2, "members": [[0, 0], [2, 2]], "cursor": [10, 240],
         "source": None, "stale": 2, "reason": "restart"},
        {"kind": "end", "completed": True, "cursor": [30, 720]},
    ]


def rec(f: str, process: str = "keeper", **fields: object) -> dict:
    return {"t": 0.0, "type": "info", "f": f, "process": process, **fields}


def test_evictions_of_one_moment_are_a_set_and_runs_are_merged() -> None:
    gen = rec("generation", type="ok", gen=2, members=[[0, 0], [1, 1], [3, 3]], cursor=[5, 40],
              source=0, stale=0, reason="failure")
    a = [rec("evict", worker=2, incarnation=0, reason="exited"),
         rec("evict", worker=1, incarnation=0, reason="exited"), gen,
         rec("evict", worker=0, incarnation=0, reason="timeout")]
    b = [a[1], a[0], gen, a[3]]
    assert decisions(a) == decisions(b)
    assert [d["kind"] for d in decisions(a)] == ["evict", "evict", "generation", "evict"]
    assert decisions(a)[2]["members"] == [[0, 1], [3, 3]]
    # worker records, refusals and round openings are no decisions
    noise = [rec("round", type="invoke", gen=3, reason="failure"),
             rec("commit", process=0, gen=2, step=5), rec("refuse", worker=2)]
    assert decisions(a + noise) == decisions(a)


def test_a_relaunch_reads_as_its_lives_by_life() -> None:
    gen = rec("generation", type="ok", gen=3, members=[[0, 6], [9, 9]], cursor=[5, 40],
              source=0, stale=0, reason="failure")
    r = rec("relaunch", gen=3, not_relaunched=[[6, 6]], incarnation=2,
            others=[[1, 1], [4, 3], [5, 1]])
    d = decisions([gen, r])[1]
    assert d["workers"] == [[0, 5], [9, 9]]
    assert d["incarnations"] == [[1, [[1, 1], [5, 5]]], [2, [[0, 0], [2, 3], [9, 9]]],
                                 [3, [[4, 4]]]]
    # the same lives spelled with another common life read the same
    same = dict(r, incarnation=1, others=[[0, 2], [2, 2], [3, 2], [4, 3], [9, 2]])
    assert decisions([gen, same])[1] == d
    assert decisions([gen, dict(r, others=None)])[1]["incarnations"] is None  # not listed
    wide = dict(gen, members=[[0, 6], [9, 12]])
    holes = dict(r, not_relaunched=[[2, 3], [6, 6], [9, 10]], others=[])
    assert decisions([wide, holes])[1]["workers"] == [[0, 1], [4, 5], [11, 12]]


def test_first_difference_names_the_decision_and_field() -> None:
    ds = [{"kind": "generation", "gen": 1, "members": [[0, 2]], "cursor": [0, 0],
           "source": None, "stale": 0, "reason": "start"},
          {"kind": "evict", "worker": 1, "incarnation": 0, "reason": "timeout"}]
    other = [ds[0], dict(ds[1], reason="exited")]
    assert first_difference(ds, ds) is None
    diff = first_difference(ds, other)
    assert diff is not None and diff.startswith(
        "decision 1 (evict): reason: sim 'timeout' != real 'exited'")
    assert first_difference(mask(ds, "evict", ["reason"]), mask(other, "evict", ["reason"])) is None
    assert mask(ds, "evict", ["reason"])[1]["reason"] == NOT_COMPARED
    short = first_difference(ds, ds[:1])
    assert short is not None and short.startswith("decision 1: sim has 2 decisions, real 1")
    assert drop(ds, "evict", when=lambda d: d["worker"] == 1) == ds[:1]
    assert first_difference(ds, [ds[1], ds[0]]).startswith("decision 0 (generation): kind:")
