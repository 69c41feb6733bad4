"""Exact mode end to end: real processes, gloo on CPU.

The same workload and seed under five different membership histories must end
with bit-identical weights when ``strategy.reduction: exact``; under ``fast``
at least one history must differ (so the equality above can fail), and the
loss curve of exact mode must track fast mode's.

Runs share one module-scoped cache: each case runs once, and the test that
needs it waits for it; the real runs go one at a time (xdist group).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollcall.results import read_history
from rollcall.scenario import parse_scenario
from real_processes import REAL_PROCESSES

pytestmark = [*REAL_PROCESSES, pytest.mark.slow]  # minutes of real runs: the slow suite

STEPS = 400
# Loss tolerance (relative, per step) between exact and fast mode on the same
# history: both compute the same mathematical mean; they differ by float32
# rounding of the sum and by exact mode's int32 quantum (measured 3.3e-7
# over 400 steps).
LOSS_RTOL = 1e-5

BASE: dict[str, Any] = {
    "seed": 11,
    "target": "real",
    "workload": {"steps": STEPS, "global_batch": 32, "micro_batch": 4,
                 "dataset_samples": 512, "model_params": 20000, "lr": 0.05},
    "detector": {"heartbeat_s": 0.1, "timeout_s": 2.0},
    "rendezvous": {"min_workers": 1, "last_call_s": 0.2, "join_timeout_s": 5.0},
}

CASES: dict[str, dict[str, Any]] = {
    "four": {"cluster": {"workers": 4}},
    "kill-then-join": {
        "cluster": {"workers": 4},
        "failures": {"schedule": [{"at_step": 15, "kill": 1}, {"at_step": 60, "join": 1}]},
    },
    "three": {"cluster": {"workers": 3}},  # 8 shards over 3 workers: 3, 3, 2
    "pause-evicted-rejoins": {
        "cluster": {"workers": 2},
        "detector": {"heartbeat_s": 0.1, "timeout_s": 0.8},
        "failures": {"schedule": [{"at_step": 10, "pause": 1, "for_s": 1.6}]},
    },
    "checkpoint-restart": {
        "cluster": {"workers": 4},
        "strategy": {"kind": "checkpoint-restart", "checkpoint_interval_steps": 10},
        "rendezvous": {"min_workers": 1, "last_call_s": 0.2, "join_timeout_s": 120.0},
        "failures": {"schedule": [{"at_step": 15, "kill": 1}]},
    },
}


def scenario(case: str, reduction: str):
    raw = json.loads(json.dumps(BASE))
    for key, value in CASES[case].items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    raw["name"] = f"exact-{case}-{reduction}"
    raw.setdefault("strategy", {})
    raw["strategy"] = {"kind": "elastic", "batch": "constant", **raw["strategy"],
                       "reduction": reduction}
    return parse_scenario(yaml.safe_dump(raw), f"<{raw['name']}>")


class Runs:
    """Each (case, reduction) runs once per test session, in a shared folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, str], tuple[dict, list[dict]]] = {}

    def get(self, case: str, reduction: str) -> tuple[dict, list[dict]]:
        key = (case, reduction)
        if key not in self.done:
            from real import driver

            out = self.root / f"{case}-{reduction}"
            summary = driver.run(scenario(case, reduction), out)
            assert summary["completed"] is True, (case, reduction, summary["end_reason"])
            assert summary["valid"] is True, summary["violations"]
            assert summary["samples_duplicated"] == summary["samples_skipped"] == 0
            assert summary["steps_committed"] == STEPS
            assert summary["final_weights_agree"], (case, reduction)
            self.done[key] = (summary, list(read_history(out)))
        return self.done[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("exact"))


def generations(recs: list[dict]) -> list[list[int]]:
    return [[w for lo, hi in r["members"] for w in range(lo, hi + 1)]
            for r in recs if r["f"] == "generation" and r["type"] == "ok"]


def losses(recs: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in recs if r["f"] == "commit"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", [c for c in CASES if c != "four"])
def test_exact_mode_is_bit_identical_whatever_the_membership(runs: Runs, case: str) -> None:
    ref, _ = runs.get("four", "exact")
    got, recs = runs.get(case, "exact")
    gens = generations(recs)
    # The membership history really was what the case says.
    if case == "kill-then-join":
        assert [0, 2, 3] in gens and 4 in gens[-1], gens
    elif case == "three":
        assert gens == [[0, 1, 2]]
    elif case == "pause-evicted-rejoins":
        evicted = [r for r in recs if r["f"] == "evict" and r["worker"] == 1]
        assert evicted and evicted[0]["reason"] == "timeout"
        assert [0] in gens and gens[-1] == [0, 1], gens
    elif case == "checkpoint-restart":
        assert got["restarts"] >= 1
    assert got["final_weights_sha256"] == ref["final_weights_sha256"], case


@pytest.mark.timeout(600)
def test_fast_mode_differs_so_the_check_can_fail(runs: Runs) -> None:
    four, _ = runs.get("four", "fast")
    three, _ = runs.get("three", "fast")
    assert four["final_weights_sha256"] != three["final_weights_sha256"]


@pytest.mark.timeout(600)
def test_exact_loss_curve_tracks_fast(runs: Runs) -> None:
    _, exact = runs.get("four", "exact")
    _, fast = runs.get("four", "fast")
    le, lf = losses(exact), losses(fast)
    assert sorted(le) == sorted(lf) == list(range(STEPS))
    worst = max(abs(le[k] - lf[k]) / lf[k] for k in le)
    assert worst <= LOSS_RTOL, worst
    assert le[STEPS - 1] < 0.5 * le[0]  # and it learned something


@pytest.mark.timeout(300)
def test_a_diverging_exact_run_ends_with_the_reason(tmp_path: Path) -> None:
    """A non-finite gradient has no fixed-point form; retrying the step would
    fail forever, so the run ends, failed, naming the step."""
    from real import driver

    sc = scenario("three", "exact").model_copy(update={"name": "exact-diverges"})
    raw = sc.to_dict()
    raw["workload"]["lr"] = 500.0
    raw["workload"]["steps"] = 100
    s = driver.run(parse_scenario(yaml.safe_dump(raw), "<diverges>"), tmp_path)
    assert s["completed"] is False
    assert "non-finite gradient" in s["end_reason"], s["end_reason"]
    assert s["valid"] is True, s["violations"]
    assert 0 < s["steps_committed"] < 100
