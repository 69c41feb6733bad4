"""The sim's steps count only through the keeper's commit vote, and its
history carries the same per-sample ledger as the real target's.

* A run of steps is voted at once (``Keeper.commit(..., step, last)``) and
  gets the answer each step would have got in turn.
* Every sim ``commit`` record names the member whose vote passed, so the
  checker's members-only rule applies to the sim too; no vote passes after
  a roll call opened in its generation (the keeper refuses it).
* Small runs write one ``contribute`` record per member and step (the
  dataset ids of its shards, as the real worker writes them); large ones one
  compact record per run, which the checker expands. Both catch a tampered
  ledger.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcall.config import data_spec
from rollcall.core import JobPolicy, Join, Keeper, KeeperConfig, TimeoutDetector, check
from rollcall.scenario import load_scenario
from sim.driver import run

ROOT = Path(__file__).resolve().parent.parent
KPJ = ROOT / "scenarios" / "kill-pause-join.yaml"


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]


def _keeper(members: int = 3) -> Keeper:
    k = Keeper(KeeperConfig(min_workers=1, max_workers=8, last_call_s=0.5,
                            detector=TimeoutDetector(0.5, 3.0),
                            policy=JobPolicy(steps=10, checkpoint_interval_steps=5)))
    k.receive_many(0.0, [Join(w, 0, None) for w in range(members)])
    k.handle_timer(1.0)
    assert k.generation == 1
    return k


def test_a_run_of_steps_gets_the_answer_each_step_would() -> None:
    ranged, single = _keeper(), _keeper()
    v = ranged.commit(2.0, 0, 0, 1, 0, 4)
    assert v.ok and v.first and not v.complete
    for step in range(5):
        assert single.commit(2.0, 0, 0, 1, step).first
    again = ranged.commit(2.0, 1, 0, 1, 0, 4)  # another member's vote on the same steps
    assert again.ok and not again.first
    last = ranged.commit(2.0, 1, 0, 1, 5, 9)
    assert last.ok and last.complete and ranged.completed
    assert not ranged.commit(2.0, 0, 1, 1, 5, 9).ok  # a stale life: refused
    with pytest.raises(AssertionError):
        single.commit(2.0, 0, 0, 1, 6, 8)  # a vote that skips step 5 is a driver bug


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(1, 4), min_size=1, max_size=6),
       st.one_of(st.none(), st.integers(0, 5)), st.data())
def test_one_vote_per_run_decides_as_every_members_vote_on_every_step(
        members: int, runs: list[int], opens_before: int | None, data: st.DataObject) -> None:
    """The sim's form of the commit vote (one member's vote on a run of
    steps, ``sim/votes.py``) and real's (every member asks for every step,
    in any order) get the same answers: each step commits once, at the
    same vote, and none after a roll call opened; the job completes at the
    same step."""
    bulk, each = _keeper(members), _keeper(members)
    step = 0
    for index, length in enumerate(runs):
        if index == opens_before:  # a newcomer's Join opens a growth round
            for k in (bulk, each):
                k.receive(2.0 + index, Join(9, 0, None))
        last = min(step + length, 10) - 1
        if last < step:
            break
        t = 2.0 + index
        verdict = bulk.commit(t, 0, 0, 1, step, last)
        answers = []
        for s in range(step, last + 1):
            order = data.draw(st.permutations(range(members)))
            asked = [each.commit(t, w, 0, 1, s) for w in order]
            assert all(a.ok == asked[0].ok for a in asked), asked  # one answer for the step
            assert [a.first for a in asked] == [asked[0].ok] + [False] * (members - 1)
            answers.append(asked[0])
        assert {(a.ok, a.reason) for a in answers} == {(verdict.ok, verdict.reason)}
        assert verdict.complete == answers[-1].complete
        assert bulk.completed == each.completed
        if not verdict.ok:
            break
        step = last + 1


def test_a_round_refuses_new_steps(tmp_path: Path) -> None:
    k = _keeper()
    k.receive(2.0, Join(5, 0, None))  # a newcomer opens a growth round
    assert k.round is not None
    v = k.commit(2.1, 0, 0, 1, 0, 3)
    assert not v.ok and v.reason == "round-open"


def test_sim_commits_name_a_member_and_none_passes_after_a_roll_call(tmp_path: Path) -> None:
    # a long latency: votes still on their way when a round opens are refused
    sc = load_scenario(KPJ, ["network.latency_s=0.05"])
    s = run(sc, tmp_path)
    assert s["valid"] and s["completed"], s["violations"]
    recs = _records(tmp_path)
    gens = {r["gen"]: r for r in recs if r["f"] == "generation"}
    commits = [r for r in recs if r["f"] == "commit"]
    assert commits and all(isinstance(r["process"], int) for r in commits)
    for r in commits:
        assert r["process"] in {w for lo, hi in gens[r["gen"]]["members"] for w in range(lo, hi + 1)}
        opened = [x["t"] for x in recs if x["f"] == "round" and x["type"] == "invoke"
                  and x["gen"] == r["gen"] + 1]
        assert not opened or r["t"] <= min(opened) + 1e-9, (r, opened)
    # the members-only rule now reads sim commits: a non-member's is caught
    bad = [dict(r, process=99) if r is commits[0] else r for r in recs]
    report = check(bad, data_spec(sc))
    assert not report.valid and any("non-member" in v for v in report.violations)


def test_small_runs_write_the_per_sample_ledger(tmp_path: Path) -> None:
    sc = load_scenario(KPJ)
    run(sc, tmp_path)
    recs = _records(tmp_path)
    contrib = [r for r in recs if r["f"] == "contribute"]
    assert contrib and all(isinstance(r["process"], int) and "samples" in r for r in contrib)
    spec = data_spec(sc)
    assert check(recs, spec).valid
    # one sample trained twice, one member's share dropped: both are caught
    twice = [dict(r, samples=r["samples"] + r["samples"][:1]) if r is contrib[0] else r
             for r in recs]
    assert not check(twice, spec).valid
    dropped = [r for r in recs if r is not contrib[len(contrib) // 2]]
    report = check(dropped, spec)
    assert not report.valid and report.samples_skipped > 0


def test_large_runs_write_the_compact_ledger_and_it_is_checked(tmp_path: Path) -> None:
    sc = load_scenario(KPJ)
    run(sc, tmp_path, ledger=False)  # the form a run beyond 10^6 samples writes
    recs = _records(tmp_path)
    compact = [r for r in recs if r["f"] == "contribute"]
    assert compact and all("workers" in r and "samples" not in r for r in compact)
    spec = data_spec(sc)
    assert check(recs, spec).valid
    # a worker missing from the ledger of a run, or a run left out, is caught
    first = compact[0]
    lo, hi = first["workers"][0]
    fewer = [dict(r, workers=[[lo + 1, hi]] + r["workers"][1:]) if r is first else r for r in recs]
    assert not check(fewer, spec).valid
    assert not check([r for r in recs if r is not first], spec).valid
    shifted = [dict(r, sample=r["sample"] + 8) if r is first else r for r in recs]
    assert not check(shifted, spec).valid


def test_cli_ledger_flag_forces_the_per_sample_ledger(tmp_path: Path) -> None:
    from rollcall.app.cli import main

    rc = main(["run", str(ROOT / "scenarios" / "llama3-54d.yaml"), "--ledger", "--quiet",
               "--out", str(tmp_path / "big")])
    assert rc == 2  # a 2e9-sample dataset's order cannot be listed: a clear refusal
    assert not (tmp_path / "big").exists()
