"""Elastic recovery: longer steps while shrunk under a constant batch, exact accounting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rollcall.config import data_spec
from rollcall.core.checkers import check
from rollcall.core.history import members_of
from rollcall.scenario import load_scenario
from sim.driver import run

ROOT = Path(__file__).resolve().parent.parent
KPJ = ROOT / "scenarios" / "kill-pause-join.yaml"


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]


def _step_s(sc, commit: dict) -> float:
    """The step time of a commit record: from its first step's start to the
    last step's end (the keeper commits it one network latency later)."""
    return (commit["t"] - sc.network.latency_s - commit["t0"]) / (commit["last"] - commit["step"] + 1)


def test_constant_batch_steps_longer_while_shrunk(tmp_path: Path) -> None:
    sc = load_scenario(KPJ)
    s = run(sc, tmp_path)
    recs = _records(tmp_path)
    size = {r["gen"]: len(members_of(r)) for r in recs if r["f"] == "generation"}
    per_gen: dict[int, set[float]] = {}
    for r in recs:
        if r["f"] == "commit":
            assert r["batch"] == 64
            per_gen.setdefault(r["gen"], set()).add(round(_step_s(sc, r), 6))
    w = sc.workload
    for gen, times in per_gen.items():
        # each member computes ceil(shards / members) micro-batches, then one allreduce
        want = math.ceil(sc.shards_per_step / size[gen]) * w.micro_batch_s + w.allreduce_s
        assert times == {round(want, 6)}, (gen, times, want)
    assert per_gen[3] == {0.405} and per_gen[1] == {0.205}  # 2 members: twice the shards
    # exact sample accounting along the lineage: [0, 200 x 64) once, in order
    report = check(recs, data_spec(sc))
    assert report.valid, report.violations
    pos = 0
    for c in report.lineage:
        assert c["sample"] == pos
        pos = c["stop"]
    assert pos == 200 * 64 == s["samples_consumed"]
    assert s["global_batch_min"] == s["global_batch_max"] == 64
    assert s["samples_duplicated"] == s["samples_skipped"] == 0
    # every simulated second is accounted for, and shrinking cost real time
    total = s["productive_s"] + s["lost_work_s"] + s["stall_s"] + s["recovery_s"] + s["checkpoint_s"]
    assert total == pytest.approx(s["elapsed_s"], abs=1e-6)
    assert s["productive_s"] > 200 * sc.ideal_step_s


def test_shrink_policy_takes_smaller_batches(tmp_path: Path) -> None:
    sc = load_scenario(KPJ, ["strategy.batch=shrink"])
    s = run(sc, tmp_path)
    assert s["valid"] and s["completed"], s["violations"]
    recs = _records(tmp_path)
    size = {r["gen"]: len(members_of(r)) for r in recs if r["f"] == "generation"}
    batches = {r["gen"]: r["batch"] for r in recs if r["f"] == "commit"}
    assert batches[1] == 64 and batches[2] == 48 and batches[3] == 32
    assert s["global_batch_min"] == 32 and s["global_batch_max"] == 64
    total = sum((r["last"] - r["step"] + 1) * r["batch"] for r in check(recs, data_spec(sc)).lineage)
    assert total == s["samples_consumed"]
    # the per-member load stays two micro-batches, so the step time does not grow
    for r in recs:
        if r["f"] == "commit":
            assert _step_s(sc, r) == pytest.approx(0.205), size[r["gen"]]


def test_newcomer_pays_the_state_copy(tmp_path: Path) -> None:
    sc = load_scenario(KPJ, ["workload.model_params=125000000"])  # 1.5 GB at 1.25 GB/s: 1.2 s
    run(sc, tmp_path)
    recs = _records(tmp_path)
    enter5 = next(r for r in recs if r["f"] == "generation" and r["gen"] == 5)
    first5 = min(r["t0"] for r in recs if r["f"] == "commit" and r["gen"] == 5)
    copy_s = 125e6 * 12 / 1.25e9 + sc.network.latency_s
    assert first5 - enter5["t"] == pytest.approx(sc.network.latency_s + copy_s, abs=1e-6)


@pytest.mark.parametrize("kind", ["elastic", "checkpoint-restart"])
def test_short_pause_stalls_then_resumes_in_place(tmp_path: Path, kind: str) -> None:
    """A pause shorter than the detector timeout: everyone waits, nobody is evicted."""
    sc = load_scenario(KPJ, ["failures.schedule=[{at_s: 8.0, pause: 2, for_s: 1.0}]"], strategy=kind)
    s = run(sc, tmp_path)
    assert s["valid"] and s["completed"], s["violations"]
    assert s["generations"] == 1 and s["evictions"] == 0 and s["restarts"] == 0
    assert s["stall_s"] == pytest.approx(1.0)
    assert s["lost_work_s"] == pytest.approx(0.0, abs=1e-9)  # the step in flight finishes
    # each step's compute, and each commit record's vote in flight (where it
    # does not overlap the next record's steps)
    commits = [r for r in _records(tmp_path) if r["f"] == "commit"]
    computed_s = 200 * sc.ideal_step_s
    assert computed_s - 1e-9 <= s["productive_s"] <= computed_s + len(commits) * sc.network.latency_s
    recs = _records(tmp_path)
    assert not [r for r in recs if r["f"] in ("refuse", "fenced", "abort")]


def test_long_pause_under_checkpoint_restart_relaunches_the_paused_worker(tmp_path: Path) -> None:
    # min_workers = max_workers: a fixed-size job, as torchrun runs it (with the
    # default min_workers=2 the core closes the restart round as soon as two
    # relaunched workers are in, then grows)
    sc = load_scenario(KPJ, ["failures.schedule=[{at_s: 8.0, pause: 2, for_s: 10.0}]",
                             "rendezvous.min_workers=4"], strategy="checkpoint-restart")
    s = run(sc, tmp_path)
    assert s["valid"] and s["completed"], s["violations"]
    recs = _records(tmp_path)
    gens = [(r["reason"], members_of(r)) for r in recs if r["f"] == "generation"]
    # the stopped process is killed by the teardown and relaunched like the others
    assert gens == [("start", (0, 1, 2, 3)), ("restart", (0, 1, 2, 3))]
    assert s["restarts"] == 1 and s["lost_steps"] == 39  # no checkpoint yet at step 39
    t_restart = next(r["t"] for r in recs if r["f"] == "restart")
    g2 = next(r for r in recs if r["f"] == "generation" and r["gen"] == 2)
    assert g2["t"] == pytest.approx(t_restart + sc.strategy.restart_s + sc.network.latency_s)


def test_exact_reduction_costs_its_extra_exchange_and_nothing_else(tmp_path: Path) -> None:
    """``reduction: exact`` sends int32 (float32's bytes); with sharded
    state every step first takes a scalar MAX (the momentum's owners agree
    on the scale): steps take ``exchange_s`` longer, the trace and the
    accounting are otherwise the same, and goodput drops by exactly the
    extra time. With replicated state the exchange costs what fast's does."""
    sharded = ["state.sharding=sharded", "state.replicas=2"]
    fast = load_scenario(KPJ, sharded)
    exact = load_scenario(KPJ, sharded + ["strategy.reduction=exact"])
    replicated = load_scenario(KPJ, ["strategy.reduction=exact"])
    sf = run(fast, tmp_path / "fast")
    se = run(exact, tmp_path / "exact")
    for n in (1, 2, 4, 1000):
        hops = 2 * math.ceil(math.log2(n)) if n > 1 else 0
        assert exact.exchange_s(n) == pytest.approx(
            exact.workload.allreduce_s + hops * exact.network.latency_s)
        assert fast.exchange_s(n) == fast.workload.allreduce_s
        assert replicated.exchange_s(n) == replicated.workload.allreduce_s
    assert sf["valid"] and se["valid"]
    assert se["steps_committed"] == sf["steps_committed"]
    assert se["samples_consumed"] == sf["samples_consumed"]
    assert se["elapsed_s"] > sf["elapsed_s"]
    assert se["goodput"] < sf["goodput"]
    gens = {r["gen"]: len(members_of(r)) for r in _records(tmp_path / "exact")
            if r["f"] == "generation"}
    for r in _records(tmp_path / "exact"):
        if r["f"] == "commit":
            n = r["last"] - r["step"] + 1
            want = (math.ceil(exact.shards_per_step / gens[r["gen"]]) * exact.workload.micro_batch_s
                    + exact.exchange_s(gens[r["gen"]]))
            assert _step_s(exact, r) == pytest.approx(want, abs=1e-6)


def test_measured_step_times_and_warmup_replace_the_step_model(tmp_path: Path) -> None:
    """``workload.step_s_by_workers`` (what ``rollcall calibrate`` measures)
    sets the step time of a generation of that size, whatever the
    micro-batch model says; other sizes keep the model; ``warmup_s`` delays
    only the first generation's first step."""
    sc = load_scenario(KPJ, ["workload.step_s_by_workers={4: 0.25, 3: 0.125}",
                             "workload.warmup_s=2.0"])
    base = load_scenario(KPJ)
    s = run(sc, tmp_path / "measured")
    assert s["valid"] and s["completed"]
    assert sc.ideal_step_s == 0.25
    recs = _records(tmp_path / "measured")
    size = {r["gen"]: len(members_of(r)) for r in recs if r["f"] == "generation"}
    seen = set()
    for r in recs:
        if r["f"] == "commit":
            n = size[r["gen"]]
            want = {4: 0.25, 3: 0.125}.get(n)
            if want is None:
                shards = math.ceil(sc.shards_per_step / n)
                want = shards * sc.workload.micro_batch_s + sc.exchange_s(n)
            per_step = _step_s(base, r)
            assert per_step == pytest.approx(want, abs=1e-6), (n, r)
            seen.add(n)
    assert {3, 4} <= seen and seen - {3, 4}  # both measured sizes and a modelled one ran
    first = next(r for r in recs if r["f"] == "commit")
    g1 = next(r for r in recs if r["f"] == "generation")
    assert first["t0"] == pytest.approx(g1["t"] + base.network.latency_s + 2.0)
