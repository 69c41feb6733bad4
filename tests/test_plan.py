"""``rollcall validate --plan``: what a scenario will do, read from it alone."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from rollcall import cli
from rollcall.plan import format_plan, plan
from rollcall.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def test_the_plan_of_a_scripted_scenario() -> None:
    sc = load_scenario(SCENARIOS / "kill-pause-join.yaml")
    p = plan(sc)
    w = sc.cluster.workers
    assert p["ids"][0] == {"ids": [0, w - 1], "what": "initial workers"}
    joins = [f for f in p["timeline"] if f["action"] == "join"]
    assert [d["ids"] for d in p["ids"] if d["what"].startswith("newcomers")] == \
        [f["workers"] for f in joins]
    assert p["worker_id_limit"] == sc.worker_id_limit
    when = [(f["trigger"], f["when"]) for f in p["timeline"]]
    assert when == sorted(when) and len(when) == len(sc.failures.schedule)
    steps, k = sc.workload.steps, sc.strategy.checkpoint_interval_steps
    written = len([s for s in range(k, steps, k)])  # no checkpoint after the last step
    assert p["checkpoints"] == written
    assert math.isclose(p["failure_free_s"], steps * sc.ideal_step_s
                        + written * sc.strategy.checkpoint_write_s)
    assert p["expected_random_failures"] is None


def test_expected_random_failures_over_the_failure_free_time() -> None:
    sc = load_scenario(SCENARIOS / "llama3-54d.yaml")
    p = plan(sc)
    want = sc.cluster.workers * p["failure_free_s"] / sc.failures.worker_mtbf_s
    assert math.isclose(p["expected_random_failures"], want)
    text = format_plan(p)
    assert f"expected random failures: {want:.3g}" in text and "faults: none scripted" in text


def test_validate_plan_prints_the_resolved_scenario_and_the_plan(capsys) -> None:
    path = SCENARIOS / "kill-pause-join.yaml"
    assert cli.main(["validate", str(path), "--plan"]) == 0
    out = capsys.readouterr().out
    head, _, rest = out.partition("\nplan: ")
    resolved = yaml.safe_load(head.split("\n", 1)[1])
    assert resolved == load_scenario(path).to_dict()
    assert "ids:" in rest and "failure-free time:" in rest and "wall time:" in rest
    assert cli.main(["validate", str(path)]) == 0
    assert "plan:" not in capsys.readouterr().out
